"""What a user without a checkout gets: the wheel, installed into a fresh venv outside this
tree, prepares the engines with the files it ships (``abstract-client prepare``), installs no
generic top-level package, and works beside an application's own ``providers``, ``tests`` and
``app`` packages — installed from the wheel and editable."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LLAMA_SERVER")}


def make_venv(where: Path) -> Path:
    """A fresh venv whose dependencies are this interpreter's (the point is what the wheel ships,
    not re-downloading mlx). Not ``--system-site-packages``: run from inside a venv, that means
    the *base* interpreter's packages, which lack ours. A ``.pth`` line per site directory of
    this interpreter instead; the lines are plain paths, so the ``.pth`` files in them (this
    checkout's editable install among them) are not processed."""
    run([sys.executable, "-m", "venv", str(where)], cwd=where.parent)
    python = where / "bin" / "python"
    (purelib,) = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=where).split()
    outer = [*site.getsitepackages(), site.getusersitepackages()]
    Path(purelib, "_outer_site.pth").write_text("".join(f"{p}\n" for p in outer if Path(p).is_dir()))
    return python


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], cwd=dist)
    (built,) = dist.glob("abstract_client-*.whl")
    return built


def test_the_wheel_installs_only_abstract_client(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"abstract_client"}, top
    assert "abstract_client/providers/llamacpp.py" in names and "abstract_client/providers/_engine.py" in names
    assert not [n for n in names if "__pycache__" in n]


def test_prepare_works_from_an_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("get_llama_server.sh", "get_llama_cpp_python.sh", "get_vllm.sh", "gguf_to_hf.py"):
        assert f"abstract_client/app/engines/{shipped}" in names, names
    python = make_venv(tmp_path / "venv")
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], cwd=tmp_path)
    env = clean_env()
    where = run([str(python), "-c", "import abstract_client; print(abstract_client.__file__)"], cwd=tmp_path, env=env)
    assert Path(where.strip()).is_relative_to(tmp_path / "venv"), where  # the wheel's copy, not this checkout
    cli = str(tmp_path / "venv" / "bin" / "abstract-client")
    mlx_dir = Path(run([cli, "prepare", "smollm2-mlx"], cwd=tmp_path, env=env).strip().splitlines()[-1])
    assert (mlx_dir / "config.json").is_file()
    binary = Path(run([cli, "prepare", "llama-server"], cwd=tmp_path, env=env).strip().splitlines()[-1])
    assert binary.name == "llama-server" and os.access(binary, os.X_OK)  # the cached build, reused


# An application whose own top-level packages carry the generic names: each one would break
# the library if the library imported (or installed) anything by that name.
APP_MAIN = textwrap.dedent(
    """
    import sys
    import providers, tests, app
    assert providers.MINE and tests.MINE and app.MINE
    from abstract_client import create_llm
    from abstract_client.testing import FakeOpenAIServer
    with FakeOpenAIServer() as server:
        for lane in ("llamacpp", "openai-compatible", "vllm"):
            llm = create_llm(lane, "m", base_url=server.base_url)
            print(lane, repr(llm.generate("hi", max_tokens=3).content))
            llm.close()
    import abstract_client.providers as lanes
    print("lanes", lanes.__file__)
    assert sys.modules["providers"] is providers  # the app's own, untouched
    """
)


def app_dir(where: Path) -> Path:
    where.mkdir()
    for package in ("providers", "tests", "app"):
        (where / package).mkdir()
        (where / package / "__init__.py").write_text("MINE = True\n")
    (where / "providers" / "llamacpp.py").write_text("raise ImportError('the app's own module, not a lane')\n")
    (where / "main.py").write_text(APP_MAIN)
    return where


@pytest.mark.parametrize("install", ["wheel", "editable"])
def test_an_app_with_its_own_providers_tests_and_app_packages(wheel: Path, tmp_path: Path, install: str) -> None:
    python = make_venv(tmp_path / "venv")
    target = [str(wheel)] if install == "wheel" else ["-e", str(ROOT)]
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", *target], cwd=tmp_path)
    app = app_dir(tmp_path / "myapp")
    out = run([str(python), "main.py"], cwd=app, env=clean_env(), timeout=120)
    for lane in ("llamacpp", "openai-compatible", "vllm"):
        assert f"{lane} '" in out, out
    lanes = Path(out.split("lanes ")[1].split()[0])
    expected = (tmp_path / "venv") if install == "wheel" else ROOT / "providers"
    assert lanes.is_relative_to(expected), out
