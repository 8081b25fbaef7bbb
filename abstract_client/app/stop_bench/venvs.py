"""The peers' venvs: made once per Python version under the cache, at the versions the package
index has the day they are made (``--refresh`` makes them again), never the project's extras.
LlamaIndex and AbstractCore pin openai-python 2.x, so each has a venv of its own. A peer that pip cannot install
is reported with pip's words, never faked."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

GROUPS = {
    "peers": (
        "openai",
        "anthropic",
        "litellm",
        "langchain-openai",
        "pydantic-ai-slim[openai]",
        "ollama",
    ),
    # AbstractCore 2.30 pins openai-python 2.x and anthropic 0.x: beside the others pip would
    # take an old AbstractCore (2.18), so it has a venv of its own, at its newest
    "abstractcore": ("abstractcore",),
    "openai-2": ("llama-index-llms-openai-like",),
    "litellm-proxy": ("litellm[proxy]",),  # a server: its own venv, so the SDK's row keeps the newest
}


def core_requirements() -> list[str]:
    """This library's own dependencies (its extras left out): its rows import it from the tree."""
    required = importlib.metadata.requires("abstract-client") or []
    return [r.split(";")[0].strip() for r in required if "extra ==" not in r]


def venv_python(
    name: str, requirements: tuple[str, ...] | list[str], *, refresh: bool = False, inherit: bool = False
) -> Path:
    """The interpreter of the venv ``name`` with ``requirements`` installed: under the cache, per
    Python version, keyed by what it holds (a change of requirements makes a new one), made once
    (marked complete only when pip succeeded); ``inherit``: this interpreter's packages stand
    behind its own (a ``.pth`` names them). RuntimeError with pip's words if they cannot be
    installed."""
    key = hashlib.sha256(" ".join(requirements).encode()).hexdigest()[:10]
    version = f"py{sys.version_info.major}.{sys.version_info.minor}"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "abstract-client"
    venv = cache / f"{name}-{version}-{key}"
    python = venv / "bin" / "python"
    if refresh and venv.exists():
        shutil.rmtree(venv)
    if (venv / ".complete").exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
    if inherit:
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        (Path(purelib) / "parent-environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        words = [line for line in done.stderr.splitlines() if not line.startswith("WARNING: Location")]
        raise RuntimeError(f"pip could not install {' '.join(requirements)}: {' '.join(words)[-1000:]}")
    (venv / ".complete").touch()
    return python


def python_for(group: str, refresh: bool = False) -> Path:
    """The group's venv's interpreter; RuntimeError with pip's words if it cannot be installed."""
    return venv_python(f"stop-bench-{group}", [*GROUPS[group], *core_requirements()], refresh=refresh)
