"""Incremental detokenisation: the text each new token adds, decoding a short window of tokens
rather than the whole answer each time (the offsets scheme of TGI and vLLM). A token that ends
inside a multi-byte character adds nothing until the character is complete."""

from __future__ import annotations

from typing import Any

__all__ = ["Detokenizer"]


class Detokenizer:
    """Incremental detokenisation for Hugging Face tokenizers: text for each new token, an incomplete
    character held until it completes."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # end of what has been turned into text

    def add(self, token: int) -> str:
        self.ids.append(token)
        decode = self._tokenizer.decode
        before = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        after = decode(self.ids[self._prefix :], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return str(after[len(before) :])
        return ""

    def flush(self) -> str:
        """What is left at the end (an incomplete character stays as the replacement mark)."""
        decode = self._tokenizer.decode
        before = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        after = decode(self.ids[self._prefix :], skip_special_tokens=True)
        self._prefix = self._read = len(self.ids)
        return str(after[len(before) :])
