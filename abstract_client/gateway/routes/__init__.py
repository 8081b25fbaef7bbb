"""The front doors, one module per route family: OpenAI's chat, completions and embeddings
(``chat.py``), Anthropic's Messages (``messages.py``), the Responses API and its background
responses (``responses.py``), and the service's own routes — models, health, metrics, cancel, a
stop's record, the chat page, model load and unload (``service.py``, ``openapi.py``). Each parses
a request into a ``runner.Job``; none runs one."""

__all__: list[str] = []
