"""A large JSON body parsed in pieces, so that no single step holds the GIL for long.

``json.loads`` holds the GIL for its whole run, on whatever thread it runs: a 30 MB body of
small values took 350-630 ms, and every stream of the worker and its ``/health`` waited that
long. Here the body is parsed as the same ``json`` module parses it, one piece at a time: one
linear pass over the text's structural characters (as the depth check makes anyway) finds every
container and string longer than ``CHUNK`` characters; those are walked here, member by member,
and everything smaller is handed whole to the C decoder (``raw_decode``), a few milliseconds at
most. A long string is decoded in pieces cut between escapes (never inside ``\\uXXXX``, nor
between the two halves of an escaped surrogate pair). Between two pieces the thread gives the GIL
back as any Python code does, every switch interval.

A body of more than ``MAX_VALUES`` strings, objects and arrays is refused by the same pass,
before any is made: freeing them is one C call on the event loop once the request is done.

The result is the one ``json.loads`` gives (the same decoder, the same rules: ``NaN``, duplicate
keys, control characters); ``tests/test_gateway_hostile.py`` checks it against ``json.loads`` on
generated documents with a small ``CHUNK``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["CHUNK", "MAX_VALUES", "TooManyValues", "parse_in_pieces", "structure"]

CHUNK = 128 * 1024  # characters the C decoder takes in one call, at most (~1-3 ms)
# A body's strings and containers, at most: freeing a parsed body is one C call too (1.4 M
# objects: 72 ms of the loop). A request the routes take holds far fewer (10,000 messages of
# text parts: ~90,000).
MAX_VALUES = 500_000

_STRUCTURE = re.compile(r'\\.|["\[\]{}]', re.S)  # an escape pair, a quote, or a bracket
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's, as the json module's own
_DECODER = json.JSONDecoder()


class JSONError(ValueError):
    """The text is not JSON (the message says where, as ``json``'s does)."""


class TooManyValues(ValueError):
    """More strings, objects and arrays than ``max_values``: refused before any is made."""


def structure(text: str, chunk: int = CHUNK, max_values: int = MAX_VALUES) -> tuple[int, dict[int, int]]:
    """``(deepest nesting, {start: end})``: the containers and strings longer than ``chunk``
    characters, by the offset of their first character and of their last (the closing bracket
    or quote). One pass over the structural characters, strings skipped. More than
    ``max_values`` strings and containers is :class:`TooManyValues`."""
    deepest = 0
    values = 0
    stack: list[int] = []
    spans: dict[int, int] = {}
    string_at = -1
    for match in _windowed(text, chunk):
        token, at = match.group(), match.start()
        if token == '"':
            if string_at < 0:
                string_at = at
                values += 1
                if values > max_values:
                    raise TooManyValues(f"more than {max_values} strings, objects and arrays")
            else:
                if at - string_at > chunk:
                    spans[string_at] = at
                string_at = -1
        elif string_at >= 0 or len(token) == 2:  # inside a string, or an escape pair
            continue
        elif token in "[{":
            stack.append(at)
            deepest = max(deepest, len(stack))
            values += 1
            if values > max_values:
                raise TooManyValues(f"more than {max_values} strings, objects and arrays")
        elif stack:  # an unbalanced close: the parser says where
            start = stack.pop()
            if at - start > chunk:
                spans[start] = at
    return deepest, spans


def _windowed(text: str, chunk: int) -> Iterator[re.Match[str]]:
    """``_STRUCTURE.finditer(text)``, searching at most ``chunk`` characters per call: a long
    stretch without a structural character (a 30 MB string, a million numbers) is otherwise one
    C call that holds the GIL for all of it. An escape pair cut by a window's end is found whole
    by the next window."""
    start, size = 0, len(text)
    while start < size:
        end = min(start + chunk, size)
        last = start
        for match in _STRUCTURE.finditer(text, start, end):
            last = match.end()
            yield match
        # a backslash left at the window's end opens a pair the window cut: start there
        start = end - 1 if end - 1 > start and end < size and last < end and text[end - 1] == "\\" else end


def parse_in_pieces(text: str, spans: dict[int, int], chunk: int = CHUNK) -> Any:
    """``json.loads(text)``, in pieces (``spans`` from :func:`structure`)."""
    return _Pieces(text, spans, chunk).document()


class _Pieces:
    def __init__(self, text: str, spans: dict[int, int], chunk: int) -> None:
        self.text, self.spans, self.chunk = text, spans, chunk

    def _ws(self, at: int) -> int:
        return _WHITESPACE.match(self.text, at).end()  # type: ignore[union-attr]

    def _bad(self, what: str, at: int) -> JSONError:
        line = self.text.count("\n", 0, at) + 1
        column = at - self.text.rfind("\n", 0, at)
        return JSONError(f"{what}: line {line} column {column} (char {at})")

    def document(self) -> Any:
        value, end = self.value(self._ws(0))
        end = self._ws(end)
        if end != len(self.text):
            raise self._bad("Extra data", end)
        return value

    def value(self, at: int) -> tuple[Any, int]:
        end = self.spans.get(at)
        if end is None:  # small: the C decoder, whole
            try:
                return _DECODER.raw_decode(self.text, at)
            except json.JSONDecodeError as exc:
                raise JSONError(str(exc)) from None
            except StopIteration:  # raw_decode at the text's end
                raise self._bad("Expecting value", at) from None
        first = self.text[at]
        if first == '"':
            return self.string(at, end), end + 1
        if first == "{":
            return self.object(at)
        return self.array(at)

    def object(self, at: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        at = self._ws(at + 1)
        if self.text[at : at + 1] == "}":
            return out, at + 1
        while True:
            if self.text[at : at + 1] != '"':
                raise self._bad("Expecting property name enclosed in double quotes", at)
            key, at = self.value(at)
            at = self._ws(at)
            if self.text[at : at + 1] != ":":
                raise self._bad("Expecting ':' delimiter", at)
            out[key], at = self.value(self._ws(at + 1))
            at = self._ws(at)
            sep = self.text[at : at + 1]
            if sep == "}":
                return out, at + 1
            if sep != ",":
                raise self._bad("Expecting ',' delimiter", at)
            at = self._ws(at + 1)

    def array(self, at: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        at = self._ws(at + 1)
        if self.text[at : at + 1] == "]":
            return out, at + 1
        while True:
            item, at = self.value(at)
            out.append(item)
            at = self._ws(at)
            sep = self.text[at : at + 1]
            if sep == "]":
                return out, at + 1
            if sep != ",":
                raise self._bad("Expecting ',' delimiter", at)
            at = self._ws(at + 1)

    def string(self, at: int, end: int) -> str:
        """The string whose quotes are at ``at`` and ``end``, decoded ``chunk`` characters at a
        time."""
        parts = []
        start = at + 1
        while start < end:
            cut = _cut(self.text, start, min(start + self.chunk, end), end)
            try:
                parts.append(_DECODER.decode('"' + self.text[start:cut] + '"'))
            except json.JSONDecodeError as exc:
                raise self._bad(f"Invalid string ({exc.msg})", start + max(0, exc.pos - 1)) from None
            start = cut
        return "".join(parts)


_HEX = re.compile(r"[0-9a-fA-F]{4}")


def _opens_escape(text: str, at: int, lo: int) -> bool:
    """Whether the backslash at ``at`` starts an escape (an odd run of backslashes ends there)."""
    run = 0
    while at - run >= lo and text[at - run] == "\\":
        run += 1
    return run % 2 == 1


def _unicode_escape(text: str, at: int, lo: int) -> int | None:
    """The code unit of a ``\\uXXXX`` escape starting at ``at``, or None."""
    if at < lo or text[at : at + 2] != "\\u" or not _opens_escape(text, at, lo):
        return None
    digits = text[at + 2 : at + 6]
    return int(digits, 16) if _HEX.fullmatch(digits) else None


def _cut(text: str, lo: int, cut: int, end: int) -> int:
    """A cut at ``cut`` or, when that falls inside an escape or an escaped surrogate pair,
    before it (after it when the piece would be empty); ``end`` is the closing quote."""
    if cut >= end:
        return end
    start, stop = _unit_around(text, lo, cut)
    return start if start > lo or start == cut else stop


def _is_pair(high: int | None, low: int | None) -> bool:
    return high is not None and low is not None and 0xD800 <= high <= 0xDBFF and 0xDC00 <= low <= 0xDFFF


def _unit_around(text: str, lo: int, cut: int) -> tuple[int, int]:
    """``(start, stop)`` of the escape that ``cut`` falls inside (an escaped surrogate pair is
    one); ``(cut, cut)`` when it falls between two."""
    start = stop = cut
    if text[cut - 1] == "\\" and _opens_escape(text, cut - 1, lo):
        start, stop = cut - 1, (cut + 5 if text[cut] == "u" else cut + 1)
    else:
        for back in range(2, 6):
            if _unicode_escape(text, cut - back, lo) is not None:
                start, stop = cut - back, cut - back + 6
                break
    if start == cut:  # between two: unless they are the halves of a pair
        if _is_pair(_unicode_escape(text, cut - 6, lo), _unicode_escape(text, cut, lo)):
            return cut - 6, cut + 6
        return cut, cut
    code = _unicode_escape(text, start, lo)
    if _is_pair(code, _unicode_escape(text, start + 6, lo)):
        stop = start + 12
    elif _is_pair(_unicode_escape(text, start - 6, lo), code):
        start -= 6
    return start, stop
