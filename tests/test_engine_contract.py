"""The contract every in-process lane keeps (MLX text, batched and vision, transformers, gguf),
run against each lane's real engine: one suite, one fixture a lane.

A new in-process lane adds itself to ``ENGINE_LANES`` (docs/writing-a-lane.md) and gets every
test here. What a lane proves on its own (where inside a forward pass it stops, its memory
figures, its engine's quirks) stays in its own module.

The central promise checked here: a stop releases its caller at once, sync and async alike —
the engine drains behind it (the next call, an eject and ``close()`` wait for that drain, the
caller never does). "At once" is proven without timing: the engine's first read of the raised
flag is held (``HeldFlag``) until the test lets it go, so the caller can only have raised while
the engine was still computing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from abstract_client import LLM, AbortController, GenerationCancelledError, NotSupportedError, create_llm, image_part

from .helpers import WEATHER_TOOL, HeldFlag, wait_until


@dataclass
class EngineLane:
    """How the suite drives one lane: its ``create_llm`` arguments and a prompt that decodes for
    long (hundreds of tokens) once it starts."""

    name: str
    make: Callable[[], LLM]
    prompt: Callable[[], dict[str, Any]]  # the call's prompt= or messages=
    options: dict[str, Any] = field(default_factory=dict)
    long_prompt: Callable[[], dict[str, Any]] | None = None  # several prefill chunks


def _needs(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        if os.environ.get("ABSTRACT_CLIENT_REQUIRE_ENGINES") == "1":
            pytest.fail(f"{module} is required by the test command: pip install -e '.[{extra}]'")
        pytest.skip(f"{module} is missing: pip install -e '.[{extra}]'")


NO_EOS_TINY = {"logit_bias": {1: -1e9}}  # the tiny models' EOS id: they decode until max_tokens
STORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me a long story about a fox and a crow."},
]


def _words(n: int) -> str:
    return " ".join(f"item{i}" for i in range(n))


def _png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (80, 60), (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def _lane(name: str, tmp: Callable[[str], Path]) -> EngineLane:
    if name in ("mlx", "mlx-batched"):
        _needs("mlx_lm", "mlx")
        from abstract_client.testing.tiny_mlx import build_tiny_llama

        path = str(build_tiny_llama(tmp("tiny-llama")))
        batch = 2 if name == "mlx-batched" else 1
        return EngineLane(
            name,
            lambda: create_llm("mlx", path, prefill_step_size=16, max_batch_size=batch),
            lambda: {"prompt": "hello"},
            {**NO_EOS_TINY, "max_tokens": 100_000},
            long_prompt=lambda: {"prompt": _words(2000)},
        )
    if name == "mlx-vision":
        _needs("mlx_vlm", "vlm")
        from abstract_client.testing.tiny_vlm import build_tiny_llava

        path = str(build_tiny_llava(tmp("tiny-llava")))
        png = _png()

        def with_image(text: str) -> dict[str, Any]:
            return {"messages": [{"role": "user", "content": [{"type": "text", "text": text}, image_part(png)]}]}

        return EngineLane(
            name,
            lambda: create_llm("mlx", path, prefill_step_size=16),
            lambda: with_image("hello"),
            {**NO_EOS_TINY, "max_tokens": 100_000},
            long_prompt=lambda: with_image(_words(1500)),
        )
    if name == "transformers":
        _needs("transformers", "transformers")
        from abstract_client.app.assets import smollm2_hf

        path = str(smollm2_hf())
        return EngineLane(
            name,
            lambda: create_llm("transformers", path, prefill_step_size=64),
            lambda: {"messages": STORY},
            {"max_tokens": 400},
            long_prompt=lambda: {"prompt": _words(600)},
        )
    if name == "gguf":
        _needs("llama_cpp", "gguf")
        from abstract_client.app.assets import smollm2_gguf

        path = str(smollm2_gguf())
        return EngineLane(
            name,
            lambda: create_llm("gguf", path, n_ctx=8192, n_batch=256),
            lambda: {"messages": STORY},
            {"max_tokens": 400},
            long_prompt=lambda: {"prompt": _words(600)},
        )
    raise AssertionError(name)


ENGINE_LANES = ("mlx", "mlx-batched", "mlx-vision", "transformers", "gguf")
# Lanes whose suite model is a real one (SmolLM2): what needs a meaningful answer (a seed's
# sample, JSON, a tool call, embeddings) runs on these; the MLX lanes' are random-weight tiny
# models (their real-model twins: tests/test_tools_real.py, tests/test_embeddings_real.py).
REAL_MODEL_LANES = ("transformers", "gguf")

_MADE: dict[str, tuple[EngineLane, LLM]] = {}


def _made(name: str, tmp: Callable[[str], Path]) -> tuple[EngineLane, LLM]:
    if name not in _MADE:
        spec = _lane(name, tmp)
        llm = spec.make()
        llm.load_model()
        _MADE[name] = (spec, llm)
    return _MADE[name]


@pytest.fixture(scope="module", autouse=True)
def _close_the_lanes() -> Iterator[None]:
    yield
    for _, llm in _MADE.values():
        llm.close()
    _MADE.clear()


@pytest.fixture(scope="module", params=ENGINE_LANES)
def lane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[EngineLane, LLM]:
    return _made(str(request.param), tmp_path_factory.mktemp)


@pytest.fixture(scope="module", params=REAL_MODEL_LANES)
def real_lane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[EngineLane, LLM]:
    return _made(str(request.param), tmp_path_factory.mktemp)


def _provider(llm: LLM) -> Any:
    from abstract_client.providers._engine import EngineProvider

    assert isinstance(llm.provider, EngineProvider)
    return llm.provider


def _stop_when(llm: LLM, request_id: str, where: str, stop: Callable[[], object]) -> threading.Thread:
    """Stop from another thread (a UI's Stop button) once the engine is ``where``."""

    def ready() -> bool:
        stats = _provider(llm).stats(request_id)
        if stats is None:
            return False
        return stats.tokens >= 3 if where == "decode" else (stats.prefill_done > 0 or stats.layers_done > 0)

    def run() -> None:
        if wait_until(ready, 60, interval=0.001):
            stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _request(spec: EngineLane, where: str) -> dict[str, Any]:
    if where == "prefill":
        assert spec.long_prompt is not None
        return spec.long_prompt()
    return spec.prompt()


def _after_the_raise(llm: LLM, held: HeldFlag, request_id: str, err: GenerationCancelledError) -> None:
    """The raise came while the engine was held (so before its drain); then the drain finishes
    and the engine's own record says it stopped, counting nothing under the flag."""
    raised_idle = _provider(llm).thread.idle
    assert not held.expired.is_set(), "the caller was released only after the engine's drain"
    assert not raised_idle, "the engine was idle at the raise: nothing shows the caller did not wait"
    held.release.set()
    assert _provider(llm).thread.wait_idle(60), "the engine never drained behind the caller"
    assert held.reached.is_set()
    stats = _provider(llm).stats(request_id)
    assert stats is not None and not stats.finished
    assert stats.tokens_at_stop == stats.tokens  # nothing counted after the engine saw the flag
    assert err.request_id == request_id and err.reason == "user"
    assert llm.in_flight == []
    # The error carries what the engine had counted when its caller was released: every token
    # but, at most, the one whose flag check came just before the stop (counted behind it).
    assert err.usage is not None and err.usage.completion_tokens is not None
    assert 0 <= stats.tokens - err.usage.completion_tokens <= 1, (stats.tokens, err.usage)
    assert err.generated_tokens == err.usage.completion_tokens
    assert err.usage.prompt_tokens == stats.prompt_tokens  # the engine's own count of the prompt


@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_a_sync_stop_releases_the_caller_before_the_engine_drains(
    lane: tuple[EngineLane, LLM], where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, llm = lane
    held = HeldFlag(lambda: _provider(llm).thread.ident)
    held.install(monkeypatch)
    event = threading.Event()
    rid = f"sync-{spec.name}-{where}"
    _stop_when(llm, rid, where, event.set)
    try:
        with pytest.raises(GenerationCancelledError) as info:
            for _ in llm.stream(**_request(spec, where), cancel_event=event, request_id=rid, **spec.options):
                pass
        _after_the_raise(llm, held, rid, info.value)
    finally:
        held.release.set()
        _provider(llm).thread.wait_idle(60)


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["prefill", "decode"])
async def test_an_async_stop_releases_the_caller_before_the_engine_drains(
    lane: tuple[EngineLane, LLM], where: str, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, llm = lane
    held = HeldFlag(lambda: _provider(llm).thread.ident)
    held.install(monkeypatch)
    controller = AbortController()
    rid = f"async-{spec.name}-{where}-{anyio_backend}"
    _stop_when(llm, rid, where, controller.abort)
    try:
        with pytest.raises(GenerationCancelledError) as info:
            async with llm.astream(
                **_request(spec, where), signal=controller.signal, request_id=rid, **spec.options
            ) as stream:
                async for _ in stream:
                    pass
        _after_the_raise(llm, held, rid, info.value)
    finally:
        held.release.set()
        await anyio.to_thread.run_sync(_provider(llm).thread.wait_idle, 60)


@pytest.mark.anyio
async def test_a_cancelled_task_is_released_at_once_and_the_engine_drains(
    lane: tuple[EngineLane, LLM], anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A framework cancellation (a deadline on the caller's task) re-raises unchanged at once;
    the engine drains behind it."""
    spec, llm = lane
    held = HeldFlag(lambda: _provider(llm).thread.ident)
    held.install(monkeypatch)
    rid = f"task-{spec.name}-{anyio_backend}"
    started = threading.Event()
    _stop_when(llm, rid, "decode", started.set)
    try:
        with anyio.CancelScope() as scope:

            async def cancel_when_started() -> None:
                await anyio.to_thread.run_sync(started.wait, 60)
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_started)
                await llm.agenerate(**spec.prompt(), request_id=rid, **spec.options)
        assert scope.cancelled_caught
        assert not held.expired.is_set(), "the task was released only after the engine's drain"
        assert not _provider(llm).thread.idle
        held.release.set()
        assert await anyio.to_thread.run_sync(_provider(llm).thread.wait_idle, 60)
        stats = _provider(llm).stats(rid)
        assert stats is not None and stats.stopped_in is not None and stats.tokens_at_stop == stats.tokens
    finally:
        held.release.set()
        await anyio.to_thread.run_sync(_provider(llm).thread.wait_idle, 60)


def test_the_next_call_waits_for_the_drain(lane: tuple[EngineLane, LLM], monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller is released at once, never the engine: a call made right after the stop runs
    only after the drain (an eject waits for it too: ``unload_model`` waits for the engine to
    be idle, tested in each lane's module)."""
    spec, llm = lane
    held = HeldFlag(lambda: _provider(llm).thread.ident)
    held.install(monkeypatch)
    event = threading.Event()
    rid = f"next-{spec.name}"
    _stop_when(llm, rid, "decode", event.set)
    try:
        with pytest.raises(GenerationCancelledError):
            for _ in llm.stream(**spec.prompt(), cancel_event=event, request_id=rid, **spec.options):
                pass
        answered: list[float] = []
        nxt = threading.Thread(
            target=lambda: answered.append(
                (llm.generate(**spec.prompt(), **{**spec.options, "max_tokens": 2}), time.perf_counter())[1]
            ),
            daemon=True,
        )
        nxt.start()
        time.sleep(0.3)
        assert answered == [], "the next call ran while the stopped one was still on the engine"
        released_at = time.perf_counter()
        held.release.set()
        nxt.join(60)
        assert answered and answered[0] >= released_at
    finally:
        held.release.set()
        _provider(llm).thread.wait_idle(60)


def test_the_length_limit_and_a_stop_string_end_the_answer(lane: tuple[EngineLane, LLM]) -> None:
    """The shared token step (``providers/_step.py``): ``max_tokens`` ends the answer with
    ``length`` after exactly that many tokens; a stop string ends it with ``stop``, the text cut
    before it — the same greedy answer on every lane's engine."""
    spec, llm = lane
    options = {**spec.options, "max_tokens": 8, "temperature": 0}
    full = llm.generate(**spec.prompt(), **options)
    assert full.finish_reason == "length" and full.usage is not None and full.usage.completion_tokens == 8
    streamed = "".join(c.delta for c in llm.stream(**spec.prompt(), **options))
    assert streamed == full.content
    text = full.content
    assert len(text) > 6, text
    cut = text[3:6]
    stopped = llm.generate(**spec.prompt(), **{**options, "stop": [cut]})
    assert stopped.finish_reason == "stop"
    assert stopped.content == text[: text.index(cut)]
    assert stopped.usage is not None and stopped.usage.completion_tokens < 8  # it ended there


@pytest.mark.parametrize("name", ["mlx", "transformers", "gguf"])
def test_a_servers_options_are_refused_by_an_in_process_lane(name: str) -> None:
    """An engine in this process has no server: ``base_url`` or ``api_key`` given to it is a
    mistake (a wrong lane name, a config copied from a server lane), said at once."""
    with pytest.raises(TypeError, match="base_url"):
        create_llm(name, "/any/model", base_url="http://127.0.0.1:8080")
    with pytest.raises(TypeError, match="api_key"):
        create_llm(name, "/any/model", api_key="sk-1")


CAPITAL = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_a_seed_json_and_embeddings(real_lane: tuple[EngineLane, LLM]) -> None:
    """A seed makes a sampled answer repeat; a JSON schema makes the answer schema-valid JSON;
    embeddings are unit vectors, one per input, with their tokens counted."""
    spec, llm = real_lane
    a = llm.generate(**spec.prompt(), max_tokens=12, temperature=1.0, seed=7).content
    b = llm.generate(**spec.prompt(), max_tokens=12, temperature=1.0, seed=7).content
    assert a == b
    cut = llm.generate(messages=CAPITAL, max_tokens=20, temperature=0, stop=["Paris"])  # type: ignore[arg-type]
    assert "Paris" not in cut.content and cut.finish_reason == "stop"
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    shaped = llm.generate(messages=CAPITAL, max_tokens=40, response_format=schema)  # type: ignore[arg-type]
    assert isinstance(json.loads(shaped.content)["city"], str)
    batch = llm.embed(["the capital of France", "Paris", "a bicycle"])
    assert len(batch.vectors) == 3 and all(abs(sum(x * x for x in v) - 1) < 1e-3 for v in batch.vectors)
    assert batch.usage is not None and (batch.usage.prompt_tokens or 0) >= 3


def test_a_forced_tool_call_and_auto_refused(real_lane: tuple[EngineLane, LLM]) -> None:
    """No tool-call parser on these lanes' models: "auto" is refused before anything runs; a
    forced call is carried as schema-constrained output, and comes back as a whole call."""
    _, llm = real_lane
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with pytest.raises(NotSupportedError):
        llm.generate(messages=ask, tools=[WEATHER_TOOL])  # type: ignore[arg-type]
    result = llm.generate(messages=ask, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=60)  # type: ignore[arg-type]
    (call,) = result.tool_calls
    assert call.name == "get_weather" and set(call.arguments) == {"city"}
