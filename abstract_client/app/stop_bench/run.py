"""``abstract-client bench stop``: each client, stopped by its own best way and then given this
library, on real servers and the bundled fakes; one row per (server, client, way, mode).

The servers run here; each client runs in the peers' venv (``venvs.py``), in a process of its
own (``drive.py``), so the harness never shares an interpreter with a client it measures. Every
"stopped" is the server's own evidence (``servers.py``), never the client's word.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .kit import Trial
from .servers import SERVERS, Server
from .venvs import python_for

ROOT = Path(__file__).resolve().parents[3]

PEERS = {  # driver module: (the name users know, its venv)
    "openai_python": ("openai-python", "peers"),
    "anthropic_sdk": ("anthropic SDK", "peers"),
    "litellm_sdk": ("LiteLLM SDK", "peers"),
    "langchain": ("LangChain", "peers"),
    "pydantic_ai": ("pydantic-ai", "peers"),
    "llamaindex": ("LlamaIndex", "openai-2"),
    "ollama_python": ("ollama-python", "peers"),
    "abstractcore": ("AbstractCore", "abstractcore"),
    "this_library": ("abstract-client", "peers"),
}
# (stage, streamed?, style): the stop pressed while the answer is decoded, from a thread or in
# an asyncio app; then while the (long) prompt is still being read, from a thread
MODES = (
    ("decode", False, "thread"),
    ("decode", True, "thread"),
    ("decode", False, "task"),
    ("decode", True, "task"),
    ("prefill", False, "thread"),
    ("prefill", True, "thread"),
)
MAX_TOKENS = 300
Row = dict[str, Any]


@dataclass
class Plan:
    servers: tuple[str, ...] = ("llamacpp", "vllm", "ollama", "lmstudio", "litellm-proxy", "serve")
    peers: tuple[str, ...] = tuple(PEERS)
    modes: tuple[tuple[str, bool, str], ...] = MODES
    trials: int = 3
    cost: bool = True
    refresh: bool = False


class Driver:
    """One client's process in its venv: a JSON request a line in, a JSON answer a line out."""

    def __init__(self, peer: str, python: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "HF_HUB_OFFLINE": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM fetches prices from GitHub at import
        }
        self.peer = peer
        self.proc = subprocess.Popen(
            [str(python), "-m", "abstract_client.app.stop_bench.drive"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, "peer": self.peer, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"the driver process ended (exit {self.proc.wait(10)})"}
        return dict(json.loads(line))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def note(server: str, client: str, text: str, version: str = "") -> Row:
    return {"kind": "note", "server": server, "client": client, "version": version, "note": " ".join(text.split())}


def trial_once(driver: Driver, server: Server, way: str, mode: tuple[str, bool, str]) -> dict[str, Any]:
    stage, streamed, style = mode
    cue = Path(tempfile.gettempdir()) / f"stop-bench-{os.getpid()}-{time.perf_counter_ns()}"
    trial = Trial(
        server=server.lane,
        url=server.url,
        model=server.model,
        prompt=server.stage(stage),
        max_tokens=MAX_TOKENS,
        stream=streamed,
        style=style,
        cue=str(cue),
        extra=server.extra,
        api_key=server.api_key,
    )
    watch = server.watch()
    answered = threading.Event()

    def cue_when_ready() -> None:  # Stop is pressed where the server's evidence says the stage is
        began = time.perf_counter()
        while not answered.is_set() and time.perf_counter() - began < 120:
            if watch.ready(stage, began):
                cue.touch()
                return
            answered.wait(0.003)

    threading.Thread(target=cue_when_ready, daemon=True).start()
    try:
        seen = driver.ask("stop", way=way, trial=asdict(trial))
    finally:
        answered.set()
        cue.unlink(missing_ok=True)
    if "error" in seen:
        watch.settle(time.perf_counter(), timeout=30)
        return seen
    pressed = seen["pressed"]
    evidence = watch.settle(pressed if pressed is not None else seen["released"])
    seen["evidence"] = evidence.__dict__
    return seen


def row_of(
    server: Server, client: str, version: str, way: str, mode: tuple[str, bool, str], trials: list[dict[str, Any]]
) -> Row:
    stage, streamed, style = mode
    pressed = [t for t in trials if t.get("pressed") is not None]
    base: Row = {
        "kind": "stop",
        "server": server.name,
        "client": client,
        "version": version,
        "way": way,
        "mode": "streamed" if streamed else "not streamed",
        "stage": stage,
        "style": style,
        "how": trials[0].get("how", ""),
        "n": len(pressed),
    }
    if not pressed:
        why = sorted({" ".join(t.get("error", "the answer ended before the stop").split()) for t in trials})
        return {**base, "note": "; ".join(why)}

    def med(values: Iterable[float | None]) -> float | None:
        got = [v for v in values if v is not None]
        return round(statistics.median(got), 2) if got else None

    ev = [t["evidence"] for t in pressed]
    whole = all(not t["caught"] and not e["stopped"] for t, e in zip(pressed, ev, strict=True))
    caught = collections.Counter(t["caught"] or "none" for t in pressed).most_common(1)[0][0]
    return {
        **base,
        "released_ms": med((t["released"] - t["pressed"]) * 1000 for t in pressed),
        "server_stopped": all(e["stopped"] for e in ev),
        "stopped_trials": sum(1 for e in ev if e["stopped"]),
        "server_stop_ms": med(
            None if e["ended_at"] is None else (e["ended_at"] - t["pressed"]) * 1000
            for e, t in zip(ev, pressed, strict=True)
        ),
        "tokens_before_stop": med(e["decoded_before"] for e in ev),
        "tokens_after_stop": med(e["decoded_after"] for e in ev),
        "error_type": caught,
        "typed": all(t["typed"] for t in pressed),
        # a call that returned the whole answer kept no "partial" text: None
        "partial_kept": None if whole else all(t["partial_chars"] > 0 for t in pressed),
        "requests": max(e["requests"] for e in ev),
        "evidence": ev[0]["source"],
    }


def measure(plan: Plan, log: Any = None) -> list[Row]:
    """Every row of the plan: the stop rows, then the cost rows; notes for what could not run."""
    say = log or (lambda text: None)
    rows: list[Row] = []
    drivers: dict[str, Driver] = {}
    about: dict[str, dict[str, Any]] = {}
    for peer in plan.peers:
        client, group = PEERS[peer]
        try:
            driver = Driver(peer, python_for(group, plan.refresh))
        except Exception as exc:  # a peer that cannot be installed is reported, never faked
            rows.append(note("-", client, f"not installed: {exc}"))
            continue
        info = driver.ask("about")
        if "error" in info:
            rows.append(note("-", client, f"could not be imported: {info['error']}"))
            driver.close()
            continue
        drivers[peer], about[peer] = driver, info
    try:
        for name in plan.servers:
            say(f"starting {name}")
            try:
                server = SERVERS[name]()
            except Exception as exc:
                rows.append(note(name, "-", f"the server could not start: {exc}"))
                continue
            try:
                rows.extend(server_rows(server, drivers, about, plan, say))  # kept as they come
            except Exception as exc:  # a server that fails mid-run is reported, the run goes on
                rows.append(note(server.name, "-", f"failed: {type(exc).__name__}: {exc}"))
            finally:
                server.close()
        if plan.cost:
            rows += cost_rows(drivers, about, say)
    finally:
        for driver in drivers.values():
            driver.close()
    return rows


def server_rows(
    server: Server, drivers: dict[str, Driver], about: dict[str, dict[str, Any]], plan: Plan, say: Any
) -> Iterator[Row]:
    for peer, driver in drivers.items():
        info = about[peer]
        if server.lane not in info["servers"]:
            continue
        for way in info["ways"]:
            for mode in plan.modes:
                trials = [trial_once(driver, server, way, mode)]
                ran_out = trials[0].get("evidence", {}).get("stopped") is False
                # a client with no way to stop is measured once: the answer's whole length
                while len(trials) < (1 if ran_out else plan.trials) and "error" not in trials[0]:
                    trials.append(trial_once(driver, server, way, mode))
                row = row_of(server, PEERS[peer][0], info["version"], way, mode, trials)
                say(json.dumps(row))
                yield row


def cost_rows(drivers: dict[str, Driver], about: dict[str, dict[str, Any]], say: Any) -> list[Row]:
    """Unstopped, on a fake that answers at once (its own process): chunks a second of a
    2,000-token stream, and the p50 of a one-token call, per client and way; the floor is the
    standard library's ``http.client`` on the same server."""
    from ...testing.subprocess_fake import SubprocessFake

    rows: list[Row] = []
    with SubprocessFake("lmstudio", token_delay=0.0) as lmstudio, SubprocessFake("ollama", token_delay=0.0) as ollama:
        floor = Driver("plain_http", python_for("peers"))
        floor_info = {"servers": ["lmstudio"], "ways": ["own"], "version": "stdlib"}
        try:
            for peer, driver, info in [
                ("plain_http", floor, floor_info),
                *((p, d, about[p]) for p, d in drivers.items()),
            ]:
                fake = ollama if info["servers"] == ["ollama"] else lmstudio  # a /v1 client: LM Studio's
                lane = "lmstudio" if fake is lmstudio else "ollama"
                trial = Trial(
                    server=lane,
                    url=fake.url,
                    model="fake-model",
                    prompt="hi",
                    max_tokens=2000,
                    stream=True,
                    style="thread",
                    cue=None,  # never pressed
                )
                for way in info["ways"]:
                    got = driver.ask("cost", way=way, trial=asdict(trial), calls=20)
                    client = "http.client (the floor)" if peer == "plain_http" else PEERS[peer][0]
                    row = {
                        "kind": "cost",
                        "server": f"{lane} (fake, no delay)",
                        "client": client,
                        "version": info["version"],
                        "way": way,
                        **got,
                    }
                    say(json.dumps(row))
                    rows.append(row)
        finally:
            floor.close()
    return rows
