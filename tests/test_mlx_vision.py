"""The mlx lane's vision models on REAL mlx-vlm: a tiny random-weight LLaVA (CLIP tower + small
llama), built offline. The stop is judged by the engine's own record — the phase it stopped in,
the prefill tokens it evaluated, the tokens it counted — and ``mx.get_active_memory()``.

Where the flag goes up is made exact by wrapping the engine's own calls (the vision call, a
prefill chunk, the sampler): each test knows which check must see it."""

from __future__ import annotations

import gc
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from abstract_client import (
    LLM,
    AbortController,
    GenerationCancelledError,
    NotSupportedError,
    create_llm,
    image_part,
)

from .helpers import press_when, require_module, stream_in_threads, wait_until

mx = require_module("mlx.core", "mlx")
require_module("mlx_vlm", "vlm")
from abstract_client.providers._mlx.vision import VisionModel  # noqa: E402
from abstract_client.providers.mlx import MLXProvider  # noqa: E402

NO_EOS = {"logit_bias": {1: -1e9}}  # the tiny model's EOS id: generations run until max_tokens
STEP = 16  # prefill tokens per evaluation in these tests
PATCHES = 64  # (112 / 14)²: the tiny model's image tokens


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from abstract_client.testing.tiny_vlm import build_tiny_llava

    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="module")
