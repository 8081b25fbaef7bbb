"""The contract every real-server HTTP lane keeps (llama-server, vLLM), one body per test.

A lane's module provides two fixtures — ``lm`` (an ``LLM`` on its real server) and
``server_lane`` (a :class:`ServerLane`: its prompts and its server's own evidence of a stop) —
and imports the tests it runs::

    from .server_contract import *  # noqa: F403

so the same test bodies run on every server, each proven by that server's evidence (a ``cancel
task`` log line and ``/slots``; ``vllm:num_requests_running``). docs/writing-a-lane.md.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from abstract_client import LLM, AbortController, GenerationCancelledError

from .helpers import press_when

__all__ = [
    "ServerLane",
    "test_abort_controller_async",
    "test_asyncio_task_cancellation",
    "test_count_tokens_matches_the_prompt_the_server_reports",
    "test_non_streaming_over_the_stream_equals_the_plain_answer",
    "test_stop_during_prefill_of_a_long_prompt",
    "test_stop_mid_stream",
    "test_stop_non_streaming",
]

CAPITAL = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


@dataclass
class ServerLane:
    """How the suite drives one server: a story that decodes for long (``max_tokens``, EOS
    ignored), a prompt long enough to stop during its prefill, and the server's own evidence:
    ``mark()`` before a stop, ``decoding(mark)`` / ``prefilling(mark)`` while the request is in
    that phase (the Stop is pressed then: by the server's record, never by a timer), and
    ``assert_stopped(mark)`` after it."""

    story: str
    max_tokens: int
    long_prompt: str
    mark: Callable[[], Any]
    decoding: Callable[[Any], bool]  # the server has decoded a few tokens of our request
    prefilling: Callable[[Any], bool]  # the server holds our request, its prompt not yet done
    assert_stopped: Callable[[Any], None]
    after_prefill_stop: Callable[[GenerationCancelledError], None] = lambda err: None


def test_stop_mid_stream(lm: LLM, server_lane: ServerLane) -> None:
    before = server_lane.mark()
    event = threading.Event()
    n = 0
    t0 = time.perf_counter()
    with pytest.raises(GenerationCancelledError) as info:
        for chunk in lm.stream(
            server_lane.story, max_tokens=server_lane.max_tokens, ignore_eos=True, cancel_event=event
        ):
            n += bool(chunk.delta)
            if n == 10:
                t0 = time.perf_counter()
                event.set()
    assert time.perf_counter() - t0 < 0.5
    assert info.value.generated_tokens >= 10 and info.value.partial_text
    server_lane.assert_stopped(before)


def test_stop_non_streaming(lm: LLM, server_lane: ServerLane) -> None:
    # The Stop is pressed once the server's record shows our request decoding. If that record was
    # read too late on a starved machine (the whole answer decoded before the reader saw it), the
    # trial tested nothing and runs again; an answer that comes back AFTER the press fails at once.
    for _trial in range(3):
        before = server_lane.mark()
        event = threading.Event()
        press = press_when(lambda mark=before: server_lane.decoding(mark), event.set)
        try:
            result = lm.generate(
                server_lane.story, max_tokens=server_lane.max_tokens, ignore_eos=True, cancel_event=event
            )
        except GenerationCancelledError as err:
            assert time.perf_counter() - press.wait() < 5.0  # generous: the raise follows the press
            assert err.partial_text  # what the server had decoded is kept
            server_lane.assert_stopped(before)
            return
        answered = time.perf_counter()
        pressed = press.settle()
        if pressed is not None and pressed < answered:
            pytest.fail(f"a complete answer ({len(result.content)} chars) came back after the Stop")
        server_lane.assert_stopped(before)
    pytest.fail("in 3 trials the server's record never showed the request decoding before it ended")


def test_stop_during_prefill_of_a_long_prompt(lm: LLM, server_lane: ServerLane) -> None:
    # The Stop is pressed once the server's record shows the prompt in prefill. On a starved
    # machine the record can be read late and the first token beat the press: that trial tested
    # nothing, and runs again on a new prompt (a server's prefix cache would make the same one
    # short). A token that arrives after the press fails at once.
    for trial in range(3):
        before = server_lane.mark()
        controller = AbortController()
        press = press_when(lambda mark=before: server_lane.prefilling(mark), controller.abort)
        err: GenerationCancelledError | None = None
        try:
            for _ in lm.stream(f"({trial}) {server_lane.long_prompt}", max_tokens=50, signal=controller.signal):
                if press.pressed.is_set():
                    pytest.fail("a token arrived after the Stop")
                break  # the first token came before the press: this trial tested nothing
            else:
                pytest.fail("the stream ended with neither a token nor the Stop")
        except GenerationCancelledError as e:
            err = e
        press.cancel()
        if err is not None:
            break
        server_lane.assert_stopped(before)  # the break stopped it: the server is idle again
    else:
        pytest.fail("in 3 trials the first token always came before the Stop was pressed")
    press.wait()
    assert err is not None
    assert err.partial_text == ""
    assert err.generated_tokens == 0  # stopped before its first token
    server_lane.assert_stopped(before)
    server_lane.after_prefill_stop(err)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_abort_controller_async(lm: LLM, server_lane: ServerLane, anyio_backend: str) -> None:
    before = server_lane.mark()
    controller = AbortController()
    with pytest.raises(GenerationCancelledError):
        async with lm.astream(
            server_lane.story, max_tokens=server_lane.max_tokens, ignore_eos=True, signal=controller.signal
        ) as stream:
            n = 0
            async for chunk in stream:
                n += bool(chunk.delta)
                if n == 5:
                    controller.abort()
    await anyio.to_thread.run_sync(server_lane.assert_stopped, before)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # asyncio's own task.cancel()
async def test_asyncio_task_cancellation(lm: LLM, server_lane: ServerLane, anyio_backend: str) -> None:
    before = server_lane.mark()
    task = asyncio.ensure_future(lm.agenerate(server_lane.story, max_tokens=server_lane.max_tokens, ignore_eos=True))
    loop = asyncio.get_running_loop()
    press = press_when(lambda: server_lane.decoding(before), lambda: loop.call_soon_threadsafe(task.cancel))
    with pytest.raises(asyncio.CancelledError):
        await task
    press.wait()
    await asyncio.to_thread(server_lane.assert_stopped, before)


@pytest.mark.parametrize("raw", [False, True], ids=["chat", "raw"])
def test_non_streaming_over_the_stream_equals_the_plain_answer(lm: LLM, raw: bool) -> None:
    """A non-streaming generate rides the streaming wire by default; greedy decoding gives the
    same content, finish_reason and usage as the plain route."""
    kwargs: dict[str, Any] = {"max_tokens": 12, "temperature": 0, "seed": 1}
    if raw:
        over = lm.generate("The capital of France is", raw=True, **kwargs)
        plain = lm.generate("The capital of France is", raw=True, plain_route=True, **kwargs)
    else:
        over = lm.generate(messages=CAPITAL, **kwargs)  # type: ignore[arg-type]
        plain = lm.generate(messages=CAPITAL, plain_route=True, **kwargs)  # type: ignore[arg-type]
    assert over.content == plain.content and over.content
    assert over.finish_reason == plain.finish_reason
    # the same tokens; how many of the prompt's the server's cache served differs (the first
    # call on a fresh server warms the cache the second one reads)
    assert over.usage is not None and plain.usage is not None and over.usage.completion_tokens
    assert (over.usage.prompt_tokens, over.usage.completion_tokens) == (
        plain.usage.prompt_tokens,
        plain.usage.completion_tokens,
    )


def test_count_tokens_matches_the_prompt_the_server_reports(lm: LLM) -> None:
    result = lm.generate(messages=CAPITAL, max_tokens=2, temperature=0)  # type: ignore[arg-type]
    assert result.usage is not None and lm.count_tokens(messages=CAPITAL) == result.usage.prompt_tokens  # type: ignore[arg-type]
    raw = lm.generate("The capital of France is", raw=True, max_tokens=2, temperature=0)
    assert raw.usage is not None and lm.count_tokens("The capital of France is") == raw.usage.prompt_tokens
