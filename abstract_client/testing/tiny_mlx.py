"""A tiny random-weight llama model for MLX, built offline in well under a second.

Hidden size 64, 2 layers, a byte-level BPE tokenizer trained on a few sentences: hundreds of
tokens per second on a CPU, deterministic with greedy sampling. For tests of the stop path, not
for answers (use SmolLM2 for those).
"""

from __future__ import annotations

import json
from pathlib import Path

_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Stop means stop, on every backend.",
    "What is the capital of France? The capital of France is Paris.",
    "Tell me a long story about a dragon who guarded a mountain of gold.",
    "Numbers like 123 and 456 appear in text too.",
]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_llama(dest: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    dest.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_TEXT * 20, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "model_max_length": 4096,
                "chat_template": TEMPLATE,
            }
        )
    )
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": hidden * 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": tok.get_vocab_size(),
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    (dest / "config.json").write_text(json.dumps(config))
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))  # type: ignore[no-untyped-call]
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    return dest
