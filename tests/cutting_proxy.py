"""A fault-injecting TCP proxy for the resumable-stream tests: a flaky network on loopback.

Every connection is forwarded byte for byte to the upstream. Each connection draws (from a
seeded RNG) how many bytes of the upstream's answer it may carry; past that it is cut — reset on
both sides (``SO_LINGER`` 0), wherever in the response that falls: inside a chunk's framing, an
SSE frame or a UTF-8 character. ``cuts`` bounds how many connections are cut; ``refuse()``
opens a gap in which every new connection is reset at once (a network that is down), until
``reopen()``.
"""

from __future__ import annotations

import contextlib
import random
import select
import socket
import struct
import threading


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


class CuttingProxy:
    def __init__(
        self,
        upstream_port: int,
        *,
        seed: int,
        cuts: int,
        cut_after: tuple[int, int] = (1_000, 8_000),
        refuse_after_cut: bool = False,
    ) -> None:
        self.upstream_port = upstream_port
        self.rng = random.Random(seed)
        self.cuts_left = cuts
        self.cut_after = cut_after
        self.refuse_after_cut = refuse_after_cut
        self.cut_at: list[int] = []  # the byte each cut connection was cut at
        self.refused = 0
        self._refusing = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def refuse(self) -> None:
        self._refusing.set()

    def reopen(self) -> None:
        self._refusing.clear()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing.is_set():
                with self._lock:
                    self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                _reset(client)
                continue
            with self._lock:
                budget = self.rng.randint(*self.cut_after) if self.cuts_left > 0 else None
            threading.Thread(target=self._pump, args=(client, upstream, budget), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket, budget: int | None) -> None:
        """Both directions in one thread (a socket closed under another thread's blocked recv
        sends nothing until that recv returns: the reset must come from the thread that reads).
        With a ``budget``, the connection is reset on both sides once that many bytes of the
        upstream's answer went through."""
        sent = 0
        open_ = {client: upstream, upstream: client}
        try:
            while open_:
                readable, _, _ = select.select(list(open_), [], [], 30)
                if not readable:
                    return
                for src in readable:
                    dst = open_[src]
                    data = src.recv(65536)
                    if not data:
                        with contextlib.suppress(OSError):
                            dst.shutdown(socket.SHUT_WR)
                        del open_[src]
                        continue
                    if src is upstream and budget is not None and sent + len(data) >= budget:
                        with self._lock:
                            cut = self.cuts_left > 0
                            if cut:
                                self.cuts_left -= 1
                                self.cut_at.append(budget)
                                if self.refuse_after_cut:
                                    self._refusing.set()
                        if cut:
                            client.sendall(data[: budget - sent])
                            return
                    dst.sendall(data)
                    if src is upstream:
                        sent += len(data)
        except OSError:
            return
        finally:
            _reset(client)
            _reset(upstream)
