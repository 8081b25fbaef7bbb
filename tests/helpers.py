"""Small helpers shared by tests."""

from __future__ import annotations

import importlib
import os
import socket
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


def set_later(fn: Callable[[], object], delay: float) -> threading.Thread:
    """Call ``fn`` from another thread after ``delay`` seconds (a host's Stop button)."""

    def run() -> None:
        time.sleep(delay)
        fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


class Press:
    """A Stop pressed from another thread at a point of progress, not of time: once ``ready()``
    is true (the Nth chunk, the server's record showing a request in prefill or decode). A
    machine's load moves when that comes, never whether the press lands in the phase the test is
    about. ``at`` is when it was pressed (``time.perf_counter()``)."""

    def __init__(self, ready: Callable[[], object], press: Callable[[], object], timeout: float) -> None:
        self.at: float | None = None
        self.pressed = threading.Event()  # set once ``press`` has returned
        self._ready, self._press, self._timeout = ready, press, timeout
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="press-when", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self._timeout
        try:
            while not self._done.is_set() and time.monotonic() < deadline:
                try:
                    ready = bool(self._ready())
                except Exception:  # a record not there yet, a server between answers
                    ready = False
                if ready:
                    self.at = time.perf_counter()
                    self._press()
                    self.pressed.set()
                    return
                time.sleep(0.002)
        finally:
            self._done.set()

    def cancel(self) -> None:
        self._done.set()

    def settle(self) -> float | None:
        """Stop looking and join the presser: when it pressed, or None if it never did."""
        self._done.set()
        self._thread.join()
        return self.at

    def wait(self, timeout: float | None = None) -> float:
        """Join the presser; the time it pressed (fails the test if the phase never came)."""
        self._thread.join(self._timeout if timeout is None else timeout)
        assert self.at is not None, "the phase the Stop waits for never came"
        return self.at


