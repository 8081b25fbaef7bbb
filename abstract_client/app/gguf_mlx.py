"""Turn a llama-architecture GGUF into an MLX model directory, without torch.

MLX reads GGUF natively (``mx.load(path, return_metadata=True)``) and keeps Q4_0/Q4_1/Q8_0
tensors quantized in its own affine layout (``weight``/``scales``/``biases``), so the weights are
only renamed to mlx-lm's llama names and the per-tensor bit width goes into ``config.json``.
llama.cpp stores Q/K in the interleaved rotary layout, hence ``rope_traditional: true``. The
tokenizer is rebuilt from the GGUF's BPE vocabulary and merges with ``tokenizers``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
GROUP_SIZE = 32  # GGUF's Q4_0/Q4_1/Q8_0 block size


def _mlx_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    return f"{_TOP[parts[0]]}.{parts[1]}"


def gguf_to_mlx(gguf: Path, dest: Path) -> Path:
    import mlx.core as mx

    from .progress import progress

    loaded: Any = mx.load(str(gguf), return_metadata=True)
    weights: dict[str, Any] = loaded[0]
    meta: dict[str, Any] = loaded[1]
    if _meta(meta, "general.architecture") != "llama":
        raise ValueError(f"{gguf}: only llama-architecture GGUFs are supported")
    dest.mkdir(parents=True, exist_ok=True)
    renamed: dict[str, Any] = {}
    with progress("converting GGUF to MLX", len(weights)) as task:
        for name, array in weights.items():
            renamed[_mlx_name(name)] = array
            task.advance()
    quant: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": 4}
    for name, scales in renamed.items():
        if name.endswith(".scales"):
            module = name[: -len(".scales")]
            bits = renamed[module + ".weight"].shape[-1] * 32 // (scales.shape[-1] * GROUP_SIZE)
            if bits != quant["bits"]:
                quant[module] = {"group_size": GROUP_SIZE, "bits": bits}
    mx.save_safetensors(str(dest / "model.safetensors"), renamed, metadata={"format": "mlx"})
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    config = {
        "model_type": "llama",
        "hidden_size": _meta(meta, "llama.embedding_length"),
        "num_hidden_layers": _meta(meta, "llama.block_count"),
        "intermediate_size": _meta(meta, "llama.feed_forward_length"),
        "num_attention_heads": _meta(meta, "llama.attention.head_count"),
        "num_key_value_heads": _meta(meta, "llama.attention.head_count_kv"),
        "rms_norm_eps": _meta(meta, "llama.attention.layer_norm_rms_epsilon"),
        "vocab_size": len(tokens),
        "max_position_embeddings": _meta(meta, "llama.context_length"),
        "rope_theta": _meta(meta, "llama.rope.freq_base"),
        "rope_traditional": True,
        "tie_word_embeddings": "lm_head.weight" not in renamed,
        "bos_token_id": _meta(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _meta(meta, "tokenizer.ggml.eos_token_id"),
    }
    if any(n.endswith(".scales") for n in renamed):
        config["quantization"] = quant
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(meta, tokens, config, dest)
    return dest


def _meta(meta: dict[str, Any], key: str) -> Any:
    value = meta[key]
    return value.item() if hasattr(value, "item") else value


def _write_tokenizer(meta: dict[str, Any], tokens: list[str], config: dict[str, Any], dest: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if _meta(meta, "tokenizer.ggml.model") != "gpt2":
        raise ValueError("only byte-level BPE (tokenizer.ggml.model = gpt2) tokenizers are supported")
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    types = meta["tokenizer.ggml.token_type"]
    types = types.tolist() if hasattr(types, "tolist") else list(types)
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    # SmolLM's pre-tokenizer: single digits, then GPT-2 byte-level splitting.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    control = [tokens[i] for i, kind in enumerate(types) if kind == 3]  # GGUF token type 3: control
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.save(str(dest / "tokenizer.json"))

    def token(key: str) -> str | None:
        return tokens[_meta(meta, key)] if key in meta else None

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(_meta(meta, "tokenizer.ggml.add_bos_token"))
        if "tokenizer.ggml.add_bos_token" in meta
        else False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": _meta(meta, "tokenizer.chat_template") if "tokenizer.chat_template" in meta else None,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
