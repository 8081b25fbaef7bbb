"""A client that stops reading, seen by the kernel's count of the bytes it has not taken.

The gateway's writes wait (flow control) only once the socket's send buffer and the transport's
are full: on loopback or a fast network that is megabytes — 2.8 MB, ~22k events, 29.8 s with a
5 s ``write_timeout`` — and all the while the engine decodes for nobody. Here every write
reads the socket's unsent bytes (``TIOCOUTQ``, one ``ioctl``): when they did not go down
although nothing new came in between (``unsent now >= unsent before + written since``, the
framing's few bytes on top), the reader took nothing; a reader that has taken nothing for
``write_timeout`` is stalled, however large its buffers. A reader that takes any byte is not.
"""

from __future__ import annotations

import struct
import time
from typing import Any

try:
    import fcntl
    import termios
except ImportError:  # pragma: no cover (not Linux/BSD: the write's own timeout is the only sign)
    fcntl = termios = None  # type: ignore[assignment]

__all__ = ["UnsentWatch"]


def _unsent(fd: int) -> int | None:
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except (OSError, ValueError):  # closed, or not a socket that can say
        return None


class UnsentWatch:
    """One request's reader, judged at each write (``wrote``)."""

    def __init__(self, sock: Any, timeout: float) -> None:
        self.fd = sock.fileno() if sock is not None and fcntl is not None else -1
        self.timeout = timeout
        self._unsent = 0
        self._written = 0  # bytes handed over since the last look
        self._since: float | None = None  # when the reader last was seen to take nothing

    def wrote(self, nbytes: int) -> bool:
        """``nbytes`` were just written: True when the reader has taken nothing for ``timeout``."""
        if self.fd < 0:
            return False
        unsent = _unsent(self.fd)
        if unsent is None:
            return False
        taken = unsent == 0 or unsent < self._unsent + self._written + nbytes
        self._unsent, self._written = unsent, 0
        now = time.monotonic()
        if taken:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        return now - self._since >= self.timeout
