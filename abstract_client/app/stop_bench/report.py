"""The bench's rows as a user reads them: a Markdown table of the stops, one of the cost side,
and a chart (stop → the server stopped, per client, log scale; matplotlib, the ``chart``
extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

Row = dict[str, Any]


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def stopped_cell(row: Row) -> str:
    """What the server did after the press, in the server's own words (its evidence)."""
    if row.get("server_stop_ms") is None:
        return "no evidence"
    verdict = "stopped" if row["server_stopped"] else "ran to the end"
    some = row.get("stopped_trials", 0)
    if not row["server_stopped"] and some:
        verdict = f"stopped in {some} of {row['n']}"
    return f"{verdict}, {_ms(row['server_stop_ms'])} ms"


def caught_cell(row: Row) -> str:
    error = str(row["error_type"])
    if error == "none":
        return "nothing (a whole answer)" if not row["server_stopped"] else "nothing (ended quietly)"
    return error.split(".")[-1] + (" (typed)" if row["typed"] else "")


def _kept(kept: bool | None) -> str:
    return "— (the whole answer)" if kept is None else ("yes" if kept else "no")


def markdown(rows: list[Row]) -> str:
    stops = [r for r in rows if r["kind"] == "stop" and "released_ms" in r]
    out = [
        "| server | client | way | call | stage | how stopped | n | caller released ms | server "
        "| tokens after | caught | partial kept | requests |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in stops:
        way = "its own" if r["way"] == "own" else "+ abstract_client.sdk"
        call = f"{r['mode']}, {'thread' if r['style'] == 'thread' else 'asyncio'}"
        before = r.get("tokens_before_stop")
        stage = r["stage"] if before is None else f"{r['stage']} ({before:.0f} decoded)"
        out.append(
            f"| {r['server']} | {r['client']} | {way} | {call} | {stage} | {r['how']} | {r['n']} | "
            f"{_ms(r['released_ms'])} | {stopped_cell(r)} | {r['tokens_after_stop']:.0f} | {caught_cell(r)} | "
            f"{_kept(r['partial_kept'])} | {r['requests']} |"
        )
    notes = [r for r in rows if r["kind"] == "note" or (r["kind"] == "stop" and "released_ms" not in r)]
    if notes:
        out += ["", "Not measured:", ""]
        said = [f"- {r['server']} / {r['client']}: {r.get('note', '')}" for r in notes]
        out += list(dict.fromkeys(said))  # once each
    costs = [r for r in rows if r["kind"] == "cost"]
    if costs:
        out += [
            "",
            "| cost (unstopped) | client | way | tokens/s of a 2,000-token stream, from a thread | in asyncio "
            "| p50 of a one-token call, ms |",
            "|---|---|---|---|---|---|",
        ]
        for r in costs:
            if "error" in r:
                out.append(f"| {r['server']} | {r['client']} | {r['way']} | {r['error']} | |")
                continue
            way = "its own" if r["way"] == "own" else "+ abstract_client.sdk"
            out.append(
                f"| {r['server']} | {r['client']} | {way} | {r['chunks_per_s']:,.0f} | "
                f"{r['chunks_per_s_asyncio']:,.0f} | {r['short_call_p50_ms']:.2f} |"
            )
    return "\n".join(out) + "\n"


def chart(rows: list[Row], path: Path, server: str = "llama-server") -> Path | None:
    """Stop → the server stopped (ms, log scale) per client on one server: its own way and with
    this library, the stop pressed from a thread during decode. A bar that never stopped is the
    time the server ran on to the answer's end, hatched. None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    picked = [
        r
        for r in rows
        if r["kind"] == "stop"
        and r.get("server_stop_ms") is not None
        and r["server"] == server
        and r["stage"] == "decode"
        and r["style"] == "thread"
    ]
    if not picked:
        return None
    labels = [f"{r['client']} {'(own)' if r['way'] == 'own' else '+ sdk'}, {r['mode']}" for r in picked]
    values = [max(r["server_stop_ms"], 0.01) for r in picked]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(picked) + 1.2))
    bars = ax.barh(labels, values, color=["#2a9d8f" if r["server_stopped"] else "#e76f51" for r in picked])
    for bar, r in zip(bars, picked, strict=True):
        if not r["server_stopped"]:
            bar.set_hatch("//")
        ax.text(
            bar.get_width() * 1.1, bar.get_y() + bar.get_height() / 2, _ms(r["server_stop_ms"]), va="center", fontsize=7
        )
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel(
        "Stop pressed → the server stopped decoding (ms, log scale; hatched: it never stopped, ran to the end)"
    )
    ax.set_title(f"{server}: a Stop pressed from another thread during decode", fontsize=10)
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
