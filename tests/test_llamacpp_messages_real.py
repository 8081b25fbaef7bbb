"""The Messages wire (``wire="messages"``: Anthropic's ``POST /v1/messages``) against a REAL
llama-server and SmolLM2: the shared stop suite (tests/server_contract.py) runs on it, each stop
proven by llama-server's own evidence (its ``cancel task`` line, ``/slots`` idle, the decoded
count frozen), and an answer comes back as it does on the chat wire."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from abstract_client import LLM, create_llm
from abstract_client.testing.processes import LlamaServer

from .server_contract import *  # noqa: F403  (the shared suite: ServerLane and its tests)
from .server_contract import CAPITAL
from .test_llamacpp_real import llama, server_lane  # noqa: F401  (its server and its evidence: the same)

pytestmark = pytest.mark.llamacpp


@pytest.fixture
def lm(llama: LlamaServer) -> Iterator[LLM]:  # noqa: F811  (the fixture imported above)
    assert llama.wait_idle(10), "a previous test left the slot busy"
    client = create_llm("llamacpp", "smollm2", base_url=llama.url, max_retries=0, wire="messages")
    yield client
    client.close()


def test_the_messages_route_answers_as_the_chat_route_does(lm: LLM, llama: LlamaServer) -> None:  # noqa: F811
    over_messages = lm.generate(messages=CAPITAL, max_tokens=20, temperature=0)
    assert "Paris" in over_messages.content
    assert isinstance(over_messages.raw, dict) and over_messages.raw.get("type") == "message_stop"  # this wire's end
    assert over_messages.finish_reason in ("stop", "length")
    assert over_messages.usage is not None and (over_messages.usage.prompt_tokens or 0) > 10
    with create_llm("llamacpp", "smollm2", base_url=llama.url) as chat:
        assert chat.generate(messages=CAPITAL, max_tokens=20, temperature=0).content == over_messages.content
