"""Choosing the next token from one step's logits, for the transformers lane's own decode loop:
logit bias, repetition penalty, the JSON-schema mask, then greedy or sampled (temperature, top-k,
top-p, min-p) from the request's own ``torch.Generator`` — a ``seed`` holds per request, with no
global RNG to share."""

from __future__ import annotations

from typing import Any

from abstract_client.types import GenerationRequest

__all__ = ["Sampler"]


class Sampler:
    """Picks each token from the logits: temperature, top-p/top-k, repetition penalty, logit bias,
    seed, a grammar's mask."""

    def __init__(
        self, request: GenerationRequest, extra: dict[str, Any], *, prompt_ids: list[int], grammar: Any, device: Any
    ) -> None:
        import torch

        self.temperature = float(request.temperature or 0.0)
        self.top_k = int(extra.get("top_k") or 0)
        self.top_p = float(extra.get("top_p") or 1.0)
        self.min_p = float(extra.get("min_p") or 0.0)
        bias = extra.get("logit_bias")
        self.bias = {int(k): float(v) for k, v in bias.items()} if bias else {}  # JSON keys are strings
        penalty = extra.get("repetition_penalty")
        self.penalty = float(penalty) if penalty is not None else None
        # every token id so far (prompt + answer), kept only for the penalty that reads it
        self.seen: list[int] | None = list(prompt_ids) if self.penalty is not None else None
        self.grammar = grammar
        self.generator = torch.Generator(device=device)
        if request.seed is not None:
            self.generator.manual_seed(int(request.seed))
        else:
            self.generator.seed()

    def pick(self, logits: Any) -> int:
        """``logits``: the last position's, shape ``(vocab,)``."""
        import torch

        logits = logits.float()
        if self.bias:
            ids = torch.tensor(list(self.bias), device=logits.device)
            logits[ids] += torch.tensor(list(self.bias.values()), device=logits.device)
        if self.penalty is not None and self.seen:
            history = torch.tensor(self.seen, device=logits.device)
            seen = logits[history]
            logits[history] = torch.where(seen > 0, seen / self.penalty, seen * self.penalty)
        if self.grammar is not None:
            allowed = torch.from_numpy(self.grammar.allowed(int(logits.shape[-1]))).to(logits.device)
            logits = logits.masked_fill(~allowed, -float("inf"))
        if self.temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if self.top_k > 0:
            kth = torch.topk(probs, min(self.top_k, probs.shape[-1])).values[-1]
            probs = torch.where(probs < kth, 0.0, probs)
        if self.min_p > 0:
            probs = torch.where(probs < self.min_p * probs.max(), 0.0, probs)
        if self.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True)
            outside = torch.cumsum(ordered, dim=-1) - ordered > self.top_p * ordered.sum()
            probs = probs.scatter(0, order, ordered.masked_fill(outside, 0.0))
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def consumed(self, token: int) -> None:
        if self.seen is not None:
            self.seen.append(token)
        if self.grammar is not None:
            self.grammar.consume(token)
