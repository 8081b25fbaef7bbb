"""The MLX lane's vision models (mlx-vlm): images in, the same stop as the text models.

A model directory whose ``config.json`` has a ``vision_config`` is loaded with mlx-vlm (the
``vlm`` extra); ``create_llm("mlx", model=PATH)`` is the same call. mlx-vlm's own loop
(``generate_step``) builds the image embedding lazily, so the vision tower runs inside the first
prefill chunk's evaluation, and by default the whole prompt is one chunk of 2,048 tokens: a stop
there waits for vision + all of prefill. So this module runs the three phases itself, each with
its own stop check:

1. **vision** — ``get_input_embeddings`` (the vision tower, the projector, the text
   embeddings). Left to MLX it is one lazy graph evaluated in one native call (seconds on a
   CPU), so the tower's encoder layers are evaluated one at a time (:func:`check_layers`): the
   stop is checked before each layer, before the call (a pre-set stop computes nothing) and
   right after it. What cannot be interrupted is one encoder layer (durations in
   ``docs/cancellation.md``).
2. **prefill** — the prompt's embeddings, ``prefill_step_size`` tokens per evaluation, the stop
   checked after every chunk.
3. **decode** — one token per step (the next one computed while the current is handed out, as
   mlx-lm does); the stop checked before every token is counted or handed out.

Images arrive as data URLs (the call boundary has read local files into them); an ``http(s)``
URL is refused (the library never fetches). Vision models run one request at a time (no batch
engine) and keep no prompt cache: an image's KV depends on its pixels, not on the token ids a
prompt cache is keyed by.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from abstract_client.errors import NotSupportedError
from abstract_client.images import base64_payload
from abstract_client.stopping.token import StopToken
from abstract_client.types import GenerationRequest, Message, StreamChunk, Timings, Usage

from .._engine import EngineStop, RequestStats
from .._shaping import chat_messages, held_back
from .._step import TokenStep
from .model import MLXModel

__all__ = ["VisionModel", "generate_with_images", "is_vision_model"]

log = logging.getLogger(__name__)


def is_vision_model(path: Path) -> bool:
    """A model directory with a vision tower (``vision_config`` in its ``config.json``)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def require_mlx_vlm(path: Path) -> None:
    """Refuse a vision model when mlx-vlm (the ``vlm`` extra) is missing, with how to install it."""
    if importlib.util.find_spec("mlx_vlm") is None:
        raise NotSupportedError(
            f"{path} is a vision model: the mlx lane runs it with mlx-vlm, which is not installed "
            "(pip install 'abstract-client[vlm]')",
            provider="mlx",
        )


class _StopCell:
    """The check the vision tower's layers call (one per loaded model; the MLX thread runs one
    request at a time, so it holds the current request's)."""

    check: Callable[[], None] | None = None


def check_layers(model: Any, cell: _StopCell) -> int:
    """Make every encoder layer of ``model``'s vision tower evaluate its input and run
    ``cell.check`` before it computes, so a stop lands between layers instead of after the whole
    tower. The layers' classes are swapped for a subclass (the module tree, its weights and their
    names stay as they are). The input, not the output, is evaluated: a last layer whose output
    the model does not use is still never computed. Returns the number of layers checked."""
    import mlx.core as mx
    import mlx.nn as nn  # type: ignore[import-untyped,unused-ignore]

    tower = getattr(model, "vision_tower", None) or getattr(model, "vision_model", None)
    module_type: Any = getattr(nn, "Module")  # noqa: B009 (mlx.nn is typed without it)
    if not isinstance(tower, module_type):
        return 0
    layers: list[Any] = []
    for _, module in tower.named_modules():
        found = getattr(module, "layers", None)
        if isinstance(found, list) and len(found) > len(layers) and all(isinstance(x, module_type) for x in found):
            layers = found
    for layer in layers:
        base = type(layer)
        if base not in _CHECKED:

            def __call__(self: Any, *args: Any, __base: Any = base, **kwargs: Any) -> Any:
                check = self._abstract_client_stop.check
                if check is not None:
                    if args:
                        mx.eval(args[0])
                    check()
                return __base.__call__(self, *args, **kwargs)

            _CHECKED[base] = type(base.__name__, (base,), {"__call__": __call__})
        layer.__class__ = _CHECKED[base]
        layer._abstract_client_stop = cell
    return len(layers)


