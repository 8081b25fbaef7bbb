"""Writing to a client: JSON answers, and sends that stop a flight whose client is gone or
stalled (a client that stops reading is a stop too, after the write timeout)."""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.types import Message, Send

from ..flight import Flight

__all__ = ["guarded_send", "guarded_send_json", "json_messages", "send_json"]


def json_messages(status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> tuple[Message, Message]:
    data = json.dumps(body).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        + (headers or []),
    }
    return start, {"type": "http.response.body", "body": data}


async def send_json(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    for message in json_messages(status, body, headers):
        await send(message)


async def guarded_send(send: Send, flight: Flight, *messages: Message) -> None:
    """Send to the client unless it is gone. A client that stops reading makes ``send`` wait
    (flow control); past the write timeout that is a stop too (reason ``client_stalled``): its
    generation ends and its slot is free for the next request."""
    if flight.client_gone:
        return
    try:
        with anyio.move_on_after(flight.write_timeout) as scope:
            for message in messages:
                await send(message)
    except OSError:  # the client went away under us: that is a stop too
        flight.stop("client_disconnect")
        return
    # a reader that takes nothing is stalled whatever its buffers hold (``stall.py``)
    taken_nothing = flight.unsent is not None and flight.unsent.wrote(sum(len(m.get("body", b"")) for m in messages))
    if scope.cancelled_caught or taken_nothing:
        flight.stalled()  # nothing more can be written to it


async def guarded_send_json(
    send: Send, flight: Flight, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await guarded_send(send, flight, *json_messages(status, body, headers))
