"""The examples and the README's main job run, and say what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .helpers import needs_mlx

ROOT = Path(__file__).resolve().parent.parent


def run(script: str, timeout: float = 180) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_quickstart() -> None:
    out = run("quickstart.py")
    assert "The capital of France is Paris." in out and "stopped: reason=user" in out
    assert "sent 0 tokens after it" in out


def test_stop_with_event() -> None:
    assert "stopped by the UI" in run("stop_with_event.py")


def test_abort_controller_asyncio() -> None:
    out = run("abort_controller_asyncio.py")
    assert "stopped (user)" in out and "stopped (timeout)" in out and "task cancelled" in out


def test_describe_image() -> None:
    out = run("describe_image.py")
    assert out.count("with images [69] bytes") == 3  # the same PNG on three wires
    assert "/api/chat" in out and "refused before sending" in out and "never fetches" in out


def test_swap_backends() -> None:
    out = run("swap_backends.py")
    assert "[openai-compatible] stopped" in out and "[ollama] stopped" in out


@needs_mlx
def test_main_job_demo_on_real_smollm2() -> None:
    out = run("demo.py", timeout=600)
    assert "Paris" in out
    assert "[stopped] reason=user" in out and "40 tokens delivered" in out


def test_tools_agent_stop_mid_call_then_next_turn() -> None:
    out = run("tools_agent.py")
    assert "complete calls kept: ['get_weather']; call being written dropped: get_time" in out
    assert "next turn: It is sunny in Paris." in out
