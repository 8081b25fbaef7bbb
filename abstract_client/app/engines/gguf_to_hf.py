#!/usr/bin/env python3
"""Dequantise a GGUF into a Hugging Face model directory (safetensors + config + tokenizer).

transformers can read GGUF but refuses to ``save_pretrained`` a model that carries a quantization
config, so the state dict is saved with safetensors (minus the tied ``lm_head.weight``) and the
config is written without ``quantization_config``. Runs inside the vLLM venv (torch is there).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(gguf: str, out: str) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(gguf)
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, torch_dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["tie_word_embeddings"] = True
    config["torch_dtype"] = "bfloat16"
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(dest)
    print(f"wrote {dest}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
