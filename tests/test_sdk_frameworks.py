"""abstract_client.sdk under the frameworks applications build on — pydantic-ai, openai-agents,
LangChain (``ChatAnthropic``, ``with_fallbacks``), LiteLLM — each given the library's client the
way docs/sdks.md's recipe says, at its default retry settings, stopped on the fake servers.

Each test proves what a user relies on, by the server's record: the disconnect, one request (no
retry, no fallback sent), the typed ``GenerationCancelledError`` where the caller wrote
``stop_on`` (with the text a stream had), and the caller released at once — also while an
agent's tool runs (``async with stop_on``). LlamaIndex and instructor, which pin an older
openai-python, run in a venv of their own: tests/test_sdk_frameworks_openai2.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import anyio
import openai
import pytest

from abstract_client import GenerationCancelledError, sdk
from abstract_client.testing import FakeOpenAIServer

from .helpers import press_when
from .test_sdk import after_read, after_tokens, assert_stopped_server_side, client_reads, sent  # noqa: F401 (autouse: what after_read counts)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM fetches a price list at import

RELEASED = 2.0  # generous: the release is milliseconds (docs/sdks.md has the figures)
LONG = 2000
TOOL_CALL = [{"tool": 0, "id": "call_1", "name": "slow_lookup", "arguments": '{"q": "x"}'}]


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=LONG) as s:
        yield s


def stopped_by_a_press(server: FakeOpenAIServer, *, read: bool = False) -> tuple[threading.Event, Any]:
    """A stop pressed once the server sent 5 tokens (``read``: once the caller's side read them,
    for a test that counts on their text being kept)."""
    stop = threading.Event()
    return stop, press_when((after_read if read else after_tokens)(server, 5), stop.set)


# -- pydantic-ai -------------------------------------------------------------------------------


def pydantic_ai_agent(server: FakeOpenAIServer, **agent: Any) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=server.base_url, api_key="k", http_client=sdk.async_http_client())
    return Agent(OpenAIChatModel("fake-model", provider=provider), **agent)


def test_pydantic_ai_run_sync_and_run_stream_stop_at_the_server(server: FakeOpenAIServer) -> None:
    agent = pydantic_ai_agent(server)
    stop, press = stopped_by_a_press(server, read=True)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        agent.run_sync("Tell me a long story")
    assert time.perf_counter() - press.wait() < RELEASED
    assert info.value.reason == "user" and info.value.partial_text  # (carried over the stream)
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1

    async def streamed() -> None:
        stop, press = stopped_by_a_press(server, read=True)
        with pytest.raises(GenerationCancelledError) as info:
            async with sdk.stop_on(stop), agent.run_stream("Tell me a long story") as result:
                async for _ in result.stream_text(delta=True):
                    pass
        assert time.perf_counter() - press.wait() < RELEASED and info.value.partial_text
        assert_stopped_server_side(server, press.wait())

    anyio.run(streamed)
    assert sent(server) == 2


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stop_while_a_pydantic_ai_tool_runs_releases_at_once(
    server: FakeOpenAIServer, anyio_backend: str
) -> None:
    server.behavior.script = TOOL_CALL
    agent = pydantic_ai_agent(server)
    running = threading.Event()

    @agent.tool_plain
    async def slow_lookup(q: str) -> str:
        running.set()
        await anyio.sleep(30)
        return "found"

    stop = threading.Event()
    press = press_when(running.is_set, stop.set)
    with pytest.raises(GenerationCancelledError) as info:
        async with sdk.stop_on(stop):
            await agent.run("look it up")
    assert time.perf_counter() - press.wait() < RELEASED
    assert info.value.reason == "user"
    assert sent(server) == 1  # the answer after the tool was never asked for


def test_pydantic_ai_fallback_model_does_not_answer_a_stop(server: FakeOpenAIServer) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.fallback import FallbackModel
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    def model() -> Any:
        provider = OpenAIProvider(base_url=server.base_url, api_key="k", http_client=sdk.async_http_client())
        return OpenAIChatModel("fake-model", provider=provider)

    agent = Agent(FallbackModel(model(), model()))
    stop, press = stopped_by_a_press(server)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        agent.run_sync("Tell me a long story")
    assert time.perf_counter() - press.wait() < RELEASED
    assert sent(server) == 1


# -- openai-agents -----------------------------------------------------------------------------


def openai_agent(server: FakeOpenAIServer, **agent: Any) -> Any:
    from agents import Agent, OpenAIChatCompletionsModel, set_tracing_disabled

    set_tracing_disabled(True)  # (else it exports traces to OpenAI's servers)
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=sdk.async_http_client())
    return Agent(name="writer", model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client), **agent)


def test_openai_agents_run_sync_stops_at_the_server(server: FakeOpenAIServer) -> None:
    from agents import Runner

    agent = openai_agent(server)
    stop, press = stopped_by_a_press(server)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        Runner.run_sync(agent, "Tell me a long story")
    assert time.perf_counter() - press.wait() < RELEASED
    assert info.value.reason == "user"
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stop_while_an_openai_agents_tool_runs_releases_at_once(
    server: FakeOpenAIServer, anyio_backend: str
) -> None:
    from agents import Runner, function_tool

    server.behavior.script = TOOL_CALL
    running = threading.Event()

    @function_tool
    async def slow_lookup(q: str) -> str:
        running.set()
        await anyio.sleep(30)
        return "found"

    agent = openai_agent(server, tools=[slow_lookup])
    stop = threading.Event()
    press = press_when(running.is_set, stop.set)
    with pytest.raises(GenerationCancelledError):
        async with sdk.stop_on(stop):
            await Runner.run(agent, "look it up")
    assert time.perf_counter() - press.wait() < RELEASED
    assert sent(server) == 1


# -- LangChain ---------------------------------------------------------------------------------


def chat_anthropic(server: FakeOpenAIServer) -> Any:
    """langchain-anthropic takes no ``http_client=``: its two SDK clients are put in by hand."""
    from langchain_anthropic import ChatAnthropic

    chat = ChatAnthropic(model="fake-model", base_url=server.url, api_key="k", max_tokens=LONG)  # type: ignore[call-arg,arg-type]
    chat.__dict__["_client"] = anthropic.Anthropic(base_url=server.url, api_key="k", http_client=sdk.http_client())
    chat.__dict__["_async_client"] = anthropic.AsyncAnthropic(
        base_url=server.url, api_key="k", http_client=sdk.async_http_client()
    )
    return chat


def test_langchain_chat_anthropic_invoke_and_astream_stop_at_the_server(server: FakeOpenAIServer) -> None:
    chat = chat_anthropic(server)
    stop, press = stopped_by_a_press(server, read=True)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        chat.invoke("Tell me a long story")
    assert time.perf_counter() - press.wait() < RELEASED and info.value.partial_text
    assert_stopped_server_side(server, press.wait())

    async def streamed() -> None:
        stop, press = stopped_by_a_press(server, read=True)
        with pytest.raises(GenerationCancelledError) as info:
            async with sdk.stop_on(stop):
                async for _ in chat.astream("Tell me a long story"):
                    pass
        assert info.value.partial_text
        assert_stopped_server_side(server, press.wait())

    anyio.run(streamed)
    assert sent(server, "/v1/messages") == 2


def test_langchain_with_fallbacks_never_answers_a_stop(server: FakeOpenAIServer) -> None:
    """``with_fallbacks`` falls back on any ``Exception``: given the library's client too, the
    fallback's request is refused by the stopped block before a byte is sent — one request,
    the typed error, never the fallback's whole answer; ``with_retry``'s sleeps (tenacity's)
    end at once too."""
    from langchain_openai import ChatOpenAI

    def chat() -> Any:
        return ChatOpenAI(
            model="fake-model",
            base_url=server.base_url,
            api_key="k",  # type: ignore[arg-type]
            http_client=sdk.http_client(),
            http_async_client=sdk.async_http_client(),
        )

    chain = chat().with_fallbacks([chat()]).with_retry(stop_after_attempt=3)
    stop, press = stopped_by_a_press(server)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        chain.invoke("Tell me a long story")
    assert time.perf_counter() - press.wait() < RELEASED
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1


# -- LiteLLM -----------------------------------------------------------------------------------


def test_litellm_completion_and_its_router_stop_at_the_server(server: FakeOpenAIServer) -> None:
    """LiteLLM given an OpenAI client on the library's transport (``client=``): its own error
    class inside the block, the typed error at the block's edge; its Router's retries are
    refused before they are sent (one request)."""
    import litellm

    client = openai.OpenAI(base_url=server.base_url, api_key="k", http_client=sdk.http_client())
    stop, press = stopped_by_a_press(server)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        litellm.completion(
            model="openai/fake-model",
            messages=[{"role": "user", "content": "Tell me a long story"}],
            api_base=server.base_url,
            api_key="k",
            client=client,
        )
    assert time.perf_counter() - press.wait() < RELEASED and info.value.reason == "user"
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1

    async def routed() -> None:
        router = litellm.Router(
            model_list=[
                {
                    "model_name": "story",
                    "litellm_params": {"model": "openai/fake-model", "api_base": server.base_url, "api_key": "k"},
                }
            ],
            num_retries=2,
        )
        aclient = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=sdk.async_http_client())
        stop, press = stopped_by_a_press(server)
        with pytest.raises(GenerationCancelledError):
            async with sdk.stop_on(stop):
                await router.acompletion(
                    model="story", messages=[{"role": "user", "content": "Tell me a long story"}], client=aclient
                )
        assert time.perf_counter() - press.wait() < RELEASED
        assert_stopped_server_side(server, press.wait())

    anyio.run(routed)
    assert sent(server) == 2
