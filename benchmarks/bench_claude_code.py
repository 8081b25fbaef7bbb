"""Claude Code (the binary in the ``claude-agent-sdk`` wheel) through the gateway, in front of a
real llama-server (and with ``--mlx`` in-process MLX): turn 1 and turn 2 (``--resume``) wall
times with the engine's cached-token counts, and a session killed mid-answer → the engine idle.

The floor beside each turn: the same prompt sent straight to the engine is not Claude Code's
(its request is its own), so the figure printed beside turn 2 is the engine's own prefill of the
new tokens (llama-server's ``prompt eval time`` line), the part no routing or cache can remove.

Usage: python benchmarks/bench_claude_code.py [--mlx] [--threads 2] [--full-tools]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _tables import pct, print_table

from abstract_client.gateway.config import BackendConfig, GatewayConfig
from abstract_client.testing.gateway import InProcessGateway
from abstract_client.testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

PROMPT_EVAL = re.compile(r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")
CLAUDE = os.environ.get("CLAUDE_CODE") or str(
    Path.home() / ".cache/abstract-client/claude-code/claude_agent_sdk/_bundled/claude"
)


def run(gw: InProcessGateway, home: Path, prompt: str, *args: str, tokens: int) -> subprocess.Popen[str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": gw.url,
        "ANTHROPIC_API_KEY": "unused",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(tokens),
    }
    argv = [CLAUDE, "-p", prompt, "--model", "smollm2", "--max-turns", "1", "--output-format", "json", *args]
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=home, env=env
    )


def turns(gw: InProcessGateway, home: Path, extra: tuple[str, ...], prompts: tuple[str, str]) -> list[dict[str, Any]]:
    session = str(uuid.uuid4())
    rows = []
    metrics = gw.gateway.metrics
    for n, (prompt, how) in enumerate(zip(prompts, ("--session-id", "--resume"), strict=True), 1):
        before = metrics.prompt_tokens["smollm2"], metrics.cached_tokens["smollm2"]
        t0 = time.perf_counter()
        out, _ = run(gw, home, prompt, how, session, *extra, tokens=256).communicate(timeout=1800)
        took = time.perf_counter() - t0
        answer = json.loads(out)
        prompt_n = metrics.prompt_tokens["smollm2"] - before[0]
        cached = metrics.cached_tokens["smollm2"] - before[1]
        rows.append(
            {
                "turn": n,
                "s": took,
                "requests": answer.get("num_turns"),
                "prompt tokens": prompt_n,
                "from the cache": cached,
                "share": cached / max(prompt_n, 1),
                "ok": not answer.get("is_error"),
            }
        )
    return rows


def llama(threads: int, full_tools: bool, kills: int) -> None:
    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        raise SystemExit("llama-server or the model is missing: run scripts/get_llama_server.sh, scripts/get_model.py")
    tmp = Path(tempfile.mkdtemp())
    server = LlamaServer.launch(
        binary,
        model,
        log_path=tmp / "llama.log",
        threads=threads,
        ctx=32768 if full_tools else 8192,
        extra=["--temp", "0"],
    )
    extra = () if full_tools else ("--tools", "")
    try:
        with InProcessGateway(
            GatewayConfig(backends=[BackendConfig(name="smollm2", provider="llamacpp", base_url=server.url)])
        ) as gw:
            rows = turns(gw, tmp, extra, ("Say hello in three words.", "Now say goodbye."))
            evals = PROMPT_EVAL.findall(server.log_text())
            rows[-1]["engine prefill of the new tokens ms"] = float(evals[-1][0]) if evals else float("nan")
            tools = "on" if full_tools else "off"
            print_table(f"Claude Code via the gateway → llama-server (SmolLM2, {threads} threads, tools {tools})", rows)
            idle_ms = []
            for _ in range(kills):
                proc = run(gw, tmp, "Write a very long story about a dragon.", *extra, tokens=4000)
                while (server.processing_decoded() or 0) < 10:
                    time.sleep(0.02)
                t0 = time.perf_counter()
                proc.send_signal(signal.SIGKILL)
                while not server.wait_idle(0.001):
                    pass
                idle_ms.append((time.perf_counter() - t0) * 1000)
                proc.wait()
            print_table(
                f"Claude Code killed mid-answer → llama-server's slot idle (polled /slots), n={kills} (ms)",
                [{"p50": pct(idle_ms, 50), "p99": pct(idle_ms, 99), "max": max(idle_ms)}],
            )
    finally:
        server.stop()


def mlx() -> None:
    from abstract_client.app.assets import smollm2_mlx

    tmp = Path(tempfile.mkdtemp())
    config = GatewayConfig(backends=[BackendConfig(name="smollm2", provider="mlx", model=str(smollm2_mlx()))])
    with InProcessGateway(config) as gw:
        extra = ("--tools", "", "--system-prompt", "Reply in one short sentence.")
        rows = turns(gw, tmp, extra, ("Say hi.", "Say hi again."))
        print_table(
            "Claude Code through the gateway → in-process MLX (SmolLM2, CPU build; one-sentence system prompt)", rows
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--full-tools", action="store_true", help="Claude Code's own tools and prompt (~25k tokens)")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--mlx", action="store_true", help="also in front of in-process MLX")
    args = parser.parse_args()
    llama(args.threads, args.full_tools, args.kills)
    if args.mlx:
        mlx()


if __name__ == "__main__":
    main()
