"""Resumable generations on a real llama-server and a real vLLM (issue #42): resumed through
random cuts, and the stop.

* Resume: ``runs`` greedy streams of 200 tokens through ``tests/cutting_proxy.py``, each cut
  ``cuts`` times at random bytes (seeded); each compared delta by delta with an uninterrupted
  run: tokens lost and tokens repeated (a diff of the two delta lists), and the wall time beside
  the uninterrupted one. llama-server resumes by byte (``/v1/stream``), vLLM by event (a
  Responses ``background`` response, ``starting_after``).
* Stop: ``n`` stops pressed after 5 chunks on each path — foreground (the sever), and resumable
  (the server's own cancel, then the sever: llama-server's ``DELETE /v1/stream``, vLLM's
  ``POST /v1/responses/{id}/cancel``): stop → raise, and stop → engine stopped (llama-server's
  ``/slots`` idle, vLLM's ``vllm:num_requests_running`` 0, polled every 2 ms: the engine's own
  word), p50/p99 in ms. Beside them, what a sever alone does to a resumable stream: the engine
  keeps decoding.

Usage: python benchmarks/bench_resumable.py [--engine llama|vllm|both --runs 10 --cuts 5 -n 20]
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _tables import pct, print_table

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.testing.processes import (
    LlamaServer,
    VLLMServer,
    llama_server_binary,
    smollm2_gguf,
    vllm_environment,
)
from tests.cutting_proxy import CuttingProxy

STORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a long story about a dragon."},
]
GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 7, "max_tokens": 200, "ignore_eos": True}


def deltas(lane: str, url: str, **options: Any) -> tuple[list[str], float]:
    with create_llm(lane, "smollm2", base_url=url, max_retries=0) as llm:
        t0 = time.perf_counter()
        with llm.stream(messages=STORY, **{**GREEDY, **options}) as stream:
            out = [c.delta for c in stream if c.delta]
        return out, time.perf_counter() - t0


def resume_rows(
    lane: str,
    server: LlamaServer | VLLMServer,
    runs: int,
    cuts: int,
    *,
    cut_after: tuple[int, int] = (1_000, 8_000),
    reference: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``runs`` resumable streams through ``cuts`` random cuts each, diffed against an
    uninterrupted one (``reference``: its options)."""
    expected, plain_s = deltas(lane, server.url, **(reference or {}))
    lost = repeated = cut_total = 0
    took = []
    for seed in range(runs):
        proxy = CuttingProxy(server.port, seed=seed, cuts=cuts, cut_after=cut_after)
        try:
            got, seconds = deltas(lane, proxy.url, resumable=True)
        finally:
            proxy.close()
        cut_total += len(proxy.cut_at)
        took.append(seconds)
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=expected, b=got, autojunk=False).get_opcodes():
            if op in ("delete", "replace"):
                lost += i2 - i1
            if op in ("insert", "replace"):
                repeated += j2 - j1
    return [
        {
            "runs": runs,
            "cuts made": cut_total,
            "tokens per run": len(expected),
            "tokens lost": lost,
            "tokens repeated": repeated,
            "uninterrupted s": plain_s,
            "resumed s p50": pct(took, 50),
            "resumed s max": max(took),
        }
    ]


def idle(server: LlamaServer | VLLMServer) -> bool:
    """The engine's word: every ``/slots`` slot idle, or ``vllm:num_requests_running`` 0."""
    try:
        if isinstance(server, LlamaServer):
            return not any(s.get("is_processing") for s in server.slots())
        return server.running() == 0
    except (OSError, ValueError, httpx.HTTPError):
        return False


def stop_once(
    lane: str, server: LlamaServer | VLLMServer, wire: str, resumable: bool, max_tokens: int
) -> tuple[float, float]:
    """(stop → raise ms, stop → engine idle ms) of one stop after 5 chunks."""
    event = threading.Event()
    with create_llm(lane, "smollm2", base_url=server.url, max_retries=0, wire=wire) as llm:  # type: ignore[arg-type]
        stream = llm.stream(
            messages=STORY, max_tokens=max_tokens, ignore_eos=True, resumable=resumable, cancel_event=event
        )
        stopped_at = raised_at = 0.0
        try:
            for i, _ in enumerate(stream):
                if i == 5:
                    stopped_at = time.perf_counter()
                    event.set()
        except GenerationCancelledError:
            raised_at = time.perf_counter()
        while not idle(server):
            if time.perf_counter() - stopped_at > 30:
                return (raised_at - stopped_at) * 1000, float("nan")
            time.sleep(0.002)
        idle_at = time.perf_counter()
    while not idle(server):
        time.sleep(0.01)
    return (raised_at - stopped_at) * 1000, (idle_at - stopped_at) * 1000


