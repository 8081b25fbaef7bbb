"""What every peer's driver shares, in the peers' own venv: the trial it is given, the Stop
button it presses, and the outcome it reports. Standard library only (the library itself is
imported by the drivers that use it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Call = Callable[["Press"], Any]  # a client's call, given the Stop button


@dataclass
class Trial:
    """One call, and when Stop is pressed in it."""

    server: str  # llamacpp, vllm, ollama, lmstudio
    url: str  # the server's root: http://127.0.0.1:PORT (a driver adds /v1 where its client wants it)
    model: str
    prompt: str
    max_tokens: int
    stream: bool
    style: str  # "thread": Stop pressed from another thread; "task": an asyncio app
    cue: str | None  # the file whose appearance presses Stop (None: never pressed)
    extra: dict[str, Any] = field(default_factory=dict)  # sampling fields the server needs (ignore_eos)
    api_key: str = "none"  # a gateway's key (the LiteLLM proxy will not start without one)

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}]


class Press:
    """The Stop button, pressed from a thread of its own on the bench's cue: the moment the file
    ``cue`` appears (the bench makes it when the server's own evidence shows the stage the trial
    means — tokens being decoded, or the prompt still being read). ``arm(how, stop)`` notes the
    press's time, then calls ``stop`` (None: the client has no way to stop, and pressing does
    nothing but note the time). No cue: never pressed (the cost side). ``text`` collects what
    the caller's own loop received."""

    def __init__(self, cue: str | None) -> None:
        self.cue = cue
        self.pressed: float | None = None
        self.how = ""
        self.text: list[str] = []
        self._over = threading.Event()

    def _cued(self) -> bool:
        while not self._over.is_set():
            if self.cue is not None and os.path.exists(self.cue):
                return True
            self._over.wait(0.001)
        return False

    def arm(self, how: str, stop: Callable[[], Any] | None) -> None:
        self.how = how
        if self.cue is None:
            return

        def press() -> None:
            if self._cued():
                self.pressed = time.perf_counter()
                if stop is not None:
                    stop()

        threading.Thread(target=press, daemon=True).start()

    def flag(self, how: str = "break") -> threading.Event:
        """A Stop button that sets an event: one the caller's own loop reads (a ``break`` on a
        stream), or one a client is given (``cancel_event=``, ``sdk.stop_on``)."""
        stop = threading.Event()
        self.arm(how, stop.set)
        return stop

    def disarm(self) -> None:
        self._over.set()

    def run_task(self, how: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """An asyncio app: the call runs as a task, and Stop is ``task.cancel()`` on the loop."""
        self.how = how

        async def main() -> Any:
            task = asyncio.ensure_future(make())
            loop = asyncio.get_running_loop()

            def press() -> None:
                self.pressed = time.perf_counter()
                task.cancel()

            def cued() -> None:
                if self._cued():
                    with contextlib.suppress(RuntimeError):  # the loop is gone: the call ended
                        loop.call_soon_threadsafe(press)

            if self.cue is not None:
                threading.Thread(target=cued, daemon=True).start()
            try:
                return await task
            finally:
                self.disarm()

        return asyncio.run(main())


class Closer:
    """A Stop button for a stream the caller does not hold yet: ``close()`` closes what
    ``hold()`` is given, at once if Stop was pressed before (during the prompt, say)."""

    def __init__(self) -> None:
        self._held: Any = None
        self._pressed = False
        self._lock = threading.Lock()

    def hold(self, stream: Any) -> Any:
        with self._lock:
            self._held, pressed = stream, self._pressed
        if pressed:
            stream.close()
        return stream

    def close(self) -> None:
        with self._lock:
            self._pressed, held = True, self._held
        if held is not None:
            held.close()


def in_asyncio(aask: Callable[[Press], Awaitable[Any]]) -> Call:
    """The call in an asyncio app: it runs as a task, and Stop is ``task.cancel()``."""
    return lambda p: p.run_task("task.cancel()", lambda: aask(p))


def no_way_to_stop(ask: Callable[[Press], Any]) -> Call:
    """A call its client gives no way to stop: pressing Stop only notes the time."""

    def call(p: Press) -> Any:
        p.arm("no way to stop", None)
        return ask(p)

    return call


def breaking(ask: Callable[[Press, threading.Event], Any]) -> Call:
    """A stream the caller's own loop leaves with ``break`` once Stop is pressed."""
    return lambda p: ask(p, p.flag("break"))


def closing(ask: Callable[[Press, Closer], Any]) -> Call:
    """A stream the Stop button's thread closes: ``stream.close()``."""

    def call(p: Press) -> Any:
        closer = Closer()
        p.arm("stream.close()", closer.close)
        return ask(p, closer)

    return call


def under_stop_on(ask: Callable[[Press], Any]) -> Call:
    """The call with this library's client under it, stopped the library's way from a thread:
    ``with sdk.stop_on(event)``, the Stop button sets the event."""
    from abstract_client import sdk

    def call(p: Press) -> Any:
        with sdk.stop_on(p.flag("sdk.stop_on(event)")):
            return ask(p)

    return call


def outcome(run: Callable[[], Any], press: Press) -> dict[str, Any]:
    """Run a driver's call; what its caller saw."""
    caught: BaseException | None = None
    result: Any = None
    try:
        result = run()
    except BaseException as exc:
        caught = exc
    released = time.perf_counter()
    press.disarm()
    kept = getattr(caught, "partial_text", None) if caught is not None else None
    if kept is None and caught is None:
        kept = result if isinstance(result, str) else "".join(press.text)
    name = "" if caught is None else type(caught).__module__.split(".")[0] + "." + type(caught).__name__
    return {
        "pressed": press.pressed,
        "released": released,
        "how": press.how,
        "caught": name,
        "typed": caught is not None and "Cancel" in type(caught).__name__,
        "partial_chars": len(kept) if isinstance(kept, str) else 0,
    }
