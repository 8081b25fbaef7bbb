"""Request ids per owner: the gateway's flights and stop records, and the library calls behind
them, are held by the client's id scoped to the key it came with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["flights_named", "scoped"]


def scoped(request_id: str, owner: str | None) -> str:
    """A request id as the gateway and its library hold it: per owner (key). Two keys may use the
    same ``X-Request-Id`` at once, and neither can see, cancel, reuse or overwrite the other's;
    ``@`` is not in a client's id alphabet, so no client can name another's scoped id. Keyless,
    the id is the client's own."""
    return request_id if owner is None else f"{request_id}@{owner}"


def flights_named(flights: Mapping[str, Any], request_id: str, owner: str | None, admin: bool) -> list[Any]:
    """The flights (``state.Flight``) ``request_id`` names for this caller: its own one, or, for
    the admin key, every owner's."""
    return [f for f in flights.values() if f.request_id == request_id and (admin or f.owner == owner)]