def stop_rows(
    lane: str,
    server: LlamaServer | VLLMServer,
    paths: tuple[tuple[str, str, bool], ...],
    n: int,
    max_tokens: int,
) -> list[dict[str, Any]]:
    """One row per (label, wire, resumable): stop → raise and stop → engine stopped, p50/p99."""
    rows = []
    for label, wire, resumable in paths:
        raised, stopped = zip(*(stop_once(lane, server, wire, resumable, max_tokens) for _ in range(n)), strict=True)
        rows.append(
            {
                "path": label,
                "n": n,
                "stop→raise p50": pct(list(raised), 50),
                "p99": pct(list(raised), 99),
                "stop→engine stopped p50": pct(list(stopped), 50),
                "p99 ": pct(list(stopped), 99),
            }
        )
    return rows


def sever_only(server: LlamaServer) -> float:
    """A resumable stream's connection closed with no DELETE: how many tokens it decodes on in 2 s."""
    body = {"messages": STORY, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": "bench-sever-only"}
    ) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 10:
                break
    before = server.n_decoded()
    time.sleep(2)
    after = server.n_decoded()
    httpx.delete(server.url + "/v1/stream", params={"conv_id": "bench-sever-only"})
    while not idle(server):
        time.sleep(0.01)
    return after - before


# -- vLLM: the Responses API's background mode --------------------------------------------------


def vllm_sever_only(server: VLLMServer) -> float:
    """A background response's connection closed with no cancel: tokens it generates on in 2 s."""
    body = {
        "model": "smollm2",
        "input": "Write a very long story about a dragon.",
        "max_output_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
        "background": True,
        "request_id": "resp_bench-sever-only",
    }
    with httpx.stream("POST", server.url + "/v1/responses", json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 30:
                break
    before = server.generation_tokens()
    time.sleep(2)
    after = server.generation_tokens()
    httpx.post(server.url + "/v1/responses/resp_bench-sever-only/cancel")
    while not idle(server):
        time.sleep(0.01)
    return after - before


def vllm_main(args: argparse.Namespace) -> None:
    env = vllm_environment()
    if env is None:
        sys.exit("the vLLM venv or the SmolLM2 HF model is missing: run scripts/get_vllm.sh")
    with tempfile.TemporaryDirectory() as tmp:
        if args.vllm_port:  # a running server (started with VLLM_ENABLE_RESPONSES_API_STORE=1)
            server = VLLMServer(["(running)"], args.vllm_port, Path(tmp) / "vllm.log")
        else:
            server = VLLMServer.launch(env[0], env[1], log_path=Path(tmp) / "vllm.log")
        try:
            print_table(
                f"Resume through random cuts ({args.cuts} per run; vLLM background response, SmolLM2, greedy)",
                resume_rows(
                    "vllm", server, args.runs, args.cuts, cut_after=(2_000, 12_000), reference={"resumable": True}
                ),
            )
            paths = (
                ("chat stream (sever)", "chat", False),
                ("responses, foreground (sever)", "responses", False),
                ("resumable=True: background (cancel + sever)", "chat", True),
            )
            rows = stop_rows("vllm", server, paths, args.n, max_tokens=1500)
            print_table("vLLM stop (ms; engine stopped = vllm:num_requests_running 0)", rows, digits=1)
            severed = vllm_sever_only(server)
            print(f"\na background response severed with no cancel generated {severed:.0f} more tokens in 2 s")
        finally:
            if not args.vllm_port:
                server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=("llama", "vllm", "both"), default="both")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cuts", type=int, default=5)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--vllm-port", type=int, default=0, help="use a running vLLM instead of starting one")
    args = parser.parse_args()
    if args.engine in ("llama", "both"):
        llama_main(args)
    if args.engine in ("vllm", "both"):
        vllm_main(args)


def llama_main(args: argparse.Namespace) -> None:
    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        sys.exit("llama-server or the SmolLM2 GGUF is missing: scripts/get_llama_server.sh, scripts/get_model.py")
    with tempfile.TemporaryDirectory() as tmp:
        server = LlamaServer.launch(binary, model, log_path=Path(tmp) / "server.log")
        try:
            print_table(
                f"Resume through random cuts ({args.cuts} per run; llama-server, SmolLM2, greedy)",
                resume_rows("llamacpp", server, args.runs, args.cuts),
            )
            paths = (
                ("chat stream (sever)", "chat", False),
                ("responses, foreground (sever)", "responses", False),
                ("resumable=True (DELETE + sever)", "chat", True),
            )
            rows = stop_rows("llamacpp", server, paths, args.n, max_tokens=2000)
            print_table("Stop (ms; engine stopped = /slots idle)", rows, digits=1)
            print(f"\na resumable stream severed with no DELETE decoded {sever_only(server)} more tokens in 2 s")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
