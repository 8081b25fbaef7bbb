"""abstract_client.sdk against a REAL llama-server and SmolLM2: openai-python (chat, not streamed
and streamed in a cancelled task), the anthropic SDK on llama-server's Messages route, and
langchain-openai, each stopped through its own call; every stop proven by the server's own
evidence (its ``cancel task`` line, the slot idle, the decoded count frozen)."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import anthropic
import openai
import pytest
from langchain_openai import ChatOpenAI

from abstract_client import GenerationCancelledError, sdk
from abstract_client.testing.processes import LlamaServer

from .helpers import press_when
from .test_llamacpp_real import assert_server_stopped, llama  # noqa: F401  (its server and its evidence)
from .test_sdk import _read, client_reads  # noqa: F401  (autouse: what the library read of each answer)

pytestmark = pytest.mark.llamacpp

STORY = [{"role": "user", "content": "Write a very long story about a dragon."}]
CONTENT = re.compile(rb'"content":"[^"]')  # a chunk with some text
GOING = {"ignore_eos": True}  # llama-server keeps decoding to max_tokens: a stop decides the end


def decoding(server: LlamaServer, n: int = 10) -> bool:
    return (server.processing_decoded() or 0) >= n


def test_openai_not_streamed_and_streamed_stop_in_llama_server(llama: LlamaServer) -> None:  # noqa: F811
    assert llama.wait_idle(10)
    client = openai.OpenAI(base_url=f"{llama.url}/v1", api_key="k", http_client=sdk.http_client())
    before = len(llama.cancelled_tasks())
    stop = threading.Event()
    seen = len(_read)  # pressed once the library read some of the answer's text: a stop keeps it
    press = press_when(lambda: len(_read) > seen and CONTENT.search(_read[-1]) is not None, stop.set)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=2000, extra_body=GOING)  # type: ignore[arg-type]
    assert time.perf_counter() - press.wait() < 5.0  # generous: the raise follows the press at once
    assert info.value.reason == "user"
    # carried over the stream: the text so far is kept, and llama-server stops at its next token
    # write (a plain request's socket it checks ~0.5 s late: ~75 more tokens on SmolLM2)
    assert info.value.partial_text
    assert_server_stopped(llama, before)

    async def cancelled_stream() -> None:
        aclient = openai.AsyncOpenAI(base_url=f"{llama.url}/v1", api_key="k", http_client=sdk.async_http_client())

        async def consume() -> None:
            stream = await aclient.chat.completions.create(
                model="smollm2",
                messages=STORY,  # type: ignore[arg-type]
                max_tokens=2000,
                stream=True,
                extra_body=GOING,
            )
            async for _ in stream:
                pass

        task = asyncio.ensure_future(consume())
        while not decoding(llama):
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await aclient.close()

    before = len(llama.cancelled_tasks())
    asyncio.run(cancelled_stream())
    assert_server_stopped(llama, before)
    client.close()


def test_anthropic_messages_stream_stops_in_llama_server_with_its_text(llama: LlamaServer) -> None:  # noqa: F811
    assert llama.wait_idle(10)
    client = anthropic.Anthropic(base_url=llama.url, api_key="k", http_client=sdk.http_client())
    before = len(llama.cancelled_tasks())
    stop = threading.Event()
    text: list[str] = []
    press = press_when(lambda: len(text) >= 10, stop.set)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        with client.messages.stream(model="smollm2", max_tokens=2000, messages=STORY, extra_body=GOING) as stream:  # type: ignore[arg-type]
            for piece in stream.text_stream:
                text.append(piece)
    assert time.perf_counter() - press.wait() < 5.0
    assert not isinstance(info.value, anthropic.APIConnectionError)
    assert info.value.partial_text.startswith("".join(text)) and text
    assert_server_stopped(llama, before)
    client.close()


def test_langchain_invoke_stops_in_llama_server(llama: LlamaServer) -> None:  # noqa: F811
    assert llama.wait_idle(10)
    http = sdk.http_client()
    chat = ChatOpenAI(
        model="smollm2",
        base_url=f"{llama.url}/v1",
        api_key="k",  # type: ignore[arg-type]
        max_tokens=2000,
        extra_body=GOING,
        http_client=http,
    )
    before = len(llama.cancelled_tasks())
    stop = threading.Event()
    press = press_when(lambda: decoding(llama), stop.set)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        chat.invoke("Write a very long story about a dragon.")
    assert time.perf_counter() - press.wait() < 5.0
    assert_server_stopped(llama, before)
    http.close()


def test_a_carried_plain_call_answers_as_the_plain_one(llama: LlamaServer) -> None:  # noqa: F811
    """Greedy: the same question sent plainly and carried over the stream gives the same answer,
    counted the same (the fold rebuilds the body llama-server would have sent)."""
    assert llama.wait_idle(10)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    answers = []
    for carry in (False, True):
        client = openai.OpenAI(
            base_url=f"{llama.url}/v1", api_key="k", http_client=sdk.http_client(carry_plain_calls=carry)
        )
        answers.append(client.chat.completions.create(model="smollm2", messages=question, max_tokens=20, temperature=0))  # type: ignore[arg-type]
        client.close()
    plain, carried = answers
    assert carried.choices[0].message.content == plain.choices[0].message.content
    assert carried.choices[0].finish_reason == plain.choices[0].finish_reason
    assert carried.usage is not None and plain.usage is not None
    assert (carried.usage.prompt_tokens, carried.usage.completion_tokens) == (
        plain.usage.prompt_tokens,
        plain.usage.completion_tokens,
    )