_CHECKED: dict[type, type] = {}


class VisionModel(MLXModel):
    """The loaded vision model: mlx-vlm's model and processor (images → pixels, ``<image>`` →
    one token per patch) and mlx-lm's tokenizer wrapper over the same files (chat template,
    streaming detokenizer, think and tool-call tags: the text lane's output shaping)."""

    processor: Any = None
    stop_cell: _StopCell | None = None
    checked_layers = 0  # encoder layers of the vision tower the stop is checked between

    def ensure_loaded(self) -> tuple[Any, Any]:
        if self.model is None:
            import mlx.core as mx
            from mlx_lm.utils import load_tokenizer
            from mlx_vlm import load

            if self.ejected:
                log.warning("mlx: reloading %s on demand after an eject", self.path)
            self.memory_baseline = mx.get_active_memory()
            self.model, self.processor = load(str(self.path))
            eos = getattr(self.model.config, "eos_token_id", None)
            self.tokenizer = load_tokenizer(self.path, eos_token_ids=eos)  # type: ignore[no-untyped-call]
            self.stop_cell = _StopCell()
            self.checked_layers = check_layers(self.model, self.stop_cell)
            self.ejected = False
            self.loads += 1
        return self.model, self.tokenizer

    def drop(self) -> None:
        super().drop()
        self.processor = self.stop_cell = None

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        return self.inputs(request)[0]

    def inputs(self, request: GenerationRequest) -> tuple[list[int], Any, dict[str, Any]]:
        """``(token ids, pixel values or None, the processor's other model inputs)``: the chat
        template renders an image part where the message has it; the processor expands each
        ``<image>`` into the model's number of image tokens."""
        _, tokenizer = self.ensure_loaded()
        images: list[Any] = []
        if request.raw:
            text = request.prompt or ""
        else:
            kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": False}
            if request.tools:
                kwargs["tools"] = request.tools
            if request.reasoning is not None:
                kwargs["enable_thinking"] = request.reasoning is not False
            messages = _template_messages(request.messages, images)
            text = tokenizer.apply_chat_template(messages, **kwargs)
        # The processor is called with text and images only: mlx-vlm's own prepare_inputs passes
        # padding=, which mlx-vlm 0.7.10's LLaVA processor hands on to transformers 5's image
        # processor, which rejects it.
        out = self.processor(images=images or None, text=text)
        ids = [int(t) for t in out["input_ids"][0].tolist()]
        extra = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask", "pixel_values")}
        return ids, out.get("pixel_values"), extra


def _template_messages(messages: list[Message], images: list[Any]) -> list[dict[str, Any]]:
    """Hugging Face chat-template messages: a message with images keeps its parts (an image as
    ``{"type": "image"}``, its pixels appended to ``images`` in order); others are text."""
    from PIL import Image, ImageOps

    out: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list) or not any(p.get("type") == "image_url" for p in content):
            out.extend(chat_messages([message]))
            continue
        parts: list[dict[str, Any]] = []
        for part in content:
            if part.get("type") == "image_url":
                _, payload = base64_payload(part, "mlx")
                image = Image.open(io.BytesIO(base64.b64decode(payload)))
                images.append(ImageOps.exif_transpose(image).convert("RGB"))
                parts.append({"type": "image"})
            elif part.get("type") == "text":
                parts.append({"type": "text", "text": part.get("text", "")})
            else:
                raise NotSupportedError(f"the mlx lane takes text and image parts, not {part.get('type')!r}")
        out.append({**chat_messages([{**message, "content": None}])[0], "content": parts})
    return out


