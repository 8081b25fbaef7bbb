"""What the in-process lanes (MLX, transformers) add around their engine for tools, structured
output and reasoning.

* ``chat_messages``: messages as Hugging Face chat templates take them (text content, tool-call
  arguments as objects); images are refused (the text models of this lane take none).
* ``OutputShaper``: splits the sampled text into content, reasoning (the tokenizer's think tags)
  and whole tool calls (the tokenizer's tool-call tags, parsed by mlx-lm's own parser), piece by
  piece, so the stop can still be checked at every token.
* ``GrammarMask``: llguidance's matcher for a JSON schema — the tokens it allows next (chosen
  over outlines-core and xgrammar by measurement: see ``docs/tools-and-structured-output.md``);
  ``GrammarProcessor`` is it as an mlx-lm logits processor. Both run on the engine thread,
  inside the per-token loop where the stop is checked.
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import replace
from typing import Any

from abstract_client.errors import NotSupportedError
from abstract_client.output.tags import TagSplitter
from abstract_client.types import Message, StreamChunk, ToolCall, ToolCallDelta, Usage


def chat_messages(messages: list[Message], provider: str = "mlx") -> list[dict[str, Any]]:
    """Messages as a chat template takes them (text parts joined, tool calls and results in the
    template's shape)."""
    out = []
    for message in messages:
        m: dict[str, Any] = dict(message)
        content = m.get("content")
        if isinstance(content, list):
            if any(p.get("type") != "text" for p in content):
                raise NotSupportedError(f"the {provider} lane takes text only (no image parts)", provider=provider)
            m["content"] = "".join(p.get("text", "") for p in content)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                wire = c.to_message() if isinstance(c, ToolCall) else c
                fn = dict(wire.get("function", {}))
                if isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.loads(fn["arguments"] or "{}")
                calls.append({**wire, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


def held_back(detok: Any) -> str:
    """The text an mlx-lm streaming detokenizer holds back for the tokens it was given (an
    incomplete UTF-8 sequence, a space it may yet trim): what ``finalize()`` would release now.
    Read off a shallow copy (``finalize`` rebinds the fields it changes), so the stream's own
    detokenizer is untouched; free when nothing is held (the usual case)."""
    if not getattr(detok, "_unflushed", True):  # BPE and SPM: nothing held
        return ""
    seen = str(detok.text)
    probe = copy.copy(detok)
    probe.finalize()
    return str(probe.text)[len(seen) :]


class OutputShaper:
    """Text pieces in; content, reasoning and whole tool calls out."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        prompt_ids: list[int],
        think: bool,
        tools: list[dict[str, Any]] | None,
        first_usage: Usage | None = None,
    ):
        start = getattr(tokenizer, "think_start", None) or "<think>"
        end = getattr(tokenizer, "think_end", None) or "</think>"
        opened: Any = getattr(tokenizer, "think_start_tokens", None)
        inside = bool(opened) and tuple(prompt_ids[-len(opened) :]) == tuple(opened)
        self._think = TagSplitter(start, end, inside=inside) if think else None
        self._tools = tools
        self._tool_tags: TagSplitter | None = None
        self._parser = getattr(tokenizer, "tool_parser", None)
        if tools and getattr(tokenizer, "has_tool_calling", False):
            self._tool_tags = TagSplitter(tokenizer.tool_call_start, tokenizer.tool_call_end)
        self._call_text: list[str] = []
        self._n_calls = 0
        # the prompt's size (and a cache's share) rides on the first chunk out, so a stop's
        # partial usage has it
        self._first_usage = first_usage

    @property
    def plain(self) -> bool:
        """Outside any think or tool-call block: held-back text here is the answer's content."""
        return not (self._think is not None and self._think.inside) and not (
            self._tool_tags is not None and self._tool_tags.inside
        )

    def feed(self, text: str, final: bool = False) -> list[StreamChunk]:
        chunks = self._shape(text, final)
        if chunks and self._first_usage is not None:
            chunks[0], self._first_usage = replace(chunks[0], usage=self._first_usage), None
        return chunks

    def _shape(self, text: str, final: bool) -> list[StreamChunk]:
        content, reasoning = self._think.feed(text) if self._think else (text, "")
        if final and self._think is not None:
            c, r = self._think.flush()
            content, reasoning = content + c, reasoning + r
        chunks = [StreamChunk(reasoning=reasoning)] if reasoning else []
        if self._tool_tags is None:
            return [*chunks, StreamChunk(delta=content)] if content else chunks
        was_inside = self._tool_tags.inside
        outside, inside = self._tool_tags.feed(content)
        if final:
            o, i = self._tool_tags.flush()
            outside, inside = outside + o, inside + i
        self._call_text.append(inside)
        if outside:
            chunks.append(StreamChunk(delta=outside))
        if (was_inside or inside) and not self._tool_tags.inside:  # a call block just closed
            chunks.extend(StreamChunk(tool_call=piece) for piece in self._parse_calls())
        return chunks

    def _parse_calls(self) -> list[ToolCallDelta]:
        text, self._call_text = "".join(self._call_text), []
        try:
            parsed = self._parser(text, self._tools) if self._parser else json.loads(text)
        except Exception:  # unparsable call text: handed on raw, the contract reports it as invalid
            parsed = None
        items = parsed if isinstance(parsed, list) else [parsed]
        pieces = []
        for item in items:
            name = item.get("name") if isinstance(item, dict) else None
            args = item.get("arguments", {}) if isinstance(item, dict) else None
            raw = json.dumps(args) if isinstance(args, dict) else (args if isinstance(args, str) else text)
            pieces.append(
                ToolCallDelta(self._n_calls, f"call_{uuid.uuid4().hex[:24]}", name or "?", arguments_fragment=raw)
            )
            self._n_calls += 1
        return pieces


class GrammarMask:
    """The tokens a JSON schema allows next, engine-neutral: ``consume`` each sampled token,
    ``allowed(vocab)`` is a boolean numpy mask over the model's vocabulary."""

    def __init__(self, lltokenizer: Any, schema: dict[str, Any] | None, *, provider: str) -> None:
        import llguidance
        import llguidance.numpy as lln

        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema or {"type": "object"}, defaults={"whitespace_flexible": False}
        )
        self._matcher = llguidance.LLMatcher(lltokenizer, grammar)
        error = self._matcher.get_error()
        if error:
            raise NotSupportedError(f"llguidance cannot compile this schema: {error}", provider=provider)
        self._fill = lln.fill_next_token_bitmask
        self._mask = lln.allocate_token_bitmask(1, lltokenizer.vocab_size)

    def consume(self, token: int) -> None:
        self._matcher.consume_token(token)

    def allowed(self, vocab: int) -> Any:
        import numpy as np

        self._fill(self._matcher, self._mask, 0)
        allowed = np.unpackbits(self._mask.view(np.uint8), bitorder="little")[:vocab].astype(bool)
        if allowed.shape[0] < vocab:
            allowed = np.pad(allowed, (0, vocab - allowed.shape[0]))
        return allowed


class GrammarProcessor(GrammarMask):
    """An mlx-lm logits processor: ``(tokens so far, logits) -> logits`` with every token the
    grammar forbids set to -inf. The first call sees the prompt; each later call first feeds the
    token sampled since."""

    def __init__(self, lltokenizer: Any, schema: dict[str, Any] | None, *, prompt_len: int) -> None:
        super().__init__(lltokenizer, schema, provider="mlx")
        self._seen = prompt_len

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        n = int(tokens.shape[-1]) if tokens is not None else self._seen
        if n > self._seen:
            for token in tokens[self._seen :].tolist():
                self.consume(int(token))
            self._seen = n
        allowed = self.allowed(int(logits.shape[-1]))
        return mx.where(mx.array(allowed), logits, mx.array(-float("inf"), dtype=logits.dtype))
