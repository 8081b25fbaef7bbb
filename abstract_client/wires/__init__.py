"""The wires: each protocol a lane can speak, as its own sans-io module.

A wire maps the library's request (``GenerationRequest``) to the protocol's body and the
protocol's answer (frames, events, a whole body) to the library's types (``StreamChunk``,
``Completion``), and nothing else: no connection, no retry, no stop (the contract does those).
Every decoder turns any malformed input into ``ProviderProtocolError`` (fuzzed:
``tests/test_wires.py``). A lane is a server's quirks plus the wires it serves
(``providers/``): a new wire is a module here, and a lane that serves it declares it.

==============  ===================================================  ==========================
module          protocol                                             lanes
==============  ===================================================  ==========================
``chat``        OpenAI chat completions (``/v1/chat/completions``)   every HTTP lane
``responses``   OpenAI Responses (``/v1/responses``)                 ``wire="responses"``,
                                                                     resumable streams
``ollama``      Ollama's native ``/api/chat``, ``/api/generate``     ``ollama``
``lmstudio``    LM Studio's native ``/api/v1/chat``                  ``lmstudio``
``timings``     llama-server's ``timings`` object                    the three above that carry it
==============  ===================================================  ==========================
"""

__all__: list[str] = []
