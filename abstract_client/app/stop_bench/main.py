"""The command's body: measure, then print and save what a user reads."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from .report import chart, markdown
from .run import PEERS, Plan, measure


def machine() -> str:
    cpus = os.cpu_count() or 0
    return f"{platform.system()} {platform.machine()}, {cpus} CPUs, Python {platform.python_version()}"


def run(
    servers: str,
    clients: str,
    trials: int,
    out: str | None,
    as_json: bool,
    cost: bool = True,
    refresh: bool = False,
) -> int:
    chosen = tuple(PEERS) if clients == "all" else tuple(c.strip() for c in clients.split(",") if c.strip())
    unknown = [c for c in chosen if c not in PEERS]
    if unknown:
        print(f"error: unknown clients {unknown}; known: {', '.join(PEERS)}", file=sys.stderr)
        return 2
    plan = Plan(
        servers=tuple(s.strip() for s in servers.split(",") if s.strip()),
        peers=chosen,
        trials=trials,
        cost=cost,
        refresh=refresh,
    )
    started = datetime.datetime.now(datetime.UTC)
    rows = measure(plan, log=lambda line: print(line, file=sys.stderr, flush=True))
    header: dict[str, Any] = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine()}
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stop-bench.json").write_text(json.dumps({**header, "rows": rows}, indent=1) + "\n")
        (folder / "stop-bench.md").write_text(f"Run {header['date']} on {header['machine']}.\n\n" + markdown(rows))
        drawn = chart(rows, folder / "stop-bench.png")
        if drawn is None:
            print("no chart: matplotlib is not installed (pip install 'abstract-client[chart]')", file=sys.stderr)
    if as_json:
        print(json.dumps({**header, "rows": rows}, indent=1))
    else:
        print(markdown(rows))
    failed = [r for r in rows if r["kind"] == "note" and "could not start" in r["note"]]
    return 1 if failed else 0
