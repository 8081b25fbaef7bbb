"""What a user without a checkout gets: the wheel, installed into a fresh venv outside this
tree, prepares the engines with the files it ships (``abstract-client prepare``)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_prepare_works_from_an_installed_wheel(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], cwd=tmp_path)
    (wheel,) = dist.glob("abstract_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("get_llama_server.sh", "get_llama_cpp_python.sh", "get_vllm.sh", "gguf_to_hf.py"):
        assert f"abstract_client/app/engines/{shipped}" in names, names
    # A fresh venv outside the checkout; its dependencies come from this machine's site-packages
    # (the point is what the wheel ships, not re-downloading mlx), the package from the wheel.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LLAMA_SERVER")}
    where = run([str(python), "-c", "import abstract_client; print(abstract_client.__file__)"], cwd=tmp_path, env=env)
    assert Path(where.strip()).is_relative_to(venv), where  # the wheel's copy, not this checkout
    cli = str(venv / "bin" / "abstract-client")
    mlx_dir = Path(run([cli, "prepare", "smollm2-mlx"], cwd=tmp_path, env=env).strip().splitlines()[-1])
    assert (mlx_dir / "config.json").is_file()
    binary = Path(run([cli, "prepare", "llama-server"], cwd=tmp_path, env=env).strip().splitlines()[-1])
    assert binary.name == "llama-server" and os.access(binary, os.X_OK)  # the cached build, reused
