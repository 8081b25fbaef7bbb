"""Fake LLM servers on real loopback sockets, for testing a Stop button without a GPU.

Each fake speaks its server's wire format, serves on ``127.0.0.1`` on a free port, and records,
per request, when it saw the client disconnect and when it sent each token. See
``docs/testing.md``.
"""

from ._server import Behavior, ClientGone, FakeServer, RequestRecord
from .lmstudio import FakeLMStudioServer
from .ollama import FakeOllamaServer
from .openai import FakeOpenAIServer
from .subprocess_fake import SubprocessFake

__all__ = [
    "Behavior",
    "ClientGone",
    "FakeLMStudioServer",
    "FakeOllamaServer",
    "FakeOpenAIServer",
    "FakeServer",
    "RequestRecord",
    "SubprocessFake",
]
