"""The wires: each protocol, both sides, as sans-io modules.

The client side of a wire maps the library's request (``GenerationRequest``) to the protocol's
body and the protocol's answer (frames, events, a whole body) to the library's types
(``StreamChunk``, ``Completion``), and nothing else: no connection, no retry, no stop (the
contract does those). Each module ends in its dialect as a value (``wire.py``: a ``Wire``,
registered when its module is imported: the import line below is the registry). Every decoder
turns any malformed input into ``ProviderProtocolError`` (fuzzed: ``tests/test_wires.py``). A
lane is a server's quirks plus the families of wires it serves (``http_lane.py``,
``providers/``): a new wire is a module here and one registry entry; no lane is touched.

The server side (``*_server``) is what the gateway speaks: a request body checked and turned
into the library's call (``BadRequest`` for what it refuses), the library's answer encoded as
the protocol's body or events, an error in the protocol's shape. The gateway's routes
(``gateway/``) only run these over a connection.

==============  ===================================================  ==========================
module          protocol                                             lanes
==============  ===================================================  ==========================
``chat``        OpenAI chat completions (``/v1/chat/completions``)   every HTTP lane
``responses``   OpenAI Responses (``/v1/responses``)                 ``wire="responses"``,
                                                                     resumable streams
``ollama``      Ollama's native ``/api/chat``, ``/api/generate``     ``ollama``
``messages``    Anthropic Messages (``/v1/messages``)                ``wire="messages"``,
                                                                     ``anthropic``
``lmstudio``    LM Studio's native ``/api/v1/chat``                  ``lmstudio``
``timings``     llama-server's ``timings`` object                    the three above that carry it
==============  ===================================================  ==========================

====================  ======================================================
server side           route of the gateway
====================  ======================================================
``chat_server``       ``/v1/chat/completions``, ``/v1/completions``, errors
``responses_server``  ``/v1/responses`` (events of one response, background)
``messages_server``   ``/v1/messages``, ``/v1/messages/count_tokens``
====================  ======================================================
"""

# the built-in dialects: importing a module registers its wire (in this order)
from . import chat, responses, messages, ollama, lmstudio  # noqa: F401, I001

__all__: list[str] = []
