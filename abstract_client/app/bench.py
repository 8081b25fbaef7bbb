"""``abstract-client bench cancel``: the lane table of ``docs/cancellation.md``.

For each lane — the three fake servers (always), and a real llama-server, vLLM and MLX when this
machine has them — stop → raise latency (p50/p99) for streaming, non-streaming and prefill, next
to the server's own evidence of the stop. Lanes that are not available are listed as skipped
with the reason, never silently dropped.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import GenerationCancelledError
from ..llm import LLM
from ..registry import create_llm
from ..stopping.abort import AbortController

CASES = ("stream", "non-stream", "prefill")
Row = dict[str, Any]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(v for v in values if v == v)  # NaN (a stop that did not land) is left out
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def stop_once(
    llm: LLM, case: str, *, prompt: str, long_prompt: str, delay: float, after_chunks: int = 3, **kw: Any
) -> tuple[float, float, str]:
    """One generation stopped from another thread; returns (stop time, raise time, request id)."""
    controller = AbortController()
    request_id = f"bench-{time.perf_counter_ns()}"
    raised = float("nan")
    try:
        if case == "stream":
            for i, _ in enumerate(
                llm.stream(prompt, max_tokens=2000, signal=controller.signal, request_id=request_id, **kw)
            ):
                if i + 1 == after_chunks:
                    threading.Thread(target=controller.abort).start()
        else:
            threading.Timer(delay, controller.abort).start()
            llm.generate(
                long_prompt if case == "prefill" else prompt,
                max_tokens=2000,
                signal=controller.signal,
                request_id=request_id,
                **kw,
            )
    except GenerationCancelledError:
        raised = time.perf_counter()
    stopped = controller.signal.aborted_at or float("nan")
    return stopped, raised, request_id


def _rows(lane: str, per_case: dict[str, tuple[list[float], str]]) -> list[Row]:
    return [
        {
            "lane": lane,
            "case": case,
            "n": len(v),
            "p50_ms": round(pct(v, 50), 3),
            "p99_ms": round(pct(v, 99), 3),
            "server_evidence": ev,
        }
        for case, (v, ev) in per_case.items()
    ]


# -- lanes ------------------------------------------------------------------------------------------


def lane_fake(kind: str, n: int) -> list[Row]:
    from ..testing.subprocess_fake import SubprocessFake

    provider = {"openai": "openai-compatible", "ollama": "ollama", "lmstudio": "lmstudio"}[kind]
    out: dict[str, tuple[list[float], str]] = {}
    with (
        SubprocessFake(kind, token_delay=0.01) as server,
        create_llm(provider, "fake-model", base_url=server.base_url, max_retries=0) as llm,
    ):
        for case in CASES:
            server.set(prefill_delay=1.0 if case == "prefill" else 0.0)
            raise_ms, eof_ms = [], []
            for _ in range(n):
                stopped, raised, _ = stop_once(llm, case, prompt="x", long_prompt="x", delay=0.2)
                raise_ms.append((raised - stopped) * 1000)
                eof_ms.append((server.wait_for_disconnect() - stopped) * 1000)
            out[case] = (raise_ms, f"server saw EOF p50 {pct(eof_ms, 50):.2f} ms")
    return _rows(f"fake {kind}", out)


def lane_llamacpp(n: int) -> list[Row]:
    from ..testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        raise _Skip("no llama-server build or model (abstract-client prepare llama-server; prepare smollm2)")
    out: dict[str, tuple[list[float], str]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        _closing(LlamaServer.launch(binary, model, log_path=Path(tmp) / "server.log")) as server,
        create_llm("llamacpp", "smollm2", base_url=server.url, max_retries=0) as llm,
    ):
        long_prompt = "Summarise: " + " ".join(f"word{i % 97}" for i in range(2000))
        for case in CASES:
            raise_ms, cancel_ms = [], []
            for _ in range(n):
                server.wait_idle(10)
                before = len(server.cancelled_tasks())
                stopped, raised, _ = stop_once(
                    llm,
                    case,
                    prompt="Write a long story about a dragon.",
                    long_prompt=long_prompt,
                    delay=0.5 if case == "prefill" else 0.3,
                    ignore_eos=True,  # never let the answer end before the stop by chance
                )
                raise_ms.append((raised - stopped) * 1000)
                seen = _poll(_more_cancels(server, before), 5, 0.001)
                cancel_ms.append((seen - stopped) * 1000)
            out[case] = (raise_ms, f"'cancel task' in log p50 {pct(cancel_ms, 50):.0f} ms")
    return _rows("llamacpp (real)", out)


def lane_vllm(n: int) -> list[Row]:
    from ..testing.processes import VLLMServer, vllm_environment

    env = vllm_environment()
    if env is None:
        raise _Skip("no vLLM venv (abstract-client prepare vllm)")
    out: dict[str, tuple[list[float], str]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        _closing(VLLMServer.launch(env[0], env[1], log_path=Path(tmp) / "server.log")) as server,
        create_llm("vllm", "smollm2", base_url=server.url, max_retries=0) as llm,
    ):
        long_prompt = "Summarise: " + " ".join(f"word{i % 97}" for i in range(600))
        for case in CASES:
            raise_ms, idle_ms = [], []
            for _ in range(n):
                _poll(lambda: server.running() == 0, 10, 0.05)
                stopped, raised, _ = stop_once(
                    llm,
                    case,
                    prompt="Write a long story about a dragon.",
                    long_prompt=long_prompt,
                    delay=1.0 if case == "prefill" else 0.5,
                    ignore_eos=True,
                )
                raise_ms.append((raised - stopped) * 1000)
                idle_ms.append((_poll(lambda: server.running() == 0, 5, 0.005) - stopped) * 1000)
            out[case] = (raise_ms, f"num_requests_running → 0 p50 {pct(idle_ms, 50):.0f} ms")
    return _rows("vllm (real)", out)


def lane_mlx(n: int) -> list[Row]:
    try:
        import mlx.core  # noqa: F401
    except ImportError as exc:
        raise _Skip("mlx is not installed (pip install 'abstract-client[mlx]')") from exc
    from .assets import smollm2_mlx

    return _lane_in_process("mlx", str(smollm2_mlx()), n, prefill_step_size=64)


def lane_transformers(n: int) -> list[Row]:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise _Skip("torch/transformers are not installed (pip install 'abstract-client[transformers]')") from exc
    from .assets import smollm2_hf

    return _lane_in_process("transformers", str(smollm2_hf()), n, prefill_step_size=128)


def lane_gguf(n: int) -> list[Row]:
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:  # found, not imported: the lane finds its library
        raise _Skip("llama-cpp-python is not installed (abstract-client prepare llama-cpp-python)")
    from .assets import smollm2_gguf

    return _lane_in_process("gguf", str(smollm2_gguf()), n, n_batch=512)


def _lane_in_process(lane: str, model: str, n: int, **options: Any) -> list[Row]:
    """An in-process lane: stop -> raise, stop -> engine idle, and the tokens counted after the
    engine saw the flag (its own counter: always 0)."""
    out: dict[str, tuple[list[float], str]] = {}
    with create_llm(lane, model, **options) as llm:
        provider: Any = llm.provider
        llm.load_model()
        long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 60)
        for case in CASES:
            raise_ms, after, drain_ms = [], [], []
            for _ in range(n):
                stopped, raised, rid = stop_once(
                    llm,
                    case,
                    prompt="Write a long story.",
                    long_prompt=long_prompt,
                    delay=0.5 if case == "prefill" else 1.0,
                    repetition_penalty=1.3,
                )
                raise_ms.append((raised - stopped) * 1000)
                drain_ms.append((_poll(lambda: provider.thread.idle, 10, 0.001) - stopped) * 1000)
                stats = provider.stats(rid)
                after.append(
                    0 if stats is None or stats.tokens_at_stop is None else stats.tokens - stats.tokens_at_stop
                )
            out[case] = (raise_ms, f"engine idle p50 {pct(drain_ms, 50):.0f} ms; tokens after flag max {max(after)}")
    return _rows(f"{lane} (real, in-process)", out)


# -- driver -----------------------------------------------------------------------------------------


class _Skip(Exception):
    pass


@contextlib.contextmanager
def _closing(server: Any) -> Iterator[Any]:
    try:
        yield server
    finally:
        server.stop()


def _more_cancels(server: Any, before: int) -> Callable[[], bool]:
    return lambda: len(server.cancelled_tasks()) > before


def _poll(predicate: Callable[[], bool], timeout: float, interval: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.perf_counter()
        time.sleep(interval)
    return float("nan")


def _note_row(lane: str, note: str) -> Row:
    """A lane with no figures (skipped or failed), listed with the reason."""
    return {"lane": lane, "case": "-", "n": 0, "p50_ms": None, "p99_ms": None, "server_evidence": note}


def collect(lanes: str, n: int) -> list[Row]:
    wanted = [name.strip() for name in lanes.split(",") if name.strip()]
    runners: list[tuple[str, Callable[[], list[Row]]]] = []

    def unknown(name: str) -> Callable[[], list[Row]]:
        def run() -> list[Row]:
            raise _Skip(f"unknown lane {name!r} (lanes: fake, llamacpp, vllm, mlx, transformers, gguf)")

        return run

    def fake(kind: str) -> Callable[[], list[Row]]:
        return lambda: lane_fake(kind, n)

    for name in wanted:
        if name == "fake":
            runners += [(f"fake {k}", fake(k)) for k in ("openai", "ollama", "lmstudio")]
        elif name == "llamacpp":
            runners.append(("llamacpp (real)", lambda: lane_llamacpp(n)))
        elif name == "vllm":
            runners.append(("vllm (real)", lambda: lane_vllm(max(1, n // 2))))
        elif name == "mlx":
            runners.append(("mlx (real, in-process)", lambda: lane_mlx(max(1, n // 2))))
        elif name == "transformers":
            runners.append(("transformers (real, in-process)", lambda: lane_transformers(max(1, n // 2))))
        elif name == "gguf":
            runners.append(("gguf (real, in-process)", lambda: lane_gguf(max(1, n // 2))))
        else:
            runners.append((name, unknown(name)))
    rows: list[Row] = []
    for lane, run in runners:
        try:
            rows += run()
        except _Skip as skip:
            rows.append(_note_row(lane, f"skipped: {skip}"))
        except Exception as exc:  # a lane that fails is reported, not hidden
            rows.append(_note_row(lane, f"failed: {type(exc).__name__}: {exc}"))
    return rows


def run_lane_table(lanes: str, n: int = 10, as_json: bool = False) -> int:
    rows = collect(lanes, n)
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="Stop → raise (ms) and the server's own evidence, per lane")
        for col in ("lane", "case", "n", "p50 ms", "p99 ms", "server evidence"):
            table.add_column(col, justify="right" if col in ("n", "p50 ms", "p99 ms") else "left")
        for r in rows:
            table.add_row(
                r["lane"], r["case"], str(r["n"]), _cell(r["p50_ms"]), _cell(r["p99_ms"]), r["server_evidence"]
            )
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)
        console.print(table)
    failed = [r for r in rows if str(r["server_evidence"]).startswith("failed")]
    return 1 if failed else 0


def _cell(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.2f}"


__all__ = ["collect", "run_lane_table"]