def png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (80, 60), (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def llava(llava_dir: Path) -> Iterator[LLM]:
    llm = create_llm("mlx", str(llava_dir), prefill_step_size=STEP)
    llm.load_model()
    yield llm
    llm.close()


def engine(llm: LLM) -> MLXProvider:
    assert isinstance(llm.provider, MLXProvider) and isinstance(llm.provider.handle, VisionModel)
    return llm.provider


def look(png: bytes, text: str = "What is in this picture?") -> list[Any]:
    return [{"role": "user", "content": [image_part(png), {"type": "text", "text": text}]}]


def flag_on(obj: Any, name: str, event: threading.Event, at_call: int = 1) -> list[int]:
    """Wrap ``obj.name`` (an engine call): its ``at_call``-th call sets ``event`` (while it
    runs, on the engine thread). Returns the list of calls made, for the assertions."""
    real = getattr(obj, name)
    calls: list[int] = []

    class Wrapped:
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == at_call:
                event.set()
            return real(*args, **kwargs)

        def __getattr__(self, attr: str) -> Any:  # a module's parts (layers, embeddings) as they are
            return getattr(real, attr)

    setattr(obj, name, Wrapped())
    return calls


def test_an_image_prompt_streams_tokens(llava: LLM, png: bytes) -> None:
    with_image = llava.generate(messages=look(png), max_tokens=12, request_id="img", **NO_EOS)
    text_only = llava.generate("What is in this picture?", max_tokens=2)
    assert with_image.usage is not None and text_only.usage is not None
    # the processor expanded <image> into one token per patch
    assert with_image.usage.prompt_tokens - text_only.usage.prompt_tokens >= PATCHES - 1
    assert with_image.usage.completion_tokens == 12 and with_image.finish_reason == "length"
    chunks = list(llava.stream(messages=look(png), max_tokens=12, **NO_EOS))
    assert "".join(c.delta for c in chunks) == with_image.content  # greedy: the same answer
    stats = engine(llava).stats("img")
    assert stats is not None and stats.finished and stats.phase == "decode"
    assert stats.prefill_done == stats.prompt_tokens - 1  # every prompt token but the last, in chunks


def test_a_stop_set_before_the_call_computes_nothing(llava: LLM, png: bytes) -> None:
    event = threading.Event()
    event.set()
    embedded = flag_on(engine(llava).handle.model, "get_input_embeddings", threading.Event())
    with pytest.raises(GenerationCancelledError):
        llava.generate(messages=look(png), cancel_event=event, request_id="pre")
    stats = engine(llava).stats("pre")
    assert stats is None or (stats.phase is None and stats.prompt_tokens is None)
    assert embedded == []  # not even the image was encoded


def test_a_stop_after_the_tower_lands_before_prefill(llava: LLM, png: bytes) -> None:
    """The flag raised after the tower's last layer check (in the projector) is seen right after
    the vision call: no prefill chunk runs."""
    event = threading.Event()
    flag_on(engine(llava).handle.model, "multi_modal_projector", event)
    with pytest.raises(GenerationCancelledError) as info:
        llava.generate(messages=look(png), cancel_event=event, request_id="vision")
    assert event.is_set()
    assert engine(llava).thread.wait_idle(10)
    stats = engine(llava).stats("vision")
    assert stats is not None and stats.stopped_in == "vision"
    assert stats.prefill_done == 0 and stats.tokens == 0 and info.value.partial_text == ""


def test_a_stop_inside_the_vision_tower_lands_at_the_next_encoder_layer(llava: LLM, png: bytes) -> None:
    """Left to MLX the tower is one evaluation (seconds on a CPU); the lane evaluates it layer
    by layer: the flag raised while layer 0 computes is seen before layer 1."""
    handle = engine(llava).handle
    assert handle.checked_layers == 2  # the tiny CLIP tower's encoder layers
    layers = handle.model.vision_tower.vision_model.encoder.layers
    event = threading.Event()
    first = layers[0]

    def pressing_during(*args: Any, **kwargs: Any) -> Any:
        out = first(*args, **kwargs)
        event.set()
        return out

    layers[0] = pressing_during
    try:
        with pytest.raises(GenerationCancelledError):
            llava.generate(messages=look(png), cancel_event=event, request_id="layer")
    finally:
        layers[0] = first
    assert engine(llava).thread.wait_idle(10)
    stats = engine(llava).stats("layer")
    assert stats is not None and stats.stopped_in == "vision"
    assert stats.layers_done == 1 and stats.prefill_done == 0  # layer 0 evaluated, layer 1 never


def test_a_stop_during_prefill_lands_at_the_next_chunk_boundary(llava: LLM, png: bytes) -> None:
    event = threading.Event()
    model = engine(llava).handle.model
    flag_on(model, "language_model", event, at_call=2)  # while chunk 2 is built
    with pytest.raises(GenerationCancelledError):
        llava.generate(messages=look(png, "a long question " * 20), cancel_event=event, request_id="prefill")
    assert engine(llava).thread.wait_idle(10)
    stats = engine(llava).stats("prefill")
    assert stats is not None and stats.stopped_in == "prefill" and stats.tokens == 0
    assert stats.prefill_done == 2 * STEP < stats.prefill_total  # chunk 2 ends, nothing more


@pytest.mark.parametrize("at_sample", [2, 5, 9])
def test_a_stop_in_decode_lands_within_one_token(llava: LLM, png: bytes, at_sample: int) -> None:
    """Sample k is drawn while token k-1 is being handed out (one ahead, as mlx-lm): the flag
    raised there is seen before token k-1 is counted — k-2 tokens, and that is the partial."""
    handle = engine(llava).handle
    real_sampler = type(handle).sampler.__get__(handle)
    event = threading.Event()

    def sampler(request: Any) -> Any:
        sample = real_sampler(request)
        draws: list[int] = []

        def counting(logprobs: Any) -> Any:
            draws.append(1)
            if len(draws) == at_sample:
                event.set()
            return sample(logprobs)

        return counting

    handle.sampler = sampler  # type: ignore[method-assign]
    request_id = f"decode-{at_sample}"
    with pytest.raises(GenerationCancelledError) as info:
        for _ in llava.stream(messages=look(png), max_tokens=200, cancel_event=event, request_id=request_id, **NO_EOS):
            pass
    assert engine(llava).thread.wait_idle(10)
    stats = engine(llava).stats(request_id)
    assert stats is not None and stats.stopped_in == "decode"
    assert stats.tokens_at_stop == stats.tokens == at_sample - 2
    assert info.value.generated_tokens <= at_sample - 2


def test_non_streaming_stop_keeps_partial_text(llava: LLM, png: bytes) -> None:
    controller = AbortController()
    press = press_when(lambda: engine(llava).stats("ns").tokens >= 3, controller.abort)  # type: ignore[union-attr]
    with pytest.raises(GenerationCancelledError) as info:
        llava.generate(messages=look(png), max_tokens=1_000_000, signal=controller.signal, request_id="ns", **NO_EOS)
    press.wait()
    assert engine(llava).thread.wait_idle(10)
    stats = engine(llava).stats("ns")
    assert stats is not None and stats.stopped_in == "decode" and stats.tokens > 0
    assert info.value.partial_text and info.value.usage is not None
    assert info.value.usage.completion_tokens == stats.tokens  # the engine's own count


@pytest.mark.anyio
async def test_async_task_cancel_drains_the_engine(llava: LLM, png: bytes, anyio_backend: str) -> None:
    received = 0
    with anyio.move_on_after(0.5):
        async for _ in llava.astream(messages=look(png), max_tokens=1_000_000, request_id="task", **NO_EOS):
            received += 1
    assert received > 0
    # the task was released at once; the engine drains behind it (tests/test_engine_contract.py)
    assert await anyio.to_thread.run_sync(engine(llava).thread.wait_idle, 10)
    stats = engine(llava).stats("task")
    assert stats is not None and stats.stopped_in == "decode" and not stats.finished


def test_eject_during_generation_frees_memory(llava_dir: Path, png: bytes) -> None:
    gc.collect()
    mx.clear_cache()
    baseline = mx.get_active_memory()
    llm = create_llm("mlx", str(llava_dir), prefill_step_size=STEP)
    threads, errors = stream_in_threads(llm, 2, messages=look(png), max_tokens=1_000_000, **NO_EOS)
    assert wait_until(lambda: len(llm.in_flight) == 2, 30)
    time.sleep(0.3)
    report = llm.unload_model(drain_timeout=15)
    for t in threads:
        t.join(15)
    assert {e.reason for e in errors if isinstance(e, GenerationCancelledError)} == {"model_eject"}
    assert len(errors) == 2 and report.stopped_requests == 2
    assert report.memory_before is not None and report.memory_after is not None
    assert report.memory_before > report.memory_after
    errors.clear()
    gc.collect()
    assert mx.get_active_memory() - baseline < 16 * 1024, (mx.get_active_memory(), baseline)
    llm.close()


def test_what_the_vision_lane_refuses(llava_dir: Path, tiny_dir: Path, png: bytes) -> None:
    with create_llm("mlx", str(llava_dir)) as llm, pytest.raises(NotSupportedError, match="never fetches"):
        llm.generate(messages=look_at_url())
    with pytest.raises(ValueError, match="one request at a time"):
        create_llm("mlx", str(llava_dir), max_batch_size=4)
    with create_llm("mlx", str(tiny_dir)) as text, pytest.raises(NotSupportedError, match="vision_config"):
        text.generate(messages=look(png))


def look_at_url() -> list[Any]:
    return [{"role": "user", "content": [image_part("https://example.com/cat.png")]}]


def test_a_vision_model_without_mlx_vlm_names_the_extra(llava_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlx_vlm" else real(name, *a))
    with pytest.raises(NotSupportedError, match=r"abstract-client\[vlm\]"):
        create_llm("mlx", str(llava_dir))


def test_gateway_disconnects_stop_the_vision_engine(llava_dir: Path, png: bytes) -> None:
    """In front of the vision lane, a client that leaves a stream — or a non-streaming request —
    stops the engine within a token (mlx_lm.server never stops the non-streaming one)."""
    from abstract_client.gateway import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    options = {"prefill_step_size": STEP}
    config = GatewayConfig(
        backends=[BackendConfig(name="llava", provider="mlx", model=str(llava_dir), options=options)]
    )
    with InProcessGateway(config) as gw:
        provider = engine(gw.gateway.backends["llava"].llm)
        body = {"model": "llava", "messages": look(png), "max_tokens": 100_000, "stream": True, **NO_EOS}
        received = 0
        with httpx.stream(
            "POST", gw.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "gw-stream"}, timeout=60
        ) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                received += line.startswith("data: ")
                if received == 5:
                    break
        assert provider.thread.wait_idle(15)
        stats = provider.stats("gw-stream")
        assert stats is not None and stats.stopped_in == "decode" and stats.tokens_at_stop == stats.tokens
        assert received <= stats.tokens < 100_000

        body["stream"] = False
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "gw-whole"}, timeout=1.5)
        assert wait_until(lambda: (provider.stats("gw-whole") or stats).stopped_in == "decode", 15)
        assert provider.thread.wait_idle(15)
        whole = provider.stats("gw-whole")
        assert whole is not None and not whole.finished and whole.tokens < 100_000
