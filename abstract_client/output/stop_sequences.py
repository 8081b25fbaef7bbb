"""Stop sequences (the request's ``stop=``, not a cancellation) for engines that have none
(mlx-lm): text in, text out, pure.

Text that could be the start of a stop string is held back until it is known not to be one, so a
stop string split across tokens is never emitted.
"""

from __future__ import annotations

__all__ = ["StopSequences"]


class StopSequences:
    """Cuts text at the first stop string, holding back any tail that could still become one
    (``pending``)."""

    def __init__(self, stops: list[str] | None) -> None:
        self.stops = [s for s in (stops or []) if s]
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._buf = ""
        self.hit = False

    def feed(self, text: str) -> str:
        """Return the text that is safe to emit; sets ``hit`` when a stop string appeared."""
        if not self.stops:
            return text
        if self.hit:
            return ""
        self._buf += text
        cut = min((i for i in (self._buf.find(s) for s in self.stops) if i != -1), default=-1)
        if cut != -1:
            self.hit = True
            out, self._buf = self._buf[:cut], ""
            return out
        if self._hold == 0:
            out, self._buf = self._buf, ""
            return out
        out, self._buf = self._buf[: -self._hold], self._buf[-self._hold :]
        return out

    @property
    def pending(self) -> str:
        """The text held back right now (it could still start a stop string)."""
        return "" if self.hit else self._buf

    def flush(self) -> str:
        """The held-back text at the end of the answer."""
        out, self._buf = ("" if self.hit else self._buf), ""
        return out
