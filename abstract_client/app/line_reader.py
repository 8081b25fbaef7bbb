"""The chat's prompt: a line reader that never loses a Ctrl-C pressed at the prompt.

Python's ``input()`` has a window between its last check for signals and the ``read()`` it then
blocks in. A SIGINT landing in that window — a person pressing Ctrl-C the instant the prompt
shows, or a script that sends it as soon as it sees the prompt — only sets the interpreter's
flag: ``read()`` was not yet running, so nothing interrupts it, and the press is lost until the
next line is typed. Here every signal also writes its number to a pipe
(``signal.set_wakeup_fd``, done by the C handler the moment the signal arrives), and the read
waits on stdin and that pipe together: a press at any instant after the prompt was printed ends
the wait. POSIX only (``select`` on stdin); elsewhere the console's own ``input`` is used.
"""

from __future__ import annotations

import os
import select
import signal
from types import FrameType, TracebackType
from typing import Any

__all__ = ["LineReader"]


def _noted_elsewhere(signum: int, frame: FrameType | None) -> None:
    """SIGINT at the prompt: the press is read from the wakeup pipe (raising here as well would
    raise it twice)."""


class LineReader:
    """``with LineReader() as reader: line = reader.input(console, "you> ")``. Raises
    ``KeyboardInterrupt`` for a Ctrl-C at the prompt, ``EOFError`` at the end of input."""

    def __init__(self, fd: int = 0) -> None:
        self._fd = fd
        self._buffer = b""
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup = -1

    @staticmethod
    def supported() -> bool:
        return os.name == "posix"

    def __enter__(self) -> LineReader:
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._pipe = (r, w)
        self._previous_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        signal.set_wakeup_fd(self._previous_wakeup)
        if self._pipe is not None:
            for end in self._pipe:
                os.close(end)
            self._pipe = None

    def _signals(self) -> bytes:
        assert self._pipe is not None
        try:
            return os.read(self._pipe[0], 4096)
        except BlockingIOError:
            return b""

    def input(self, console: Any, prompt: str) -> str:
        assert self._pipe is not None, "use LineReader as a context manager"
        # Presses from before this prompt (an answer's Stop) are spent. One landing between this
        # and the handler below raises KeyboardInterrupt at once (the handler in force then).
        self._signals()
        previous = signal.signal(signal.SIGINT, _noted_elsewhere)
        try:
            console.print(prompt, end="")
            while b"\n" not in self._buffer:
                ready, _, _ = select.select([self._fd, self._pipe[0]], [], [])
                if self._pipe[0] in ready and signal.SIGINT in self._signals():
                    raise KeyboardInterrupt
                if self._fd in ready:
                    data = os.read(self._fd, 4096)
                    if not data:
                        if self._buffer:  # a last line without its newline
                            break
                        raise EOFError
                    self._buffer += data
            line, _, self._buffer = self._buffer.partition(b"\n")
            return line.decode(errors="replace")
        finally:
            signal.signal(signal.SIGINT, previous)
