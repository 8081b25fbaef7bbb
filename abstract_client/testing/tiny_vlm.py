"""A tiny random-weight LLaVA (a CLIP vision tower + a small llama) for mlx-vlm, built offline.

What it is for: tests and benchmarks of the vision lane's stop path (vision encode, prefill,
decode), not answers. The text side reuses the tiny tokenizer of :mod:`tiny_mlx` plus an
``<image>`` token; the chat template turns an image part into ``<image>``, which the processor
expands into one token per image patch; ``preprocessor_config.json`` is CLIP's (transformers
falls back to PIL: no torch needed).

``vision_layers`` / ``vision_hidden`` / ``image_size`` size the vision tower, so a benchmark can
make the vision encode long enough to measure where its stop lands.
"""

from __future__ import annotations

import json
from pathlib import Path

from .tiny_mlx import build_tiny_llama

__all__ = ["VISION_TEMPLATE", "build_tiny_llava"]

# Hugging Face's LLaVA templates take content as a list of {"type": "text"|"image"} parts.
VISION_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_llava(
    dest: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    vision_hidden: int = 64,
    vision_layers: int = 2,
    image_size: int = 112,
    patch_size: int = 14,
    seed: int = 0,
) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models import llava
    from tokenizers import AddedToken, Tokenizer

    dest.mkdir(parents=True, exist_ok=True)
    build_tiny_llama(dest, hidden=hidden, layers=layers, seed=seed)  # the tokenizer and text config
    tok = Tokenizer.from_file(str(dest / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<image>", special=True, normalized=False)])
    tok.save(str(dest / "tokenizer.json"))
    image_token = tok.token_to_id("<image>")
    tokenizer_config = json.loads((dest / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = VISION_TEMPLATE
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    text = json.loads((dest / "config.json").read_text())
    text["vocab_size"] = tok.get_vocab_size()
    config = {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "image_token_index": image_token,
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "vocab_size": text["vocab_size"],
        "eos_token_id": 1,
        "text_config": text,
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": vision_hidden,
            "num_hidden_layers": vision_layers,
            "intermediate_size": vision_hidden * 2,
            "num_attention_heads": 4,
            "image_size": image_size,
            "patch_size": patch_size,
            "projection_dim": vision_hidden,
            "num_channels": 3,
            "layer_norm_eps": 1e-5,
        },
    }
    (dest / "config.json").write_text(json.dumps(config))
    clip_mean, clip_std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    (dest / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "CLIPImageProcessor",
                "processor_class": "LlavaProcessor",
                "do_resize": True,
                "size": {"shortest_edge": image_size},
                "do_center_crop": True,
                "crop_size": {"height": image_size, "width": image_size},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": clip_mean,
                "image_std": clip_std,
                "do_convert_rgb": True,
                "resample": 3,
            }
        )
    )
    (dest / "processor_config.json").write_text(
        json.dumps(
            {
                "processor_class": "LlavaProcessor",
                "patch_size": patch_size,
                "vision_feature_select_strategy": "default",
                "image_token": "<image>",
                "num_additional_image_tokens": 1,  # CLIP's class token (dropped by "default")
            }
        )
    )
    mx.random.seed(seed)
    model_config = llava.ModelConfig.from_dict(config)
    model_config.text_config = llava.TextConfig.from_dict(config["text_config"])
    model_config.vision_config = llava.VisionConfig.from_dict(config["vision_config"])
    model = llava.Model(model_config)
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    (dest / "model.safetensors").unlink()
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    return dest
