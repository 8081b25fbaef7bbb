"""A request body as JSON bytes, as httpx encodes ``json=`` (compact, UTF-8, no NaN), with its long
strings encoded on their own, ``PIECE`` characters at a time, once they add up past ``PIECE``.

``json.dumps`` is one C call that holds the GIL: a 30 MB string (an image as a data URL, a long
document) took 40-80 ms of the caller's event loop in one step, every other stream waiting —
the gateway's, when it forwards a large request. Here such a string is left out of the document
(a placeholder no client can guess stands in for it), encoded in slices of ``PIECE`` characters
(a slice of a JSON string encodes to the same text as the same characters inside the whole
string: escapes are per character), and spliced back; ``http/clients.py`` does that on a worker
thread, whose short calls let the loop run between them. Small bodies — the usual case — cost one
walk of their containers (under a microsecond for a chat turn) before the one ``json.dumps``.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

__all__ = ["LONG", "PIECE", "encode_json", "long_strings"]

PIECE = 256 * 1024  # characters of one string encoded in one call, at most
LONG = 4096  # a string this long or longer is encoded on its own, once they add up past PIECE


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def long_strings(value: Any) -> dict[int, str]:
    """``value``'s long strings by ``id``, when they add up past ``PIECE`` (then it is worth a
    worker thread and the encoding in slices); empty when one call does."""
    found: dict[int, str] = {}
    _find_long(value, found)
    return found if sum(len(text) for text in found.values()) > PIECE else {}


def encode_json(value: Any, long: dict[int, str] | None = None) -> bytes:
    """``value`` as httpx's ``json=`` sends it (``long``: its :func:`long_strings`, when the
    caller has them already)."""
    long = long_strings(value) if long is None else long
    if not long:  # the usual case: one call
        return _dumps(value).encode("utf-8")
    nonce = secrets.token_hex(16)
    marks = {key: f"\x00{nonce}:{key}" for key in long}
    text = _dumps(_marked(value, marks))
    out: list[str] = []
    at = 0
    for found in re.finditer(re.escape(_dumps(f"\x00{nonce}:")[:-1]) + r'(\d+)"', text):
        out.append(text[at : found.start()])
        piece = long[int(found.group(1))]
        out.append('"')
        out.extend(_dumps(piece[start : start + PIECE])[1:-1] for start in range(0, len(piece), PIECE))
        out.append('"')
        at = found.end()
    out.append(text[at:])
    return "".join(out).encode("utf-8")


def _find_long(value: Any, found: dict[int, str]) -> None:
    """The strings longer than ``LONG``, by their ``id`` (a thousand 30 kB messages are 30 MB
    for one call too)."""
    kind = type(value)
    if kind is str:
        if len(value) > LONG:
            found[id(value)] = value
    elif kind is dict:
        for item in value.values():
            if type(item) in (dict, list, tuple, str):
                _find_long(item, found)
    elif kind is list or kind is tuple:
        for item in value:
            if type(item) in (dict, list, tuple, str):
                _find_long(item, found)


def _marked(value: Any, marks: dict[int, str]) -> Any:
    """``value`` with each long string replaced by its mark (containers copied only on the way
    to one)."""
    kind = type(value)
    if kind is str:
        return marks.get(id(value), value)
    if kind is dict:
        return {k: _marked(v, marks) if type(v) in (dict, list, tuple, str) else v for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_marked(v, marks) if type(v) in (dict, list, tuple, str) else v for v in value]
    return value
