"""The stop token: every way a host can say "stop" becomes one ``StopToken`` per request.

Sources (``threading.Event``, ``AbortSignal``, ``cancel(request_id)``, eject, a consumer that
leaves a stream) all call :meth:`StopToken.stop`, which runs the registered hooks synchronously
in the stopping thread, once, in :class:`Step` order (wake a sync caller, tell the server, hand
off, sever the socket, the loop's work). In-process engines register nothing: their worker
reads ``is_set`` before every token and between prefill chunks.

The :class:`InflightRegistry` knows every call an ``LLM`` has in flight, so ``cancel(id)``,
``cancel_all()`` and ``unload_model()`` can reach them, and it lets an eject wait for them to drain.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import cast

import anyio

from ..errors import StopReason
from .abort import AbortSignal
from .event_hook import on_set
from .loop import on_event_loop

__all__ = ["Hook", "InflightRegistry", "Step", "StopToken", "reason_from_signal"]

log = logging.getLogger(__name__)

Hook = Callable[[], object]


class Step(enum.IntEnum):
    """What a stop does, in this order, in the thread that requested it (:meth:`StopToken.stop`):

    1. ``WAKE``: a sync caller blocked on the call is woken; it raises the stop itself, without
       waiting for the event loop (``_sync.Portal``).
    2. ``TELL``: the server is told: ``shutdown(SHUT_WR)`` on the call's socket sends our FIN,
       which is what makes llama-server, vLLM, Ollama and LM Studio stop decoding
       (``http.guard.SocketGuard.tell_server``). The syscall drops the GIL: the woken caller runs.
    3. ``HAND_OFF``: the stopping thread waits, at most ``_sync.HANDOFF_S`` (2 ms), for that caller
       to raise, so that the next steps, which wake the loop thread, do not take the GIL from it
       (``_sync.Portal``; skipped from the caller's own thread or an event loop).
    4. ``SEVER``: our side is shut (``shutdown(SHUT_RDWR)``): a read blocked on the socket wakes
       with EOF, on any event loop or none (``SocketGuard.sever``).
    5. ``LOOP``: the event loop's share: the call's cancel scope is cancelled (``contract.scope``),
       an in-process engine's flag is read by its worker before the next token.

    Hooks of one step run in the order they were added; a hook that raises is logged and the
    others still run.
    """

    WAKE = 0
    TELL = 1
    HAND_OFF = 2
    SEVER = 3
    LOOP = 4


_REASONS = ("user", "timeout", "model_eject", "shutdown")


def reason_from_signal(reason: object) -> StopReason:
    """A stop reason from an ``AbortSignal``'s reason: ``timeout`` for a ``TimeoutError``, a known
    reason as it is, else ``user``."""
    if isinstance(reason, TimeoutError):
        return "timeout"
    if isinstance(reason, str) and reason in _REASONS:
        return cast(StopReason, reason)
    return "user"


class StopToken:
    """One request's stop. Set once, from any thread."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._lock = threading.Lock()
        self._hooks: list[tuple[Step, Hook]] = []  # kept in Step order
        self._unbinds: list[Callable[[], None]] = []
        self.reason: StopReason | None = None
        self.signal_reason: object = None
        self.stopped_at: float | None = None  # time.perf_counter() when the stop was requested
        self.internal = False  # set for stops that are not the user's (a consumer leaving a stream)
        self._sources: tuple[threading.Event | None, AbortSignal | None] = (None, None)

    def __repr__(self) -> str:
        return f"<StopToken {self.request_id} reason={self.reason}>"

    @property
    def is_set(self) -> bool:
        return self.reason is not None

    @property
    def stopped_by_caller(self) -> bool:
        """The stop is the caller's (a source, ``cancel(id)``, an eject, a deadline), not a
        consumer leaving a stream or a framework cancellation, which end the call without an
        error of ours."""
        return self.reason is not None and not self.internal

    def stop(
        self,
        reason: StopReason = "user",
        *,
        signal_reason: object = None,
        at: float | None = None,
        internal: bool = False,
    ) -> bool:
        """Request the stop; returns False if it was already requested. Runs every hook here."""
        with self._lock:
            if self.reason is not None:
                return False
            self.stopped_at = at if at is not None else time.perf_counter()
            self.signal_reason = signal_reason
            self.internal = internal
            self.reason = reason
            hooks, self._hooks = self._hooks, []
        log.debug("stop %s: %s", self.request_id, reason, extra={"request_id": self.request_id})
        for _, hook in hooks:  # in Step order: see Step
            try:
                hook()
            except Exception:
                log.exception("stop hook failed for %s", self.request_id, extra={"request_id": self.request_id})
        # From a plain thread (a UI's Stop button), hand the GIL over now: the threads the hooks
        # just woke (the event loop, a blocked sync caller) run at once instead of waiting for
        # this thread to block or for the 5 ms switch interval. On an event loop's own thread
        # that would only let unrelated threads in before the loop does the work itself.
        if not on_event_loop():
            time.sleep(0)
        return True

    def add_hook(self, hook: Hook, *, step: Step = Step.LOOP) -> Callable[[], None]:
        """Run ``hook()`` at ``step`` of the stop (see :class:`Step`), or now if the stop was
        already requested. Returns a function that removes the hook."""
        with self._lock:
            run_now = self.reason is not None
            if not run_now:
                at = len(self._hooks)
                while at and self._hooks[at - 1][0] > step:
                    at -= 1
                self._hooks.insert(at, (step, hook))
        if run_now:
            hook()

        def remove() -> None:
            with self._lock:
                for i, (_, h) in enumerate(self._hooks):
                    if h is hook:
                        del self._hooks[i]
                        break

        return remove

    @staticmethod
    def check_sources(cancel_event: object = None, signal: object = None) -> bool:
        """Validate the caller's stop sources (anything but a ``threading.Event`` /
        ``AbortSignal`` is a ``TypeError`` now, never silently ignored); True if there is one."""
        if cancel_event is not None and not isinstance(cancel_event, threading.Event):
            raise TypeError(f"cancel_event must be a threading.Event, not {type(cancel_event).__name__}")
        if signal is not None and not isinstance(signal, AbortSignal):
            raise TypeError(f"signal must be an abstract_client.AbortSignal, not {type(signal).__name__}")
        return cancel_event is not None or signal is not None

    def bind(self, cancel_event: threading.Event | None = None, signal: AbortSignal | None = None) -> None:
        """Listen to the caller's stop sources until :meth:`release`. The contract calls this at
        admission, never earlier: a call that is built but never started holds nothing."""
        self.check_sources(cancel_event, signal)
        self._sources = (cancel_event, signal)
        if signal is not None:

            def on_abort(sig: AbortSignal) -> None:
                self.stop(reason_from_signal(sig.reason), signal_reason=sig.reason, at=sig.aborted_at)

            signal.add_listener(on_abort)
            self._unbinds.append(lambda: signal.remove_listener(on_abort))
            if signal.aborted:
                on_abort(signal)
        if cancel_event is not None:
            self._unbinds.append(on_set(cancel_event, lambda: self.stop("user")))

    def requested(self) -> bool:
        """Whether the caller has asked for the stop, asking the sources themselves: an event
        set or a signal aborted whose listener has not run yet counts (and stops the token now).
        The contract's final decision (rule 7) uses this, so "a stop requested before the result
        is handed over wins" holds to the instant, not to when a listener got scheduled."""
        if self.reason is not None:
            return self.stopped_by_caller
        cancel_event, signal = self._sources
        if signal is not None and signal.aborted:
            self.stop(reason_from_signal(signal.reason), signal_reason=signal.reason, at=signal.aborted_at)
        elif cancel_event is not None and cancel_event.is_set():
            self.stop("user")
        return self.stopped_by_caller

    def release(self) -> None:
        """Detach from the caller's sources once the call is over."""
        self._sources = (None, None)
        unbinds, self._unbinds = self._unbinds, []
        for unbind in unbinds:
            unbind()
        with self._lock:
            self._hooks.clear()


class InflightRegistry:
    """The calls one ``LLM`` has in flight, by request id."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tokens: dict[str, StopToken] = {}

    def __len__(self) -> int:
        with self._cond:
            return len(self._tokens)

    def ids(self) -> list[str]:
        with self._cond:
            return list(self._tokens)

    def add(self, token: StopToken) -> None:
        with self._cond:
            if token.request_id in self._tokens:
                raise ValueError(f"request_id {token.request_id!r} is already in flight")
            self._tokens[token.request_id] = token

    def remove(self, token: StopToken) -> None:
        with self._cond:
            if self._tokens.get(token.request_id) is token:
                del self._tokens[token.request_id]
                self._cond.notify_all()

    def cancel(self, request_id: str, reason: StopReason = "user") -> bool:
        with self._cond:
            token = self._tokens.get(request_id)
        return token.stop(reason) if token is not None else False

    def cancel_all(self, reason: StopReason = "user") -> int:
        with self._cond:
            tokens = list(self._tokens.values())
        return sum(token.stop(reason) for token in tokens)

    def wait_empty(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._tokens, timeout)

    async def wait_empty_async(self, timeout: float | None) -> bool:
        # Polling keeps this free of any per-loop state; drains are rare and short.
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await anyio.sleep(0.002)
        return True
