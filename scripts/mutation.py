"""The mutation gate on the stop contract: ``bash scripts/mutation.sh``.

Each mutant in ``scripts/mutants.toml`` is a semantic fault (file, exact text, replacement) that
breaks one piece of the stop's mechanism or one rule of the contract. For each, the tree is
copied once to a scratch directory, the fault applied there, and the tests that should catch it
run with ``-x``; a mutant the tests do not fail SURVIVES, and the gate exits non-zero. A mutant
whose text is not found exactly once is an error too: moving code means updating one table row.
Equivalent mutants (a change the tests cannot and need not see) are listed with their reason,
and their text is still checked, so the reason stays about code that exists.

Usage: python scripts/mutation.py [--only ID[,ID]] [--no-baseline] [--timeout S]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "scripts" / "mutants.toml"


@dataclass(frozen=True)
class Edit:
    file: str
    pattern: str
    replacement: str


@dataclass(frozen=True)
class Mutant:
    id: str
    what: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...] = ()
    equivalent: str = ""  # the reason, for a mutant that no test can (or should) see


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | SURVIVED | ERROR | equivalent
    killed_by: str = ""
    seconds: float = 0.0
    detail: list[str] = field(default_factory=list)


def load_table(path: Path = TABLE) -> list[Mutant]:
    data = tomllib.loads(path.read_text())
    mutants = []
    for row in data["mutant"]:
        edits = [Edit(row["file"], row["pattern"], row["replacement"])] if "file" in row else []
        edits += [Edit(e["file"], e["pattern"], e["replacement"]) for e in row.get("edit", [])]
        if not edits:
            raise SystemExit(f"mutant {row['id']}: no edit")
        mutants.append(
            Mutant(
                id=row["id"],
                what=row["what"],
                edits=tuple(edits),
                tests=tuple(row.get("tests", [])),
                equivalent=row.get("equivalent", ""),
            )
        )
        if not mutants[-1].tests and not mutants[-1].equivalent:
            raise SystemExit(f"mutant {row['id']}: no tests and no reason for being equivalent")
    ids = [m.id for m in mutants]
    if len(ids) != len(set(ids)):
        raise SystemExit("duplicate mutant ids in the table")
    return mutants


def copy_tree(dest: Path) -> None:
    """The files git knows (tracked, and new ones not ignored), as they are in the work tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if not src.is_file():  # deleted in the work tree
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def apply(tree: Path, mutant: Mutant) -> dict[Path, str]:
    """Apply every edit; returns the original texts. Raises ValueError unless each pattern
    occurs exactly once."""
    originals: dict[Path, str] = {}
    for edit in mutant.edits:
        path = tree / edit.file
        current = path.read_text()
        originals.setdefault(path, current)
        count = current.count(edit.pattern)
        if count != 1:
            raise ValueError(f"{edit.file}: the pattern occurs {count} times (must be once): {edit.pattern!r}")
        path.write_text(current.replace(edit.pattern, edit.replacement))
    return originals


def restore(originals: dict[Path, str]) -> None:
    for path, text in originals.items():
        path.write_text(text)


def pytest_cmd(tests: tuple[str, ...], timeout: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-rfE",
        f"--timeout={timeout:g}",
        # The timer covers the test function only. Over the whole protocol it also covered a
        # real server's start (vLLM: ~100 s of 120 on a busy CI machine) and pytest's own
        # reporting: a SIGALRM that lands in a reporting hook is pytest's INTERNALERROR (exit 3),
        # not a failed test. Fixtures bound themselves (a server's ready_timeout, stop()'s waits);
        # the whole run is bounded by RUN_BUDGET_S.
        "-o",
        "timeout_func_only=true",
        *tests,
    ]


def env_for(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The copy wins over the editable install, in the test process and in every child it starts
    # (the gateway and fake servers run as ``python -m ...`` subprocesses).
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a mutated module must never leave a cached .pyc
    return env


_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)", re.M)


RUN_BUDGET_S = 1800.0  # one mutant's whole run, servers' starts included
HUNG = -1  # run_tests' exit code for a run that passed RUN_BUDGET_S


