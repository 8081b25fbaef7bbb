"""Lane-specific behaviour of ollama and lmstudio: wire mapping (respx), models, eject, and
where each server's stop takes effect (fake servers on real sockets)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
import respx

from abstract_client import (
    LLM,
    AbortController,
    GenerationCancelledError,
    ModelNotFoundError,
    ProviderAPIError,
    create_llm,
)
from abstract_client.testing import FakeLMStudioServer, FakeOllamaServer, FakeServer

from .helpers import press_when, stream_in_threads, wait_until

OLLAMA = "http://ollama.test"
LMS = "http://lmstudio.test"


def ndjson(*objs: object) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


# -- Ollama wire mapping ------------------------------------------------------------------------


@respx.mock
def test_ollama_chat_body_options_and_final_mapping() -> None:
    route = respx.post(f"{OLLAMA}/api/chat").mock(
        return_value=httpx.Response(
            200,
            content=ndjson(
                {"model": "m", "message": {"role": "assistant", "content": "Par"}, "done": False},
                {"model": "m", "message": {"role": "assistant", "content": "is"}, "done": False},
                {
                    "model": "m",
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    "done_reason": "stop",
                    "total_duration": 9_000_000,
                    "prompt_eval_count": 10,
                    "prompt_eval_duration": 2_000_000,
                    "eval_count": 2,
                    "eval_duration": 4_000_000,
                },
            ),
            headers={"content-type": "application/x-ndjson"},
        )
    )
    with (
        create_llm("ollama", "m", base_url=OLLAMA) as llm,
        llm.stream(
            "capital?", max_tokens=5, temperature=0, seed=1, stop=["\n"], num_ctx=2048, keep_alive="10m"
        ) as stream,
    ):
        assert "".join(c.delta for c in stream) == "Paris"
    sent = json.loads(route.calls.last.request.content)
    assert sent["stream"] is True and sent["keep_alive"] == "10m"
    assert sent["options"] == {"num_predict": 5, "temperature": 0, "seed": 1, "stop": ["\n"], "num_ctx": 2048}
    result = stream.result()
    assert result.finish_reason == "stop"
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (10, 2)
    assert result.timings.prompt_ms == 2.0 and result.timings.predicted_ms == 4.0
    assert result.timings.tokens_per_s == 500.0


@respx.mock
def test_ollama_stream_false_is_sent_explicitly_and_raw_uses_generate() -> None:
    """With ``plain_route=True`` (by default a non-streaming call rides the NDJSON stream)."""
    chat = respx.post(f"{OLLAMA}/api/chat").mock(
        return_value=httpx.Response(
            200,
            json={"model": "m", "message": {"content": "hi"}, "done": True, "done_reason": "length", "eval_count": 1},
        )
    )
    gen = respx.post(f"{OLLAMA}/api/generate").mock(
        return_value=httpx.Response(200, json={"model": "m", "response": "raw!", "done": True, "done_reason": "stop"})
    )
    with create_llm("ollama", "m", base_url=OLLAMA) as llm:
        assert llm.generate("x", plain_route=True).finish_reason == "length"
        assert json.loads(chat.calls.last.request.content)["stream"] is False
        assert llm.generate("Once upon", raw=True, plain_route=True).content == "raw!"
        assert json.loads(gen.calls.last.request.content) == {
            "model": "m",
            "stream": False,
            "prompt": "Once upon",
            "raw": True,
        }


@respx.mock
def test_ollama_error_line_under_200_keeps_partial_text() -> None:
    respx.post(f"{OLLAMA}/api/chat").mock(
        return_value=httpx.Response(
            200,
            content=ndjson(
                {"message": {"content": "so "}, "done": False},
                {"message": {"content": "far"}, "done": False},
                {"error": "an error was encountered while running the model"},
            ),
        )
    )
    with create_llm("ollama", "m", base_url=OLLAMA, max_retries=3) as llm, pytest.raises(ProviderAPIError) as info:
        list(llm.stream("x"))
    assert info.value.partial_text == "so far"
    assert len(respx.calls) == 1  # a mid-stream error is not retried


@respx.mock
def test_ollama_unknown_model_and_openai_route() -> None:
    respx.post(f"{OLLAMA}/api/chat").mock(return_value=httpx.Response(404, json={"error": "model 'x' not found"}))
    v1 = respx.post(f"{OLLAMA}/v1/chat/completions").mock(
        return_value=httpx.Response(
            200, json={"choices": [{"message": {"content": "via v1"}, "finish_reason": "stop"}]}
        )
    )
    with create_llm("ollama", "x", base_url=OLLAMA) as llm, pytest.raises(ModelNotFoundError):
        llm.generate("x")
    with create_llm("ollama", "x", base_url=OLLAMA, use_openai_api=True) as llm:
        assert llm.generate("x", plain_route=True).content == "via v1"
    assert v1.called


def test_ollama_models_load_unload_against_the_fake() -> None:
    with FakeOllamaServer(models={"fake-model": False, "other": True}) as server:
        with create_llm("ollama", "fake-model", base_url=server.base_url) as llm:
            llm.wait_ready(5)
            assert {m.id: m.loaded for m in llm.list_models()} == {"fake-model": False, "other": True}
            llm.load_model()
            assert server.behavior.models["fake-model"] is True
            body = server.requests("/api/chat")[-1].body
            assert body == {"model": "fake-model", "messages": [], "stream": False}
            report = llm.unload_model()
            assert report.server_unloaded and server.behavior.models["fake-model"] is False
            assert server.requests("/api/chat")[-1].body["keep_alive"] == 0
            assert server.requests("/api/ps")  # it polled until the model was gone


def test_ollama_eject_stops_our_requests_first_then_unloads() -> None:
    """Ollama would keep the model until in-flight requests finish: we stop ours first."""
    with (
        FakeOllamaServer(token_delay=0.02) as server,
        create_llm("ollama", "fake-model", base_url=server.base_url) as llm,
    ):
        threads, errors = stream_in_threads(llm, 3, max_tokens=10_000)
        assert wait_until(lambda: len(llm.in_flight) == 3)
        t0 = time.perf_counter()
        report = llm.unload_model(drain_timeout=5)
        for t in threads:
            t.join(5)
        assert time.perf_counter() - t0 < 3
        assert report.stopped_requests == 3 and report.server_unloaded
        assert all(isinstance(e, GenerationCancelledError) and e.reason == "model_eject" for e in errors)
        assert server.behavior.models["fake-model"] is False
        assert llm.generate("again", max_tokens=2).content  # Ollama loads on demand


def test_ollama_pre_030_finishes_the_prompt_before_noticing() -> None:
    with (
        FakeOllamaServer(prefill_delay=1.0, finish_prompt_before_disconnect=True) as server,
        create_llm("ollama", "fake-model", base_url=server.base_url) as llm,
    ):
        controller = AbortController()
        press = press_when(lambda: server.requests("/api/chat"), controller.abort)  # during the prompt
        with pytest.raises(GenerationCancelledError):
            llm.generate("x", signal=controller.signal)
        assert time.perf_counter() - press.wait() < 0.7  # the caller gets the stop at once
        record = server.last
        seen = server.wait_for_disconnect(record)
        assert seen - record.received_at >= 0.95  # ...the server noticed only after the 1 s prompt
        assert record.tokens_sent == 0


# -- LM Studio -------------------------------------------------------------------------------


@respx.mock
def test_lmstudio_unknown_route_answers_200_with_error() -> None:
    respx.post(f"{LMS}/v1/chat/completions").mock(
        return_value=httpx.Response(200, json={"error": "Unexpected endpoint or method. (POST /v1/chat/completions)"})
    )
    with create_llm("lmstudio", "m", base_url=LMS) as llm, pytest.raises(ProviderAPIError) as info:
        llm.generate("x")
    assert "Unexpected endpoint" in info.value.message


def test_lmstudio_no_models_loaded_is_typed() -> None:
    with (
        FakeLMStudioServer(jit=False, models={"fake-model": False}) as server,
        create_llm("lmstudio", "fake-model", base_url=server.base_url) as llm,
        pytest.raises(ModelNotFoundError) as info,
    ):
        llm.generate("x")
    assert "No models loaded" in info.value.message


def test_lmstudio_unknown_model_is_typed() -> None:
    with (
        FakeLMStudioServer() as server,
        create_llm("lmstudio", "nope", base_url=server.base_url) as llm,
        pytest.raises(ModelNotFoundError),
    ):
        llm.generate("x")


def test_lmstudio_native_chat_events_and_reasoning() -> None:
    with (
        FakeLMStudioServer(answer="Paris is the capital.") as server,
        create_llm("lmstudio", "fake-model", base_url=server.base_url) as llm,
    ):
        with llm.stream("capital?", reasoning=True) as stream:
            chunks = list(stream)
        assert "".join(c.delta for c in chunks) == "Paris is the capital."
        assert "".join(c.reasoning for c in chunks) == "Let me think. "  # reasoning.delta, never content
        result = stream.result()
        assert result.usage is not None and result.usage.completion_tokens == 4
        assert server.last.path == "/api/v1/chat"
        native = llm.generate("capital?", native=True, system="short")
        assert native.content == "Paris is the capital." and native.timings.tokens_per_s
        assert server.last.body["system_prompt"] == "short"


def test_lmstudio_load_lists_first_and_unload_uses_instance_ids() -> None:
    with (
        FakeLMStudioServer(models={"fake-model": True}) as server,
        create_llm("lmstudio", "fake-model", base_url=server.base_url) as llm,
    ):
        llm.load_model()  # already loaded: no second instance
        assert server.load_calls == 0
        report = llm.unload_model()
        assert report.server_unloaded and report.extra["instances"] == ["fake-model"]
        assert server.requests("/api/v1/models/unload")[-1].body == {"instance_id": "fake-model"}
        llm.load_model()
        assert server.load_calls == 1 and server.is_loaded("fake-model")


def test_lmstudio_model_unloaded_racing_our_eject_is_the_stop() -> None:
    """The eject stops our stream; the server's 'Model unloaded' error that may race it is the
    stop (model_eject): not retried, no reload."""
    with (
        FakeLMStudioServer(token_delay=0.02) as server,
        create_llm("lmstudio", "fake-model", base_url=server.base_url, max_retries=3) as llm,
    ):
        (thread,), errors = stream_in_threads(llm, 1, max_tokens=10_000)
        assert wait_until(lambda: bool(server.records) and server.last.tokens_sent > 3)
        llm.unload_model(drain_timeout=5)
        thread.join(5)
        assert len(errors) == 1 and isinstance(errors[0], GenerationCancelledError)
        assert errors[0].reason == "model_eject"
        assert len(server.requests("/v1/chat/completions")) == 1  # never retried
        assert server.load_calls == 0  # never triggered a reload


def test_lmstudio_unload_by_someone_else_is_a_typed_error_not_retried() -> None:
    with (
        FakeLMStudioServer(token_delay=0.02, jit=False) as server,
        create_llm("lmstudio", "fake-model", base_url=server.base_url, max_retries=3) as llm,
    ):
        stream = llm.stream("x", max_tokens=10_000)
        next(stream)
        httpx.post(f"{server.url}/api/v1/models/unload", json={"instance_id": "fake-model"})
        with pytest.raises(ProviderAPIError) as info:
            list(stream)
        assert "Model unloaded" in info.value.message and info.value.partial_text
        assert len(server.requests("/v1/chat/completions")) == 1


def test_lmstudio_finishes_the_prompt_before_it_stops() -> None:
    with (
        FakeLMStudioServer(prefill_delay=1.0) as server,
        create_llm("lmstudio", "fake-model", base_url=server.base_url) as llm,
    ):
        event = threading.Event()
        press = press_when(lambda: server.requests(), event.set)  # during the prompt
        with pytest.raises(GenerationCancelledError):
            list(llm.stream("x", cancel_event=event))
        assert time.perf_counter() - press.wait() < 0.7  # returns to the caller at once
        record = server.last
        seen = server.wait_for_disconnect(record)
        assert seen - record.received_at >= 0.95 and record.tokens_sent == 0  # server stopped after the prompt


@pytest.mark.parametrize("fake", [FakeOllamaServer, FakeLMStudioServer])
def test_fake_sees_the_stop_within_50_ms(fake: type) -> None:
    with (
        fake(finish_prompt_before_disconnect=False, token_delay=0.01) as server,
        create_llm("ollama" if fake is FakeOllamaServer else "lmstudio", "fake-model", base_url=server.base_url) as llm,
    ):
        for use_signal in (False, True):
            controller, event = AbortController(), threading.Event()
            kwargs = {"signal": controller.signal} if use_signal else {"cancel_event": event}
            with pytest.raises(GenerationCancelledError):
                for i, _ in enumerate(llm.stream("x", max_tokens=10_000, **kwargs)):
                    if i == 5:
                        t0 = time.perf_counter()
                        controller.abort() if use_signal else event.set()
            seen = server.wait_for_disconnect(server.last)
            assert (seen - t0) < 0.050, f"server saw the stop {(seen - t0) * 1000:.1f} ms after it"


def test_ollama_show_and_version() -> None:
    with FakeOllamaServer() as server, create_llm("ollama", "fake-model", base_url=server.base_url) as llm:
        provider = llm.provider
        assert anyio_run(provider.version) == "0.33.0"  # type: ignore[attr-defined]
        assert anyio_run(provider.show)["capabilities"] == ["completion"]  # type: ignore[attr-defined]


def anyio_run(fn):  # type: ignore[no-untyped-def]
    import anyio

    return anyio.run(fn)


@respx.mock
def test_llamacpp_router_mode_load_and_unload() -> None:
    base = "http://router.test"
    state = {"value": "unloaded"}

    def models(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"id": "smollm2", "status": {"value": state["value"]}}]})

    def load(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content) == {"model": "smollm2"}
        state["value"] = "loaded"
        return httpx.Response(200, json={"success": True})

    def unload(request: httpx.Request) -> httpx.Response:
        state["value"] = "unloaded"
        return httpx.Response(200, json={"success": True})

    respx.get(f"{base}/models").mock(side_effect=models)
    respx.post(f"{base}/models/load").mock(side_effect=load)
    respx.post(f"{base}/models/unload").mock(side_effect=unload)
    with create_llm("llamacpp", "smollm2", base_url=base) as llm:
        assert [(m.id, m.loaded) for m in llm.list_models()] == [("smollm2", False)]
        llm.load_model()
        assert state["value"] == "loaded"
        report = llm.unload_model()
        assert report.server_unloaded and state["value"] == "unloaded"


def _fields(result: Any) -> tuple[Any, ...]:
    t = result.timings
    server_timings = tuple(v is not None for v in (t.prompt_ms, t.predicted_ms, t.tokens_per_s))
    return result.content, result.finish_reason, result.usage, result.model, server_timings


@pytest.mark.parametrize("raw", [False, True], ids=["chat", "raw"])
def test_non_streaming_over_the_stream_equals_the_plain_answer(server: FakeServer, llm: LLM, raw: bool) -> None:
    """The same ``GenerateResult`` fields whether a non-streaming call rides the streaming wire
    (the default where the server streams) or the plain route (``plain_route=True``)."""
    kwargs: dict[str, Any] = {"max_tokens": 7, "raw": True} if raw else {"max_tokens": 7}
    over_stream = llm.generate("Once upon", **kwargs)
    plain = llm.generate("Once upon", plain_route=True, **kwargs)
    assert _fields(over_stream) == _fields(plain)
    assert over_stream.content == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 "
    bodies = [r.body for r in server.records if isinstance(r.body, dict) and "stream" in r.body]
    assert [b["stream"] for b in bodies[-2:]] == [llm.provider.complete_over_stream, False]
