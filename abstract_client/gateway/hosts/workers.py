"""Several gateway processes on one port, and a cancel that reaches the one holding the request.

One Python process relays what one core can (see ``docs/gateway.md``); ``workers = N`` forks N
processes after the listening socket is bound, and the kernel spreads connections over them. A
client's disconnect is seen by the worker that serves it, so the stop chain stays in one
process. Only ``POST /v1/requests/{id}/cancel`` (and a model unload) can land on another worker
than the request: each worker listens on a Unix socket in a private run directory, and a worker
that does not hold the request asks its peers (every peer at once; the holder checks the
caller's key exactly as it would locally). A background response outlives its connection, so
its GET (a resumed stream) and its cancel can land anywhere: its id names its worker, and the
request is relayed to that one (``relay``), its answer streamed back.

In-process lanes (MLX) stay in one process: N workers would load N copies of the model, and an
eject would free only one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ..request_ids import flights_named

__all__ = ["Peers", "answer_op", "relay", "run_workers"]

log = logging.getLogger("abstract_client.gateway")
_ASK_TIMEOUT = 2.0  # a peer that does not answer within this is treated as not holding it


class Peers:
    """This worker's line to its siblings: a Unix socket server answering ``cancel`` and
    ``stop-backend``, and the client side that asks every sibling."""

    def __init__(self, run_dir: Path, index: int, count: int) -> None:
        self.run_dir, self.index, self.count = run_dir, index, count
        self._server: asyncio.AbstractServer | None = None

    def path(self, index: int) -> str:
        return str(self.run_dir / f"worker-{index}.sock")

    async def start(self, gateway: Any) -> None:
        """Answer the peers' questions about ``gateway`` (an ``app.Gateway``: its flights)."""

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                line = (await reader.readline()).decode().split()
                if line[:1] == ["response"]:  # a background response's GET or cancel, relayed
                    await gateway.background.answer_peer(line[1:], writer)
                    return
                writer.write(b"1\n" if answer_op(gateway, line) else b"0\n")
                await writer.drain()
            except (OSError, UnicodeDecodeError):
                pass
            finally:
                writer.close()

        # Every reader of a response another worker holds is one connection here: asyncio's
        # default backlog (100) refused a burst of 400 relayed GETs. The kernel caps it at
        # net.core.somaxconn.
        self._server = await asyncio.start_unix_server(answer, path=self.path(self.index), backlog=_RELAY_BACKLOG)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path(self.index))

    async def ask(self, *words: str) -> bool:
        """Send one line to every other worker; True if any of them acted on it."""
        line = (" ".join(words) + "\n").encode()

        async def one(index: int) -> bool:
            try:
                async with asyncio.timeout(_ASK_TIMEOUT):
                    reader, writer = await asyncio.open_unix_connection(self.path(index))
                    writer.write(line)
                    await writer.drain()
                    got = await reader.readline()
                    writer.close()
                    return got.strip() == b"1"
            except (OSError, TimeoutError):
                return False

        answers = await asyncio.gather(*(one(i) for i in range(self.count) if i != self.index))
        return any(answers)


async def relay(path: str, line: str) -> tuple[int, str, AsyncIterator[bytes]] | None:
    """Send ``line`` to the worker listening on ``path`` and read its answer: ``(status, kind,
    body)`` — kind ``json`` or ``sse``, the body read on as it comes — or None if it cannot be
    reached. The body's reader closes the connection when it is done or dropped (a reader that
    leaves stops the owner's relaying)."""
    try:
        async with asyncio.timeout(_RELAY_TIMEOUT):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(line.encode() + b"\n")
            await writer.drain()
            head = (await reader.readline()).decode().split()
        status, kind = int(head[0]), head[1]
    except (OSError, TimeoutError, ValueError, IndexError, UnicodeDecodeError):
        return None

    async def body() -> AsyncIterator[bytes]:
        try:
            while part := await reader.read(65536):
                yield part
        finally:
            writer.close()

    return status, kind, body()


# a relayed cancel answers once the engine stopped (it waits up to 10 s): more than that
_RELAY_TIMEOUT = 15.0
_RELAY_BACKLOG = 4096


def answer_op(gateway: Any, words: list[str]) -> bool:
    """Act on a sibling's request: ``cancel <id> <owner|-> <admin 0|1>`` or ``stop-backend
    <name>`` (from another worker's socket, or another host through the store). True: done."""
    if len(words) == 4 and words[0] == "cancel":
        _, request_id, owner, admin = words
        found = flights_named(gateway.flights, request_id, None if owner == "-" else owner, admin == "1")
        for flight in found:
            flight.stop("cancel_endpoint")
        return bool(found)
    if len(words) == 2 and words[0] == "stop-backend":
        stopped = [f for f in gateway.flights.values() if f.backend.name == words[1]]
        for flight in stopped:
            flight.stop("model_eject")
        return bool(stopped)
    return False


def _die_with(parent: int) -> None:
    """A worker ends with its parent, even a parent killed with SIGKILL (which forwards nothing):
    orphans would go on serving the port. Linux: the kernel sends SIGTERM (the graceful stop)
    when the parent dies; elsewhere a thread watches the parent."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="abstract-client-parent-watch", daemon=True).start()
    if os.getppid() != parent:  # it died before the request took: nobody will send the signal
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def run_workers(count: int, bound: socket.socket, run_one: Callable[[Peers], None]) -> None:
    """Fork ``count`` workers sharing ``bound`` (listening); each runs ``run_one(peers)``. The
    parent forwards SIGINT/SIGTERM to them and returns once all have exited."""
    run_dir = Path(tempfile.mkdtemp(prefix="abstract-client-gateway-"))
    children: list[int] = []
    parent = os.getpid()
    try:
        for index in range(count):
            pid = os.fork()
            if pid == 0:  # the worker
                code = 0
                try:
                    _die_with(parent)
                    run_one(Peers(run_dir, index, count))
                except BaseException:
                    log.exception("worker %d failed", index)
                    code = 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            children.append(pid)
        bound.close()  # the workers hold it now

        def forward(sig: int, frame: object) -> None:
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        for pid in children:
            while True:
                try:
                    os.waitpid(pid, 0)
                    break
                except ChildProcessError:
                    break
                except InterruptedError:
                    continue
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
