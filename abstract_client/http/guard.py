"""Hold a private connection's socket for the call using it, and sever it on stop.

A blocked read cannot be interrupted from Python, and servers only stop decoding when they see the
connection close. So every private connection (``http/transport.py``) hands its raw socket to the
:class:`SocketGuard` of the call that uses it, found through a context variable (one client serves
every call): when it connects, before the TLS handshake or the first byte, and again when a
pooled connection is taken by the next call. A stop then calls ``socket.shutdown(SHUT_RDWR)`` from
whichever thread requested it: the peer sees EOF at once, and a read blocked on the socket wakes
with EOF.

The guard forgets the socket before the connection closes it, so a late stop can never shut down
a file descriptor number that the OS has already handed to someone else; and a connection taken
by another call is detached from the previous call's guard first, so that call's late stop
cannot touch it.
"""

from __future__ import annotations

import contextvars
import socket
import struct
import threading
import time

try:
    import fcntl
    import termios
except ImportError:  # not POSIX: the FIN stays behind the queue, as before
    fcntl = termios = None  # type: ignore[assignment]

from ..stopping.token import Step, StopToken

__all__ = ["SocketGuard", "current_guard"]

current_guard: contextvars.ContextVar[SocketGuard | None] = contextvars.ContextVar(
    "abstract_client_socket_guard", default=None
)


class SocketGuard:
    """Owns the socket of one call's private connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.severed_at: float | None = None
        self.connected = False
        self._requested = False
        self._shut = False

    def register(self, token: StopToken) -> None:
        """Take this guard's two steps of ``token``'s stop: tell the server, then sever."""
        token.add_hook(self.tell_server, step=Step.TELL)
        token.add_hook(self.sever, step=Step.SEVER)

    @property
    def stopping(self) -> bool:
        """A stop has reached this guard (its socket told, severed, or to be severed)."""
        return self._requested or self.severed_at is not None

    def attach(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            self.connected = True
            late = self._requested
        if late:  # the stop came while we were connecting
            self._shutdown()

    def detach(self, sock: socket.socket | None = None) -> None:
        """Forget the socket (only ``sock``, when given: a guard may have moved on to another
        connection, e.g. a retry's)."""
        with self._lock:
            if sock is None or self._sock is sock:
                self._sock = None

    def tell_server(self) -> None:
        """``shutdown(SHUT_WR)``: the server sees EOF (the FIN it would see from a full
        shutdown) while our side stays quiet, so the event loop is not woken yet — a woken sync
        caller raises first (``Step.HAND_OFF``); :meth:`sever` follows."""
        with self._lock:
            sock = self._sock
            if sock is None or self.severed_at is not None:
                return
            self.severed_at = time.perf_counter()
            try:
                _reset_if_stuck(sock)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def sever(self) -> None:
        """Shut the socket down in both directions (now, or the moment it connects); safe from
        any thread, any number of times. A read blocked on it wakes with EOF."""
        with self._lock:
            self._requested = True
        self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            sock = self._sock
            if sock is None or self._shut:
                return
            self._shut = True
            if self.severed_at is None:
                self.severed_at = time.perf_counter()
            try:
                _reset_if_stuck(sock)
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed or reset by the peer: nothing left to sever
                pass


def _reset_if_stuck(sock: socket.socket) -> None:
    """A FIN is queued behind the bytes not yet sent: a server that stopped reading our request
    body (busy, or never reading it) would never see it. With bytes still queued, the close that
    follows the sever sends a reset instead (``SO_LINGER`` 0), which is not queued behind
    anything; a clean connection keeps its FIN."""
    if fcntl is None or termios is None:
        return
    try:
        unsent = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return
    if unsent > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
