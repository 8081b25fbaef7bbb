"""``AbortController`` / ``AbortSignal``, modelled on the DOM.

Thread-safe: ``abort()`` may be called from any thread; listeners run synchronously, once, in the
aborting thread (which is what lets a stop sever a socket without any thread hop). A signal can be
waited on from threads (``wait``) and from asyncio or trio code (``await wait_async()``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import anyio

from ..errors import AbortError
from .loop import loop_caller
from .timer import watcher

log = logging.getLogger(__name__)

Listener = Callable[["AbortSignal"], object]

__all__ = ["AbortController", "AbortSignal"]


class AbortSignal:
    """Becomes aborted once, with a ``reason``. Create one through an :class:`AbortController`,
    :meth:`timeout` or :meth:`any`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._reason: object = None
        self._listeners: list[Listener] = []
        self.aborted_at: float | None = None  # time.perf_counter() of the abort

    def __repr__(self) -> str:
        return f"<AbortSignal aborted={self.aborted} reason={self._reason!r}>"

    @property
    def aborted(self) -> bool:
        """Whether the signal has aborted."""
        return self._event.is_set()

    @property
    def reason(self) -> object:
        """Why it aborted (an :class:`AbortError` by default; ``TimeoutError`` for a timeout)."""
        return self._reason

    def throw_if_aborted(self) -> None:
        """Raise the abort's reason if the signal has aborted."""
        if not self.aborted:
            return
        if isinstance(self._reason, BaseException):
            raise self._reason
        raise AbortError(f"aborted: {self._reason!r}")

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(signal)`` when the signal aborts. As in the DOM, a listener added to an
        already-aborted signal is not called: check ``aborted`` first."""
        with self._lock:
            if not self._event.is_set():
                self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        """Forget a listener (a no-op if it is not there, or already ran)."""
        with self._lock:
            try:
                self._listeners.remove(fn)
            except ValueError:
                pass

    def wait(self, timeout: float | None = None) -> bool:
        """Block the calling thread until aborted (or ``timeout``); return ``aborted``."""
        return self._event.wait(timeout)

    async def wait_async(self) -> None:
        """Wait in asyncio or trio code until the signal aborts."""
        if self.aborted:
            return
        event = anyio.Event()
        call = loop_caller()

        def on_abort(_: AbortSignal) -> None:
            call(event.set)

        self.add_listener(on_abort)
        try:
            if not self.aborted:
                await event.wait()
        finally:
            self.remove_listener(on_abort)

    def _abort(self, reason: object) -> bool:
        with self._lock:
            if self._event.is_set():
                return False
            self._reason = reason
            # Flag first, then the time: whoever reads a time has a flag that is already up (a
            # result completed after ``aborted_at`` really was judged complete before the abort).
            self._event.set()
            self.aborted_at = time.perf_counter()
            listeners, self._listeners = self._listeners, []
        for fn in listeners:
            try:
                fn(self)
            except Exception:  # one broken listener must not keep the others from stopping
                log.exception("AbortSignal listener failed")
        return True

    @staticmethod
    def abort(reason: object = None) -> AbortSignal:
        """An already-aborted signal."""
        signal = AbortSignal()
        signal._abort(AbortError("signal is aborted without reason") if reason is None else reason)
        return signal

    @staticmethod
    def timeout(seconds: float) -> AbortSignal:
        """A signal that aborts by itself after ``seconds`` with a ``TimeoutError`` reason
        (a generation stopped by it raises ``GenerationCancelledError(reason="timeout")``)."""
        signal = AbortSignal()
        watcher().call_at(
            time.monotonic() + seconds,
            lambda: signal._abort(TimeoutError(f"signal timed out after {seconds} s")),
        )
        return signal

    @staticmethod
    def any(signals: Iterable[AbortSignal]) -> AbortSignal:
        """A signal that aborts when the first of ``signals`` does, with its reason."""
        combined = AbortSignal()
        sources = list(signals)
        for source in sources:
            if not isinstance(source, AbortSignal):
                raise TypeError(f"AbortSignal.any() takes AbortSignals, not {type(source).__name__}")
            if source.aborted:
                combined._abort(source.reason)
                return combined

        def forward(source: AbortSignal) -> None:
            if combined._abort(source.reason):
                for other in sources:
                    other.remove_listener(forward)

        for source in sources:
            source.add_listener(forward)
            if source.aborted:  # raced with add_listener
                forward(source)
        return combined


class AbortController:
    """Owns one :class:`AbortSignal`; ``abort()`` aborts it (from any thread)."""

    def __init__(self) -> None:
        self._signal = AbortSignal()

    def __repr__(self) -> str:
        return f"<AbortController aborted={self._signal.aborted}>"

    @property
    def signal(self) -> AbortSignal:
        """The signal to pass as ``signal=`` (one per controller)."""
        return self._signal

    def abort(self, reason: object = None) -> None:
        """Abort the signal. ``reason`` defaults to an :class:`AbortError`."""
        self._signal._abort(AbortError("signal is aborted without reason") if reason is None else reason)
