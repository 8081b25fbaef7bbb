"""What the line decoders (SSE, NDJSON) share: bad bytes lose nothing that came before them.

One socket read may carry many frames (the HTTP reader hands over whole reads). When a line in
it is bad, the frames before it in the same read are partial text the caller must keep: ``feed``
returns them, and the error is raised by the next ``feed`` (or by the decoder's end of input,
through :meth:`HoldsBackErrors._raise_held`).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from ..errors import ProviderProtocolError

__all__ = ["HoldsBackErrors"]

T = TypeVar("T")


class HoldsBackErrors(Generic[T]):
    """A decoder's ``feed`` that hands out the frames before bad bytes first and raises on the next
    call (no frame the server sent is lost to a later error)."""

    _error: ProviderProtocolError | None = None  # held back by feed, raised at the next call

    def feed(self, chunk: bytes) -> list[T]:
        """What ``chunk`` completes. Bad bytes raise — after what came before them in ``chunk``."""
        self._raise_held()
        out: list[T] = []
        try:
            self._feed(chunk, out)
        except ProviderProtocolError as exc:
            if not out:
                raise
            self._error = exc
        return out

    def _feed(self, chunk: bytes, out: list[T]) -> None:
        raise NotImplementedError

    def _raise_held(self) -> None:
        if self._error is not None:
            raise self._error
