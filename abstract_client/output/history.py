"""``continue_after``: the chat history to send next, after an answer or after a stop."""

from __future__ import annotations

from ..errors import AbstractClientError
from ..types import GenerateResult, Message

__all__ = ["continue_after"]


def continue_after(
    messages: list[Message], outcome: GenerateResult | AbstractClientError, *, unrun_tool_answer: str | None = None
) -> list[Message]:
    """``messages`` plus one consistent assistant turn for ``outcome``: its text (the partial
    text after a stop or an error) and its complete tool calls. A tool call that was being
    written when the stop came is dropped, never sent back truncated (servers reject truncated
    arguments with a 400). With ``unrun_tool_answer``, each kept call also gets a ``tool``
    answer with that text, for a history that goes on without running them.
    Nothing is appended when the outcome produced nothing."""
    if isinstance(outcome, GenerateResult):
        text, calls = outcome.content, outcome.tool_calls
    elif isinstance(outcome, AbstractClientError):
        text, calls = outcome.partial_text, outcome.tool_calls
    else:
        raise TypeError(f"continue_after takes a GenerateResult or an error, not {type(outcome).__name__}")
    history = list(messages)
    if not text and not calls:
        return history
    turn: Message = {"role": "assistant", "content": text or None}
    if calls:
        turn["tool_calls"] = [c.to_message() for c in calls]
    history.append(turn)
    if unrun_tool_answer is not None:
        history.extend({"role": "tool", "tool_call_id": c.id, "content": unrun_tool_answer} for c in calls)
    return history
