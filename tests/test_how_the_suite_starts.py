"""The suite passes however it is started: with SIGINT ignored (a CI runner, cron, ``bash -c
'… &'``) and from ``nohup`` with no terminal and no standard input.

A process started with SIGINT ignored keeps it ignored: Python then installs no
``default_int_handler``, and every child inherits ``SIG_IGN``. The module that touches SIGINT,
stdin and terminals is ``tests/test_cli.py`` (a real pseudo-terminal, a real Ctrl-C, the line
reader's handler); it runs here in a child pytest started each of those ways.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIGNAL_TESTS = "tests/test_cli.py"


def _child_pytest() -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", SIGNAL_TESTS]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _assert_passed(out: subprocess.CompletedProcess[str], how: str) -> None:
    tail = "\n".join(out.stdout.strip().splitlines()[-15:])
    assert out.returncode == 0, f"{SIGNAL_TESTS} started {how} failed:\n{tail}\n{out.stderr[-2000:]}"
    assert " passed" in tail and " failed" not in tail, tail


def test_the_suite_passes_with_sigint_ignored() -> None:
    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    out = subprocess.run(
        _child_pytest(),
        cwd=ROOT,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=ignore_sigint,
    )
    _assert_passed(out, "with SIGINT ignored")


def test_the_suite_passes_under_nohup_without_a_terminal(tmp_path: Path) -> None:
    nohup = shutil.which("nohup")
    if nohup is None:  # coreutils: on every machine the README names
        pytest.fail("nohup is not on PATH")
    log = tmp_path / "nohup.out"
    with log.open("w") as sink:
        # nohup ignores SIGHUP; a shell's `&` ignores SIGINT and SIGQUIT in the background job
        out = subprocess.run(
            ["bash", "-c", 'set -m; trap "" INT; exec "$@"', "bash", nohup, *_child_pytest()],
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=600,
            start_new_session=True,  # no controlling terminal
        )
    _assert_passed(subprocess.CompletedProcess(out.args, out.returncode, log.read_text(), ""), "under nohup")
