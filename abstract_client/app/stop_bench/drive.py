"""The peers' side of ``abstract-client bench stop``, run in the peers' venv: one JSON request a
line on stdin, one JSON answer a line on stdout (the clients' own chatter goes to stderr).

    {"op": "about", "peer": "openai_python"}
    {"op": "stop", "peer": ..., "way": "own" | "library", "trial": {...}}
    {"op": "cost", "peer": ..., "way": ..., "trial": {...}, "calls": 20}
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import statistics
import sys
import time
from typing import Any, TextIO

from .kit import Press, Trial, outcome


def about(peer: str) -> dict[str, Any]:
    """The servers a client speaks to, its ways (``own``; ``library`` where it takes this
    library's client) and the versions of its packages."""
    module = importlib.import_module(f"{__package__}.peers.{peer}")
    versions = []
    for name in module.PACKAGES:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (this tree)" if name == "abstract-client" else f"{name} not installed")
    ways = ["own", "library"] if hasattr(module, "library") else ["own"]
    return {"servers": list(module.SERVERS), "ways": ways, "version": ", ".join(versions)}


def call_of(request: dict[str, Any], **override: Any) -> tuple[Trial, Any]:
    trial = Trial(**{**request["trial"], **override})
    module = importlib.import_module(f"{__package__}.peers.{request['peer']}")
    return trial, getattr(module, request["way"])(trial)


def stop(request: dict[str, Any]) -> dict[str, Any]:
    trial, call = call_of(request)
    press = Press(trial.cue)
    return outcome(lambda: call(press), press)


def streamed(request: dict[str, Any], style: str) -> tuple[int, float]:
    """(tokens received, tokens a second) of one unstopped stream: the tokens are counted in the
    text the caller got, since a client may hand them over grouped (pydantic-ai does, every
    0.1 s)."""
    _, call = call_of(request, stream=True, style=style)
    press = Press(None)
    started = time.perf_counter()
    text = call(press)
    elapsed = time.perf_counter() - started
    tokens = len(str(text).split())
    return tokens, tokens / elapsed


def cost(request: dict[str, Any]) -> dict[str, Any]:
    """Unstopped: tokens a second of a long stream (from a thread, and in asyncio), and the p50
    of a one-token call (from a thread: an asyncio call here would pay for a new loop each time)."""
    tokens, per_s = streamed(request, "thread")
    _, per_s_async = streamed(request, "task")
    _, call = call_of(request, stream=False, style="thread", max_tokens=1)
    call(Press(None))  # warm: the connection, the client's first-call work
    times = []
    for _ in range(int(request.get("calls", 20))):
        began = time.perf_counter()
        call(Press(None))
        times.append((time.perf_counter() - began) * 1000)
    return {
        "chunks": tokens,
        "chunks_per_s": per_s,
        "chunks_per_s_asyncio": per_s_async,
        "short_call_p50_ms": statistics.median(times),
    }


OPS = {"about": lambda r: about(r["peer"]), "stop": stop, "cost": cost}


def main(stdin: TextIO = sys.stdin) -> None:
    answers, sys.stdout = sys.stdout, sys.stderr
    for line in stdin:
        request = json.loads(line)
        try:
            answer = OPS[request["op"]](request)
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
