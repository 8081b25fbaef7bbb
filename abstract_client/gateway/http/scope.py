"""What the gateway keeps in a request's ASGI scope (``scope["state"]``), one typed object per
concern, each written by its owner only: who sent the request (:class:`Caller`, by the
``middleware.Keys``), the connection it came on (:class:`Connection`, by the gateway's own
``protocol.py``; absent under another ASGI server), and its id (a string, by
``middleware.RequestIds``: ``reading.request_id_of``). Everything else reads them through
:func:`caller_of` and :func:`connection_of`."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import Scope

from ..team.keys import ANONYMOUS

__all__ = ["Caller", "Connection", "caller_of", "connection_of"]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: the key it came with (never the key itself)."""

    owner: str | None = None  # the key's identity (a hash): only it, or the admin, may cancel its requests
    name: str = ANONYMOUS  # the key's name (usage and limits say it)
    admin: bool = False  # it is the admin key
    admin_required: bool = False  # an admin key is set: only it may load and unload models
    accepted: bool = True  # a key was accepted (or none is needed)
    metrics_reader: bool = False  # the metrics key, on /metrics


NOBODY = Caller()  # a request no middleware saw (a test's bare app): no keys, nobody in particular


class Connection:
    """The connection a request came on, as the gateway's own protocol sees it: its socket (the
    departure thread watches it, the kernel says what the client has not taken), how to abort it
    (a client that left or stalled: no ERROR line), and the request's departure watch (which the
    protocol tells of the loop's signs: ``connection_lost``, ``eof_received``)."""

    def __init__(self, sock: socket.socket | None, abort: Callable[[], None]) -> None:
        self.socket, self.abort = sock, abort
        self.watch: Any = None

    def watched_by(self, watch: Any) -> None:
        self.watch = watch


def caller_of(scope: Scope) -> Caller:
    caller = (scope.get("state") or {}).get("caller")
    return caller if isinstance(caller, Caller) else NOBODY


def connection_of(scope: Scope) -> Connection | None:
    connection = (scope.get("state") or {}).get("connection")
    return connection if isinstance(connection, Connection) else None