def press_when(ready: Callable[[], object], press: Callable[[], object], *, timeout: float = 60.0) -> Press:
    """Press ``press`` (``event.set``, ``controller.abort``, ``task.cancel``…) once ``ready()``."""
    return Press(ready, press, timeout)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def stream_in_threads(
    llm: Any, n: int, prompt: str = "x", **kwargs: Any
) -> tuple[list[threading.Thread], list[BaseException]]:
    """Start ``n`` threads that each consume ``llm.stream(prompt, **kwargs)`` to the end; every
    exception they end with is collected (in order of arrival) in the returned list."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in llm.stream(prompt, **kwargs):
                pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, errors


def launch_llama_server(tmp_path_factory: Any, name: str, **launch: Any) -> Any:
    """A real llama-server on SmolLM2 (``LlamaServer.launch`` options), or a FAILED test with
    the reason when the binary or the model is missing."""
    from abstract_client.testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        pytest.fail(
            "llama-server or the SmolLM2 GGUF is missing: run scripts/get_llama_server.sh and "
            "scripts/get_model.py (.ci/run does)"
        )
    # One thread: ggml's threads spin-wait on each other, so two of them on a 2-core machine
    # that is busy with other work crawl (a 200-token stream took 297 s beside two busy
    # processes, 9 s with one thread)
    launch.setdefault("threads", 1)
    return LlamaServer.launch(binary, model, log_path=tmp_path_factory.mktemp(name) / "server.log", **launch)


# A tool every real-engine test can force (a short string argument: quick on a 135M model).
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def require_module(name: str, extra: str) -> ModuleType:
    """Import ``name`` at the top of a test module. Missing: the module is skipped with the
    reason printed (``-ra``), except under the README's test command
    (``ABSTRACT_CLIENT_REQUIRE_ENGINES=1``), where a missing engine is a collection error."""
    if os.environ.get("ABSTRACT_CLIENT_REQUIRE_ENGINES") == "1":
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"{name} is required by the test command: pip install -e '.[{extra}]'") from exc
    return pytest.importorskip(name, reason=f"{name} is missing: pip install -e '.[{extra}]'")


def guard_of(llm: Any, request_id: str) -> Any:
    """The ``SocketGuard`` of a call in flight (its stop hooks are the guard's bound methods)."""
    from abstract_client.http.guard import SocketGuard

    token = llm._inflight._tokens[request_id]
    with token._lock:
        hooks = [hook for _, hook in token._hooks]
    return next(h.__self__ for h in hooks if isinstance(getattr(h, "__self__", None), SocketGuard))


# Linux TCP states (include/net/tcp_states.h) in which our side has sent its FIN.
FIN_SENT = {4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE", 11: "CLOSING"}


def tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of ``sock`` (``tcpi_state``, the first byte of ``struct tcp_info``).
    A ``shutdown()`` changes it before the call returns, so reading it right after a stop says
    whether the stopping thread itself severed the connection — no timing involved."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


class LoopHold:
    """A callback that holds the event loop it runs on for ``seconds`` (a loop busy with other
    work). Stops requested meanwhile must reach the server and wake a blocked sync caller
    without the loop: only the stopping thread can do that work."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = threading.Event()
        self.free_at: float | None = None  # perf_counter when the loop was let go

    def __call__(self) -> None:
        self.started.set()
        time.sleep(self.seconds)
        self.free_at = time.perf_counter()

    def wait_free(self, timeout: float = 30.0) -> float:
        assert wait_until(lambda: self.free_at is not None, timeout), "the held loop never ran the hold"
        assert self.free_at is not None
        return self.free_at


def needs_module(name: str, extra: str) -> pytest.MarkDecorator:
    """A marker for the tests of a module that also holds tests of other lanes: skipped (reason
    printed) when ``name`` is missing; under the README's test command
    (``ABSTRACT_CLIENT_REQUIRE_ENGINES=1``) never skipped, so a missing engine fails them."""
    import importlib.util

    missing = (
        os.environ.get("ABSTRACT_CLIENT_REQUIRE_ENGINES") != "1"
        and importlib.util.find_spec(name.split(".")[0]) is None
    )
    return pytest.mark.skipif(missing, reason=f"{name} is missing: pip install -e '.[{extra}]'")


needs_mlx = needs_module("mlx.core", "mlx")
needs_transformers = needs_module("transformers", "transformers")
needs_gguf = needs_module("llama_cpp", "gguf")


HOLD_S = 8.0  # how long HeldFlag holds the engine's first read of a raised flag, at most


class HeldFlag:
    """Holds the engine thread's first read of a raised stop flag (at most ``HOLD_S``), so the
    drain cannot finish before the test lets it go. Reads from any other thread are untouched."""

    def __init__(self, engine_thread: Callable[[], int | None]) -> None:
        from abstract_client.stopping.token import StopToken

        self._engine_thread = engine_thread
        self.reached = threading.Event()  # the engine read the raised flag
        self.release = threading.Event()
        self.expired = threading.Event()  # nobody let it go within HOLD_S
        self._original = StopToken.__dict__["is_set"]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from abstract_client.stopping.token import StopToken

        original = self._original

        def is_set(token: StopToken) -> bool:
            value = bool(original.__get__(token, StopToken))
            if value and threading.get_ident() == self._engine_thread() and not self.reached.is_set():
                self.reached.set()
                if not self.release.wait(HOLD_S):
                    self.expired.set()
            return value

        monkeypatch.setattr(StopToken, "is_set", property(is_set))


def loop_settled(llm: Any, timeout: float = 10.0) -> bool:
    """The sync API's loop has nothing left of a call: what unwinds behind a raised stop (the
    abandoned step, the release of the call's sources) is done. ``in_flight`` says nothing about
    it: a sync caller's stop leaves the list the moment it raises."""
    import asyncio

    portal = llm._portal
    if not portal.running:
        return True

    async def others() -> int:
        return len(asyncio.all_tasks()) - 1  # every task but this one

    def settled() -> bool:
        return asyncio.run_coroutine_threadsafe(others(), portal.loop).result(timeout) == 0

    return wait_until(settled, timeout, interval=0.01)
