"""The per-token step every in-process lane shares (MLX serial, batched and vision, transformers,
gguf): what happens to one sampled token once the lane's own stop check let it through.

A lane checks its stop flag where its engine allows (before sampling, after sampling, in a
batch step) and then hands the token's text to :meth:`TokenStep.take`, which

1. counts it (the engine's own record: ``stats.tokens``, the evidence a stop is judged by),
2. ends the answer at the length limit, the engine's own end (an end token) or a stop string,
   flushing what the detokenizer and the stop-string matcher still hold at the end,
3. shapes the text (think blocks, tool calls) and emits the pieces, and
4. records, in one assignment, the snapshot a stop's partial text is read from (from any
   thread): the text emitted so far and what is still held back.

So a new in-process lane writes its stop check and its engine calls; the rest is here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from abstract_client.output.stop_sequences import StopSequences
from abstract_client.types import GenerationRequest, Usage

from ._engine import RequestStats
from ._shaping import OutputShaper

__all__ = ["TokenStep"]


def _nothing() -> str:
    return ""


class TokenStep:
    """One request's token step. ``flush``: the detokenizer's remaining text at the end (called
    once); ``held``: what the detokenizer holds back right now (a stop's partial text keeps it)."""

    __slots__ = ("_emit", "_flush", "_held", "max_tokens", "shaper", "stats", "stops")

    def __init__(
        self,
        request: GenerationRequest,
        stats: RequestStats,
        emit: Callable[[object], None],
        *,
        tokenizer: Any,
        prompt_ids: list[int],
        first_usage: Usage,
        max_tokens: int,
        flush: Callable[[], str] = _nothing,
        held: Callable[[], str] = _nothing,
    ) -> None:
        self.stats = stats
        self._emit = emit
        self.max_tokens = max_tokens
        self._flush = flush
        self._held = held
        self.stops = StopSequences(request.stop)
        self.shaper = OutputShaper(
            tokenizer,
            prompt_ids=prompt_ids,
            think=request.response_format is None and not request.raw,
            tools=request.tools if request.tool_choice != "none" else None,
            first_usage=first_usage,
        )

    def take(self, piece: str, end: str | None = None) -> str | None:
        """One sampled token, past the lane's stop check: ``piece`` is its text (``""`` for an end
        token), ``end`` the engine's own finish reason at this token (``"stop"`` for an end
        token, ``"length"``), if any. Returns the answer's finish reason once this token ends it
        (``"stop"`` at a stop string), else None."""
        stats, stops = self.stats, self.stops
        stats.tokens += 1
        if end is None and stats.tokens >= self.max_tokens:
            end = "length"
        text = stops.feed(piece)
        finish: str | None = None
        if end is not None or stops.hit:
            if not stops.hit:
                text += stops.feed(self._flush())
            text += stops.flush()
            finish = "stop" if stops.hit else end
        shaper = self.shaper
        for out in shaper.feed(text, final=finish is not None):
            self._emit(out)
        # one assignment, read from any thread: what a stop's partial text is
        stats.snapshot = (len(stats.text), stops.pending + self._held() if shaper.plain else "")
        return finish
