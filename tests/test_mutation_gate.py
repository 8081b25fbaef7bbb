"""The incremental mutation gate (scripts/mutation.py): what it runs again, what it may skip, and
what its committed record keeps. A gate that skipped a changed mutant, or kept a survivor as a
pass, would let a broken stop through while printing a green table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_gate", ROOT / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation_gate"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "pkg" / "code.py").write_text("def f():\n    return 1\n")
    (tmp_path / "pkg" / "other.py").write_text("x = 1\n")
    (tmp_path / "tests" / "test_code.py").write_text("def test_f(): ...\n")
    (tmp_path / "tests" / "helpers.py").write_text("H = 1\n")
    return tmp_path


def _mutant(gate: ModuleType, id: str = "m1", pattern: str = "return 1") -> Any:
    return gate.Mutant(
        id=id,
        what="w",
        edits=(gate.Edit("pkg/code.py", pattern, "return 2"),),
        tests=("tests/test_code.py::test_f",),
    )


def test_the_key_follows_the_mutated_file_its_tests_and_the_harness_only(gate: ModuleType, tmp_path: Path) -> None:
    root = _tree(tmp_path)
    mutant = _mutant(gate)
    harness = ["tests/helpers.py"]
    key = gate.mutant_key(mutant, root, harness)
    assert gate.mutant_key(mutant, root, harness) == key  # stable
    (root / "pkg" / "other.py").write_text("x = 2\n")
    assert gate.mutant_key(mutant, root, harness) == key  # a file it neither mutates nor is tested by
    for rel, text in [
        ("pkg/code.py", "def f():\n    return 1  # moved\n"),
        ("tests/test_code.py", "def test_f(): assert True\n"),
        ("tests/helpers.py", "H = 2\n"),
    ]:
        before = gate.mutant_key(mutant, root, harness)
        (root / rel).write_text(text)
        assert gate.mutant_key(mutant, root, harness) != before, f"a change to {rel} kept the key"
    moved = gate.mutant_key(mutant, root, harness)
    assert gate.mutant_key(_mutant(gate, pattern="return  1"), root, harness) != moved  # the row itself


def test_the_plan_runs_new_changed_and_unkilled_mutants_and_samples_the_rest(gate: ModuleType) -> None:
    mutants = [_mutant(gate, f"m{i}") for i in range(40)]
    keys = {m.id: f"k{m.id}" for m in mutants}
    record = {m.id: {"key": keys[m.id], "status": "killed", "killed_by": "t"} for m in mutants[:30]}
    record["m3"]["key"] = "stale"  # its code or tests changed since
    record["m4"]["status"] = "SURVIVED"  # never a pass
    run, skipped = gate.plan(mutants, record, keys, sample=5, seed="c1")
    ran = {m.id for m in run}
    assert {f"m{i}" for i in range(30, 40)} <= ran  # new: no record
    assert {"m3", "m4"} <= ran
    unchanged = {f"m{i}" for i in range(30)} - {"m3", "m4"}
    sampled = ran & unchanged
    assert len(sampled) == 5 and set(skipped) == unchanged - sampled
    # another commit, another sample: every unchanged mutant comes round
    seen = set(sampled)
    for n in range(2, 60):
        again, _ = gate.plan(mutants, record, keys, sample=5, seed=f"c{n}")
        seen |= {m.id for m in again} & unchanged
    assert seen == unchanged


def test_a_recorded_kill_runs_its_killing_test_first(gate: ModuleType) -> None:
    mutant = gate.Mutant(id="m", what="w", edits=(), tests=("tests/a.py::t1", "tests/b.py::t2"))
    assert gate.killing_test_first(mutant, None) == mutant.tests
    assert gate.killing_test_first(mutant, {"killed_by": "tests/b.py::t2[x]"}) == (
        "tests/b.py::t2[x]",
        "tests/a.py::t1",
        "tests/b.py::t2",
    )
    assert gate.killing_test_first(mutant, {"killed_by": "tests/gone.py::t"}) == mutant.tests


def test_the_record_keeps_kills_only_and_forgets_removed_rows(gate: ModuleType) -> None:
    killed, survived, errored = (_mutant(gate, i) for i in ("a", "b", "c"))
    record = {i: {"key": "old", "status": "killed", "killed_by": "t"} for i in ("a", "b", "c", "gone")}
    outcomes = [
        gate.Outcome(killed, "killed", "tests/test_code.py::test_f", 1.0),
        gate.Outcome(survived, "SURVIVED"),
        gate.Outcome(errored, "ERROR", "pytest exit 4"),
    ]
    out = gate.updated_record(record, outcomes, {"a": "new", "b": "new", "c": "new"}, {"a", "b", "c"})
    assert out == {"a": {"key": "new", "status": "killed", "killed_by": "tests/test_code.py::test_f", "seconds": 1.0}}


def test_the_committed_record_names_only_rows_of_the_table(gate: ModuleType) -> None:
    ids = {m.id for m in gate.load_table()}
    record = gate.load_record()
    assert record, "scripts/mutation_record.json is missing: run the gate (scripts/mutation.sh) and commit it"
    assert set(record) <= ids
    assert all(entry["status"] == "killed" for entry in record.values())
