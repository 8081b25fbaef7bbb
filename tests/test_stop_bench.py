"""``abstract-client bench stop`` at a small size: one real server (llama-server), openai-python
by its own ways and given this library, and this library's own lane, each stop pressed from
another thread during decode; the peers run in their own venv (made once, cached). Each row's
invariants: this library's rows stop AT THE SERVER (its ``cancel task`` line), with one
request, a typed error and the partial text; a row that says "stopped" has the server's
evidence; a client with no way to stop lets the server run to the answer's end. The full run is
``abstract-client bench stop`` (docs/stop-bench.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from abstract_client.app.stop_bench.report import chart, markdown
from abstract_client.app.stop_bench.run import MAX_TOKENS, Plan, measure

pytestmark = pytest.mark.llamacpp

SMALL = Plan(
    servers=("llamacpp",),
    peers=("openai_python", "this_library"),
    modes=(("decode", False, "thread"), ("decode", True, "thread")),
    trials=1,
    cost=True,
)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return measure(SMALL)


def stops(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["kind"] == "stop"]


def test_every_planned_row_ran_nothing_was_skipped(rows: list[dict]) -> None:
    assert [r for r in rows if r["kind"] == "note"] == []
    # openai-python: its own way and the library's, both calls; this library: its own lane
    assert len(stops(rows)) == 6, json.dumps(rows, indent=1)
    assert all("released_ms" in r for r in stops(rows)), json.dumps(rows, indent=1)
    assert {r["version"] for r in stops(rows) if r["client"] == "openai-python"} != {""}


def test_this_librarys_rows_stop_at_the_server_typed_with_their_text(rows: list[dict]) -> None:
    ours = [r for r in stops(rows) if r["client"] == "abstract-client" or r["way"] == "library"]
    assert len(ours) == 4
    for r in ours:
        assert r["server_stopped"], r  # llama-server's own 'cancel task' line
        assert r["requests"] == 1, r  # never retried
        assert r["typed"] and r["error_type"] == "abstract_client.GenerationCancelledError", r
        assert r["server_stop_ms"] is not None and r["tokens_after_stop"] < MAX_TOKENS / 2, r
        if r["mode"] == "streamed":
            assert r["partial_kept"], r
            assert r["tokens_after_stop"] <= 20, r  # cancelled at its next token write
        assert r["released_ms"] < 2000, r  # milliseconds in practice; generous on a loaded machine


def test_a_row_that_says_stopped_has_the_servers_evidence(rows: list[dict]) -> None:
    for r in stops(rows):
        assert r["tokens_before_stop"] > 0, r  # pressed during decode, as the row says
        if r["server_stopped"]:
            assert r["server_stop_ms"] is not None and r["evidence"].startswith("llama-server"), r
            assert r["tokens_after_stop"] < MAX_TOKENS, r


def test_with_no_way_to_stop_the_server_runs_to_the_end_and_the_caller_waits(rows: list[dict]) -> None:
    (r,) = [r for r in stops(rows) if r["how"] == "no way to stop"]
    assert r["client"] == "openai-python" and r["mode"] == "not streamed"
    assert not r["server_stopped"], r
    assert r["tokens_after_stop"] > 0 and r["error_type"] == "none", r
    # the server decoded the whole answer: what it had before the press and all the rest after
    assert MAX_TOKENS - 5 <= r["tokens_before_stop"] + r["tokens_after_stop"] <= MAX_TOKENS, r
    assert r["released_ms"] >= r["server_stop_ms"] - 50, r  # the caller got the whole answer at its end


def test_the_cost_side_is_measured_beside_its_floor(rows: list[dict]) -> None:
    costs = [r for r in rows if r["kind"] == "cost"]
    assert {(r["client"], r["way"]) for r in costs} >= {
        ("http.client (the floor)", "own"),
        ("openai-python", "own"),
        ("openai-python", "library"),
        ("abstract-client", "own"),
    }, costs
    for r in costs:
        assert "error" not in r, r
        assert r["chunks"] >= 2000 and r["chunks_per_s"] > 0 and r["short_call_p50_ms"] > 0, r


def test_the_table_and_the_chart(rows: list[dict], tmp_path: Path) -> None:
    table = markdown(rows)
    assert table.count("\n| llama-server |") == len(stops(rows))
    assert "no way to stop" in table and "ran to the end" in table
    drawn = chart(rows, tmp_path / "stop-bench.png")
    assert drawn is not None and drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_refuses_an_unknown_client() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "abstract_client", "bench", "stop", "--clients", "nonesuch"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "unknown clients" in done.stderr
