"""``wire="responses"``: the same calls over the OpenAI Responses API (``POST /v1/responses``),
on each HTTP lane's protocol-faithful fake (real loopback sockets): the request it sends, the
answer it maps (text, reasoning, tool calls, structured output, usage), and the same stop
contract — proven by the fake server's disconnect record."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from abstract_client import (
    LLM,
    AbortController,
    GenerationCancelledError,
    NotSupportedError,
    ProviderAPIError,
    ProviderProtocolError,
    TransportError,
    create_llm,
)
from abstract_client.testing import FakeOpenAIServer, FakeServer
from abstract_client.testing._server import Conn, Handler, RequestRecord

from .conftest import LANES
from .helpers import WEATHER_TOOL, press_when, wait_until

SERVER_SEES_EOF_S = 2.0  # generous: a shared 2-core machine


@pytest.fixture(params=list(LANES))
def fake(request: pytest.FixtureRequest) -> Iterator[tuple[str, FakeServer]]:
    with LANES[request.param](finish_prompt_before_disconnect=False) as srv:
        yield request.param, srv


@pytest.fixture
def rllm(fake: tuple[str, FakeServer]) -> Iterator[LLM]:
    lane, srv = fake
    client = create_llm(lane, "fake-model", base_url=srv.base_url, max_retries=0, wire="responses")
    yield client
    client.close()


def _server(fake: tuple[str, FakeServer]) -> FakeServer:
    return fake[1]


def test_the_request_is_the_responses_form_of_the_call(fake: tuple[str, FakeServer], rllm: LLM) -> None:
    server = _server(fake)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    rllm.generate(
        messages=messages,
        max_tokens=3,
        temperature=0.0,
        seed=7,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        reasoning="low",
        plain_route=True,
    )
    record = server.requests("/v1/responses")[-1]
    body = record.body
    assert body["input"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert body["max_output_tokens"] == 3 and body["temperature"] == 0.0 and body["seed"] == 7
    assert body["tools"] == [{"type": "function", **WEATHER_TOOL["function"]}]
    assert body["tool_choice"] == "auto"
    assert body["reasoning"] == {"effort": "low"}
    assert body["stream"] is False and body["store"] is False
    assert "messages" not in body and server.requests("/v1/chat/completions") == []


def test_a_named_tool_choice_is_the_flat_form() -> None:
    """(Ollama and LM Studio force a named call as structured output: tests/test_tools_structured.py.)"""
    with (
        LANES["openai-compatible"]() as server,
        create_llm("openai-compatible", "fake-model", base_url=server.base_url, wire="responses") as rllm,
    ):
        _named_call(server, rllm)


def _named_call(server: FakeServer, rllm: LLM) -> None:
    server.behavior.script = [{"tool": 0, "id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    result = rllm.generate("x", tools=[WEATHER_TOOL], tool_choice=named)
    assert result.tool_calls and result.tool_calls[0].arguments == {"city": "Paris"}
    assert server.requests("/v1/responses")[-1].body["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_structured_output_is_text_format(fake: tuple[str, FakeServer], rllm: LLM) -> None:
    server = _server(fake)
    server.behavior.answer = '{"city": "Paris"}'
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    result = rllm.generate("Where?", response_format=schema)
    assert result.parsed == {"city": "Paris"}
    body = server.requests("/v1/responses")[-1].body
    assert body["text"] == {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "whole"])
def test_text_usage_and_finish_reason(rllm: LLM, streaming: bool) -> None:
    if streaming:
        chunks = list(rllm.stream("one two three", max_tokens=4))
        text = "".join(c.delta for c in chunks)
        finish, usage = chunks[-1].finish_reason, chunks[-1].usage
    else:
        result = rllm.generate("one two three", max_tokens=4, plain_route=True)
        text, finish, usage = result.content, result.finish_reason, result.usage
    assert text == "tok0 tok1 tok2 tok3 "
    assert finish == "length"  # status "incomplete", reason max_output_tokens
    assert usage is not None and usage.prompt_tokens == 3 and usage.completion_tokens == 4


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "whole"])
def test_reasoning_and_tool_calls_map_as_on_the_chat_wire(
    fake: tuple[str, FakeServer], rllm: LLM, streaming: bool
) -> None:
    server = _server(fake)
    server.behavior.script = [
        {"reasoning": "Need "},
        {"reasoning": "weather."},
        {"tool": 0, "id": "call_a", "name": "get_weather", "arguments": '{"city": '},
        {"tool": 0, "arguments": '"Paris"}'},
    ]
    options: dict[str, Any] = {"tools": [WEATHER_TOOL], "tool_choice": "auto"}
    if streaming:
        chunks = list(rllm.stream("weather?", **options))
        reasoning = "".join(c.reasoning for c in chunks)
        calls, finish = chunks[-1].tool_calls, chunks[-1].finish_reason
    else:
        result = rllm.generate("weather?", plain_route=True, **options)
        reasoning, calls, finish = result.reasoning, result.tool_calls, result.finish_reason
    assert reasoning == "Need weather."
    assert finish == "tool_calls"
    assert calls is not None and [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_a", "get_weather", {"city": "Paris"})
    ]


def test_a_stop_mid_stream_is_the_stop_and_the_server_sees_it(fake: tuple[str, FakeServer], rllm: LLM) -> None:
    server = _server(fake)
    server.behavior.token_delay = 0.01
    event = threading.Event()
    text = ""
    pressed = 0.0
    with pytest.raises(GenerationCancelledError) as info:
        for chunk in rllm.stream("x", max_tokens=100_000, cancel_event=event):
            text += chunk.delta
            if text.count("tok") == 5:
                pressed = time.perf_counter()
                event.set()
    record = server.requests("/v1/responses")[-1]
    seen = server.wait_for_disconnect(record)
    assert info.value.reason == "user"
    assert info.value.partial_text.startswith(text) and text.count("tok") == 5
    assert seen - pressed < SERVER_SEES_EOF_S
    assert record.tokens_sent < 100_000
    assert rllm.in_flight == []


def test_a_stop_of_a_whole_answer_is_the_stop(fake: tuple[str, FakeServer], rllm: LLM) -> None:
    server = _server(fake)
    server.behavior.prefill_delay = 30  # the server is "processing the prompt"
    event = threading.Event()
    press = press_when(lambda: server.requests("/v1/responses"), event.set)  # the server holds it
    with pytest.raises(GenerationCancelledError):
        rllm.generate("x", cancel_event=event, plain_route=True)
    server.wait_for_disconnect(server.requests("/v1/responses")[-1])
    press.wait()


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("drop", TransportError),
        ("close_without_done", ProviderProtocolError),
        ("malformed_frame", ProviderProtocolError),
        ("error_on_200", ProviderAPIError),
    ],
)
def test_stream_faults_are_typed_and_keep_the_partial_text(
    fake: tuple[str, FakeServer], rllm: LLM, fault: str, error: type
) -> None:
    server = _server(fake)
    server.behavior.fail_after_tokens = 3
    server.inject(fault)
    with pytest.raises(error) as info:
        list(rllm.stream("x", max_tokens=20))
    assert type(info.value) is error
    assert info.value.partial_text == "tok0 tok1 tok2 "
    assert rllm.generate("again", max_tokens=2).content == "tok0 tok1 "  # nothing left broken


def test_an_error_body_under_200_is_typed(fake: tuple[str, FakeServer], rllm: LLM) -> None:
    _server(fake).inject("error_on_200")
    with pytest.raises(ProviderAPIError):
        rllm.generate("x", plain_route=True)


def test_an_unknown_wire_is_refused_and_resumable_needs_a_server_that_keeps_responses(
    fake: tuple[str, FakeServer],
) -> None:
    lane, server = fake
    with pytest.raises(ValueError, match="wire must be one of"):
        create_llm(lane, "fake-model", base_url=server.base_url, wire="anthropic")  # type: ignore[arg-type]
    with create_llm(lane, "fake-model", base_url=server.base_url) as chat, pytest.raises(NotSupportedError):
        chat.generate("x", resumable=True)
    assert server.records == []


def test_ollama_and_lm_studio_take_reasoning_over_the_responses_wire() -> None:
    """Their native routes are where reasoning goes on the chat wire; the Responses wire carries it."""
    for lane in ("ollama", "lmstudio"):
        with LANES[lane]() as server, create_llm(lane, "fake-model", base_url=server.base_url, wire="responses") as lm:
            lm.generate("x", max_tokens=2, reasoning=True)
            body = server.records[-1].body
            assert server.records[-1].path == "/v1/responses", lane
            assert body["reasoning"] == {"effort": "medium"}, json.dumps(body)


class _RegistersLate(FakeOpenAIServer):
    """A Responses server whose first ``cancel`` calls come before it registered the response."""

    not_yet = 2

    def route(self, method: str, path: str) -> Handler | None:
        if method == "POST" and path.startswith("/v1/responses/") and path.endswith("/cancel"):
            return self.cancel
        return super().route(method, path)

    def cancel(self, conn: Conn, record: RequestRecord) -> None:
        if self.not_yet > 0:
            self.not_yet -= 1
            conn.send_json(404, self.error_body(404, "Response not found."))
            return
        conn.send_json(200, {"id": record.path.split("/")[3], "object": "response", "status": "cancelled"})


def test_a_background_stop_cancels_by_the_id_the_server_named_until_it_is_known() -> None:
    """On any Responses server (here the openai-compatible lane's fake): ``background`` and
    ``store`` are asked for, the id comes from ``response.created``, and a stop's cancel that
    meets a 404 (not registered yet) is sent again until the server knows the response."""
    with (
        _RegistersLate() as server,
        create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0, wire="responses") as rlm,
    ):
        server.behavior.token_delay = 0.01
        stop = threading.Event()
        with pytest.raises(GenerationCancelledError):
            for n, _ in enumerate(rlm.stream("x", max_tokens=100_000, resumable=True, cancel_event=stop)):
                if n == 5:
                    stop.set()
        (started,) = server.requests("/v1/responses")
        assert started.body["background"] is True and started.body["store"] is True
        cancel_path = f"/v1/responses/resp_{started.id}/cancel"
        assert wait_until(lambda: len(server.requests(cancel_path)) == 3, 10), [r.path for r in server.records]


def test_llama_servers_tool_call_events_name_their_item_not_its_index() -> None:
    """llama-server's /v1/responses sends no ``output_index``: an arguments delta names its call
    by ``item_id`` (its server-task.cpp); two calls stay two calls."""
    from abstract_client.wires.responses import ResponseEvents

    events = ResponseEvents()
    stream: list[dict[str, Any]] = [{"type": "response.created", "response": {"id": "resp_x", "status": "in_progress"}}]
    for n, city in enumerate(("Paris", "Rome")):
        item = {
            "id": f"fc_{n}",
            "arguments": "",
            "call_id": f"call_{n}",
            "name": "get_weather",
            "type": "function_call",
        }
        stream.append({"type": "response.output_item.added", "item": item})
        stream.append({"type": "response.function_call_arguments.delta", "delta": '{"city": ', "item_id": f"fc_{n}"})
        stream.append({"type": "response.function_call_arguments.delta", "delta": f'"{city}"}}', "item_id": f"fc_{n}"})
    stream.append({"type": "response.completed", "response": {"id": "resp_x", "status": "completed", "output": []}})
    pieces = [c.tool_call for event in stream for c in events.chunks(event) if c.tool_call is not None]
    calls: dict[int, list[str]] = {}
    for piece in pieces:
        calls.setdefault(piece.index, []).append(piece.arguments_fragment)
    assert {i: "".join(parts) for i, parts in calls.items()} == {0: '{"city": "Paris"}', 1: '{"city": "Rome"}'}
    assert [p.id for p in pieces if p.id] == ["call_0", "call_1"]
    assert events.response_id == "resp_x" and events.finished


@pytest.mark.anyio
async def test_an_async_background_stop_cancels_on_asyncio_and_trio() -> None:
    """``astream`` under a cancelled task (asyncio and trio): the same explicit cancel."""
    import anyio

    with _RegistersLate() as server:
        server.not_yet = 0
        server.behavior.token_delay = 0.01
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0, wire="responses")
        try:
            with anyio.move_on_after(30):
                async with anyio.create_task_group() as tg:

                    async def consume() -> None:
                        async with llm.astream("x", max_tokens=100_000, resumable=True) as stream:
                            async for n, _ in _enumerate(stream):
                                if n == 5:
                                    tg.cancel_scope.cancel()  # the caller's task is cancelled

                    tg.start_soon(consume)
            (started,) = server.requests("/v1/responses")
            cancel_path = f"/v1/responses/resp_{started.id}/cancel"
            assert await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: len(server.requests(cancel_path)) == 1, 10)
            )
        finally:
            await llm.aclose()


async def _enumerate(items: Any) -> Any:
    n = 0
    async for item in items:
        yield n, item
        n += 1


# -- a resume that can only continue (#48) ------------------------------------------------------


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _ReplayingServer:
    """A raw-socket Responses server for a background stream: the first connection sends the
    first events and drops; a resumed GET then does what a faulty server or proxy does
    (``mode``): ignore ``starting_after`` and replay from the start, send one event twice, or
    number no event at all."""

    def __init__(self, mode: str) -> None:
        import socket

        self.mode = mode
        self.gets: list[str] = []
        self.closed_at: list[float] = []  # silent_resume: when the client closed the resumed GET
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _event(self, n: int, kind: str, **fields: Any) -> bytes:
        event: dict[str, Any] = {"type": kind, **fields}
        if self.mode != "unnumbered":
            event["sequence_number"] = n
        return f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode()

    def _events(self) -> list[bytes]:
        created = self._event(0, "response.created", response={"id": "resp_1", "status": "in_progress"})
        words = [self._event(i, "response.output_text.delta", delta=f"w{i} ") for i in range(1, 7)]
        done = self._event(
            7, "response.completed", response={"id": "resp_1", "status": "completed", "output": [], "usage": None}
        )
        return [created, *words, done]

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                part = conn.recv(65536)
                if not part:
                    break
                head += part
            line = head.split(b"\r\n", 1)[0].decode()
            length = next(
                (int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0
            )
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += conn.recv(65536)
            start = (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            )
            events = self._events()
            if line.startswith("POST") and self.mode == "text_only_in_completed":
                output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}]
                done = self._event(
                    1, "response.completed", response={"id": "resp_1", "status": "completed", "output": output}
                )
                if json.loads(body or b"{}").get("stream") is False:  # a whole answer: JSON
                    whole = json.dumps({"id": "resp_1", "object": "response", "status": "completed", "output": output})
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                        + f"content-length: {len(whole)}\r\n\r\n{whole}".encode()
                    )
                    return
                conn.sendall(start + _chunk(events[0] + done) + b"0\r\n\r\n")
                return
            if line.startswith("POST"):  # created, w1, w2, w3: then a cut inside the body
                conn.sendall(start + _chunk(b"".join(events[:4])))
                return
            self.gets.append(line)
            if self.mode == "silent_resume":  # accepted, read, never answered: until the client closes
                conn.settimeout(20)
                try:
                    while conn.recv(65536):
                        pass
                except OSError:
                    pass
                self.closed_at.append(time.perf_counter())
                return
            if self.mode == "sends_one_twice":
                sent = [events[4], *events[4:]]
            else:  # ignores starting_after (or numbers nothing): the whole stream again
                sent = events
            conn.sendall(start + _chunk(b"".join(sent)) + b"0\r\n\r\n")

    def close(self) -> None:
        self.listener.close()


@contextlib.contextmanager
def _replaying(mode: str) -> Iterator[tuple[_ReplayingServer, LLM]]:
    """A :class:`_ReplayingServer` and the Responses-wire lane in front of it."""
    server = _ReplayingServer(mode)
    try:
        with create_llm(
            "openai-compatible", "m", base_url=f"http://127.0.0.1:{server.port}/v1", wire="responses", max_retries=0
        ) as llm:
            yield server, llm
    finally:
        server.close()


@pytest.mark.parametrize("mode", ["ignores_starting_after", "sends_one_twice"])
def test_a_resume_never_hands_out_an_event_twice(mode: str) -> None:
    with _replaying(mode) as (server, llm):
        text = "".join(c.delta for c in llm.stream("x", resumable=True, resume_timeout=10))
        assert text == "w1 w2 w3 w4 w5 w6 ", text
        assert server.gets and "starting_after=3" in server.gets[0]


def test_a_stream_whose_events_carry_no_number_is_not_resumed_but_a_typed_error() -> None:
    with _replaying("unnumbered") as (server, llm):
        with pytest.raises(TransportError) as info:
            for _ in llm.stream("x", resumable=True, resume_timeout=10):
                pass
        assert info.value.partial_text == "w1 w2 w3 "  # what came is kept, nothing replayed
        assert "sequence_number" in str(info.value)
        assert server.gets == []  # never asked: it would have replayed


@pytest.mark.parametrize("resumable", [False, True])
def test_text_that_only_the_final_response_holds_is_handed_out(resumable: bool) -> None:
    """#48: a stream whose ``response.completed`` came before any delta returned "" although
    its ``response.output`` held the text."""
    with _replaying("text_only_in_completed") as (_, llm):
        chunks = list(llm.stream("x", resumable=resumable))
        assert "".join(c.delta for c in chunks) == "hi"
        assert chunks[-1].finish_reason == "stop"
        assert llm.generate("x", resumable=resumable).content == "hi"


def test_resume_timeout_bounds_a_resume_that_is_never_answered() -> None:
    """#48: a resumed GET accepted and never answered held the caller past ``resume_timeout``
    (still waiting after 15 s with 2)."""
    with _replaying("silent_resume") as (server, llm):
        t0 = time.perf_counter()
        with pytest.raises(TransportError) as info:
            for _ in llm.stream("x", resumable=True, resume_timeout=2):
                pass
        assert time.perf_counter() - t0 < 10  # 2 s, generously
        assert info.value.partial_text == "w1 w2 w3 "
        assert wait_until(lambda: len(server.closed_at) == len(server.gets), 10), "a resumed GET was left open"


def test_a_stop_during_a_resume_closes_the_resumed_connection() -> None:
    """#48: a Stop released the caller but the resumed connection was never closed (the server
    saw no close; "Task was destroyed but it is pending" at exit)."""
    with _replaying("silent_resume") as (server, llm):
        stop = threading.Event()
        press = press_when(lambda: server.gets, stop.set)  # the resumed GET is held
        with pytest.raises(GenerationCancelledError) as info:
            for _ in llm.stream("x", resumable=True, resume_timeout=30, cancel_event=stop):
                pass
        pressed = press.wait()
        assert info.value.partial_text == "w1 w2 w3 "
        assert wait_until(lambda: server.closed_at, 10), "the resumed connection was never closed"
        assert server.closed_at[0] - pressed < 5


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_an_async_stop_during_a_resume_severs_the_resumed_connection(anyio_backend: str) -> None:
    server = _ReplayingServer("silent_resume")
    try:
        async with create_llm(
            "openai-compatible", "m", base_url=f"http://127.0.0.1:{server.port}/v1", wire="responses", max_retries=0
        ) as llm:
            controller = AbortController()
            press = press_when(lambda: server.gets, controller.abort)  # the resumed GET is held
            with pytest.raises(GenerationCancelledError):
                async with llm.astream("x", resumable=True, resume_timeout=30, signal=controller.signal) as stream:
                    async for _ in stream:
                        pass
            pressed = press.wait()
            # the server's thread sees the close a moment after the call raised (CI, loaded: not yet)
            with anyio.move_on_after(10):
                while not server.closed_at:
                    await anyio.sleep(0.005)
            assert server.closed_at, "the resumed connection was not severed"
            assert server.closed_at[0] - pressed < 5
    finally:
        server.close()


def test_a_stop_severs_the_resumed_connection_while_the_loop_is_busy() -> None:
    """The resumed connection is the call's, like the first: a stop severs it from the stopping
    thread, so the server sees the close even while the event loop is held by other work (a
    connection no guard holds would close only once the loop could clean it up)."""
    from .helpers import HOLD_S, LoopHold

    with _replaying("silent_resume") as (server, llm):
        stop = threading.Event()
        hold = LoopHold(HOLD_S)

        def press() -> None:
            llm._portal.loop.call_soon_threadsafe(hold)  # type: ignore[attr-defined]
            assert hold.started.wait(10)
            stop.set()

        presser = press_when(lambda: server.gets, press)  # the resumed GET is held
        with pytest.raises(GenerationCancelledError):
            for _ in llm.stream("x", resumable=True, resume_timeout=30, cancel_event=stop):
                pass
        pressed = presser.wait()
        assert wait_until(lambda: server.closed_at, 5), "the resumed connection was not severed"
        free_at = hold.wait_free()
        assert server.closed_at[0] < free_at, "closed only once the loop was free: not severed"
        assert server.closed_at[0] - pressed < 2