def run_tests(tree: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, str]:
    # Its own session, so that a run past its budget is ended with every server it started.
    proc = subprocess.Popen(
        pytest_cmd(tests, timeout),
        cwd=tree,
        env=env_for(tree),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=RUN_BUDGET_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return HUNG, f"{out}\nthe run passed its {RUN_BUDGET_S:g} s budget and was killed"
    return proc.returncode, out


def check_copy_is_imported(tree: Path) -> None:
    code = "import abstract_client.providers as p; print(p.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env_for(tree), capture_output=True, text=True, check=True
    ).stdout.split()
    for path in out:
        if not Path(path).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(
                f"the scratch copy is not what Python imports ({path}): mutants would run on the real tree"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated mutant ids")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the selected tests unmutated first")
    ap.add_argument("--timeout", type=float, default=120, help="per-test timeout (a hang counts as killed)")
    args = ap.parse_args(argv)

    mutants = load_table()
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m.id for m in mutants}
        if unknown:
            raise SystemExit(f"unknown mutant ids: {sorted(unknown)}")
        mutants = [m for m in mutants if m.id in wanted]

    started = time.monotonic()
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="abstract-client-mutation-") as scratch:
        tree = Path(scratch)
        copy_tree(tree)
        check_copy_is_imported(tree)
        live = [m for m in mutants if not m.equivalent]
        if not args.no_baseline:
            every = tuple(dict.fromkeys(t for m in live for t in m.tests))
            print(f">> baseline: {len(every)} test selections, unmutated", flush=True)
            t0 = time.monotonic()
            rc, out = run_tests(tree, every, args.timeout)
            if rc != 0:
                print(out[-4000:])
                print("the unmutated tests fail: the gate means nothing until they pass", file=sys.stderr)
                return 2
            print(f"   passed in {time.monotonic() - t0:.0f} s", flush=True)
        for mutant in mutants:
            t0 = time.monotonic()
            try:
                originals = apply(tree, mutant)
            except ValueError as exc:
                outcomes.append(Outcome(mutant, "ERROR", detail=[str(exc)]))
                print(f"{mutant.id}: ERROR {exc}", flush=True)
                continue
            try:
                if mutant.equivalent:
                    outcomes.append(Outcome(mutant, "equivalent", killed_by=mutant.equivalent))
                    continue
                rc, out = run_tests(tree, mutant.tests, args.timeout)
            finally:
                restore(originals)
            seconds = time.monotonic() - t0
            failed = _FAILED.findall(out)
            if rc in (1, 2) and failed:  # tests failed or errored: killed
                why = [line for line in out.splitlines() if line.startswith("E ")][:2]
                outcome = Outcome(mutant, "killed", failed[0][1], seconds, why)
            elif rc == 0:
                outcome = Outcome(mutant, "SURVIVED", "", seconds, out.strip().splitlines()[-3:])
            else:  # 4: a test id not found, 5: nothing collected, 3: internal error, HUNG...
                reason = f"past its {RUN_BUDGET_S:g} s budget" if rc == HUNG else f"pytest exit {rc}"
                outcome = Outcome(mutant, "ERROR", reason, seconds, out.strip().splitlines()[-15:])
            outcomes.append(outcome)
            print(f"{mutant.id}: {outcome.status} {outcome.killed_by} ({seconds:.1f} s)", flush=True)
            for line in outcome.detail:
                print(f"    {line}")

    print_table(outcomes, time.monotonic() - started)
    bad = [o for o in outcomes if o.status in ("SURVIVED", "ERROR")]
    return 1 if bad else 0


def print_table(outcomes: list[Outcome], total: float) -> None:
    print()
    print("| mutant | what it breaks | killed by | seconds |")
    print("|---|---|---|---|")
    for o in outcomes:
        by = o.killed_by if o.status == "killed" else f"**{o.status}** {o.killed_by}".strip()
        secs = f"{o.seconds:.1f}" if o.status != "equivalent" else "-"
        print(f"| `{o.mutant.id}` | {o.mutant.what} | {by} | {secs} |")
    counts = {s: sum(o.status == s for o in outcomes) for s in ("killed", "SURVIVED", "ERROR", "equivalent")}
    live = counts["killed"] + counts["SURVIVED"] + counts["ERROR"]
    print()
    print(
        f"{counts['killed']} of {live} mutants killed, {counts['SURVIVED']} survived, {counts['ERROR']} errors, "
        f"{counts['equivalent']} equivalent (listed with their reason); {total:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