def generate_with_images(
    handle: VisionModel,
    request: GenerationRequest,
    token: StopToken,
    stats: RequestStats,
    emit: Callable[[object], None],
) -> None:
    """One request on the MLX thread: vision, prefill chunks, decode — the stop checked between
    each (raises :class:`EngineStop` where it sees it; the caller records it)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = handle.ensure_loaded()
    ids, pixel_values, extra_inputs = handle.inputs(request)
    stats.prompt_tokens, stats.cached_tokens = len(ids), 0
    extra = handle.extra(request)
    started = time.perf_counter()

    # 1. vision: the tower's layers one at a time, the stop checked before each
    stats.phase, stats.phase_started["vision"] = "vision", time.perf_counter()
    input_ids = mx.array([ids])

    inputs_seen = 0

    def between_layers() -> None:  # the layer's input was just evaluated: the previous layer's output
        nonlocal inputs_seen
        stats.layers_done, inputs_seen = inputs_seen, inputs_seen + 1
        if token.is_set:
            stats.stopped_in = "vision"
            raise EngineStop

    cell = handle.stop_cell
    assert cell is not None
    cell.check = between_layers
    try:
        embedded = model.get_input_embeddings(input_ids, pixel_values, mask=None, **extra_inputs)
        embeds = embedded.inputs_embeds
        lm_kwargs = {k: v for k, v in embedded.to_dict().items() if k != "inputs_embeds" and v is not None}
        mx.eval(embeds)
    finally:
        cell.check = None
    if token.is_set:
        stats.stopped_in = "vision"
        raise EngineStop

    # 2. prefill: every token but the last, a chunk per evaluation
    stats.phase, stats.phase_started["prefill"] = "prefill", time.perf_counter()
    language = model.language_model
    kv = make_prompt_cache(language, max_kv_size=handle.max_kv_size)
    chunk = int(extra.get("prefill_step_size", handle.prefill_step_size))
    total, done = len(ids), 0
    stats.prefill_total = total
    while total - done > 1:
        n = min(chunk, total - done - 1)
        language(input_ids[:, done : done + n], inputs_embeds=embeds[:, done : done + n], cache=kv, **lm_kwargs)
        mx.eval([c.state for c in kv])
        done += n
        stats.prefill_done = done
        if token.is_set:  # between prefill chunks
            stats.stopped_in = "prefill"
            raise EngineStop
    prefill_s = time.perf_counter() - started

    # 3. decode
    stats.phase, stats.phase_started["decode"] = "decode", time.perf_counter()
    sampler = handle.sampler(request)
    processors = handle.logits_processors(request, len(ids))
    history = mx.array(ids)

    def sample(inputs: Any, inputs_embeds: Any = None, **kwargs: Any) -> Any:
        nonlocal history
        logits = language(inputs, inputs_embeds=inputs_embeds, cache=kv, **kwargs).logits[:, -1, :]
        if processors:
            for processor in processors:
                logits = processor(history, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return sampler(logprobs)

    detok = tokenizer.detokenizer
    detok.reset()
    eos = set(tokenizer.eos_token_ids)
    max_tokens = request.max_tokens or handle.default_max_tokens
    step = TokenStep(
        request,
        stats,
        emit,
        tokenizer=tokenizer,
        prompt_ids=ids,
        first_usage=Usage(prompt_tokens=len(ids), cached_tokens=0),
        max_tokens=max_tokens,
        flush=lambda: _finalize(detok),
        held=lambda: held_back(detok),
    )
    y = sample(input_ids[:, done:], embeds[:, done:], **lm_kwargs)
    mx.async_eval(y)  # type: ignore[no-untyped-call]
    decode_started = time.perf_counter()
    for n in range(max_tokens):
        following = None
        if n + 1 < max_tokens:  # the next token is computed while this one is handed out
            if processors:
                history = mx.concatenate([history, y])
            following = sample(y[None])
            mx.async_eval(following)  # type: ignore[no-untyped-call]
        sampled = int(y.item())
        if token.is_set:  # before every token is counted or handed out
            stats.stopped_in = "decode"
            raise EngineStop
        ended = sampled in eos
        finish = step.take("" if ended else _segment(detok, sampled), "stop" if ended else None)
        if finish is not None:
            decode_s = max(time.perf_counter() - decode_started, 1e-9)
            emit(
                StreamChunk(
                    finish_reason=finish,
                    usage=Usage(prompt_tokens=len(ids), completion_tokens=stats.tokens, cached_tokens=0),
                    timings=Timings(prompt_tokens_per_s=len(ids) / prefill_s, tokens_per_s=stats.tokens / decode_s),
                )
            )
            stats.finished = True
            return
        y = following


def _segment(detok: Any, token: int) -> str:
    detok.add_token(token)
    return str(detok.last_segment)


def _finalize(detok: Any) -> str:
    detok.finalize()
    return str(detok.last_segment)
