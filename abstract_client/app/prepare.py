"""``abstract-client prepare``: build or fetch the real engines, with a progress bar.

The build steps are shell scripts shipped inside the package (``engines/``, package data: a
wheel has them, no checkout needed; the checkout's ``scripts/get_*.sh`` call the same files).
This wraps them for people: llama-server's CMake ``[ NN%]`` lines drive a progress bar, the vLLM
venv gets a spinner.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ENGINES = Path(__file__).resolve().parent / "engines"
_PERCENT = re.compile(r"\[\s*(\d+)%\]")


def _script(name: str) -> Path:
    path = ENGINES / name
    if not path.is_file():  # a broken install: the package data is part of every wheel
        raise FileNotFoundError(f"{path} is missing from the installed package")
    return path


def prepare(what: str) -> Path:
    from .assets import smollm2_gguf, smollm2_hf, smollm2_mlx

    if what == "smollm2":
        return smollm2_gguf()
    if what == "smollm2-mlx":
        return smollm2_mlx()
    if what == "smollm2-hf":
        return smollm2_hf()
    if what == "llama-server":
        return _run_with_progress(["bash", str(_script("get_llama_server.sh"))], "building llama-server")
    if what == "llama-cpp-python":  # the gguf lane's bindings, over llama-server's build
        return _run_with_progress(["bash", str(_script("get_llama_cpp_python.sh"))], "llama-cpp-python")
    if what == "vllm":
        return _run_with_progress(["bash", str(_script("get_vllm.sh"))], "preparing the vLLM CPU venv")
    raise ValueError(f"unknown target {what!r}")


def _run_with_progress(argv: list[str], description: str) -> Path:
    from .progress import progress

    with progress(description, 100, percent=True) as bar:
        env = {**os.environ, "ABSTRACT_CLIENT_PYTHON": sys.executable}  # the scripts' Python has us
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stderr is not None and proc.stdout is not None
        tail: list[str] = []
        for line in proc.stderr:
            tail = [*tail, line.rstrip()][-30:]
            match = _PERCENT.search(line)
            if match:
                bar.update(completed=int(match.group(1)))
            elif line.startswith(">>"):
                bar.update(description=f"{description}: {line[2:].strip()[:60]}")
        out = proc.stdout.read().strip().splitlines()
        if proc.wait() != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n" + "\n".join(tail))
        bar.update(completed=100)
    return Path(out[-1].split()[-1]) if out else Path()
