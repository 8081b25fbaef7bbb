"""The mutation gate on the stop contract: ``bash scripts/mutation.sh``.

Each mutant in ``scripts/mutants.toml`` is a semantic fault (file, exact text, replacement) that
breaks one piece of the stop's mechanism or one rule of the contract. For each, the tree is
copied once to a scratch directory, the fault applied there, and the tests that should catch it
run with ``-x``; a mutant the tests do not fail SURVIVES, and the gate exits non-zero. A mutant
whose text is not found exactly once is an error too: moving code means updating one table row.
Equivalent mutants (a change the tests cannot and need not see) are listed with their reason,
and their text is still checked, so the reason stays about code that exists.

**Incremental** (in the manner of Stryker's incremental mode and PIT's history): a committed
record (``scripts/mutation_record.json``), written only by a run of this gate, keeps each killed
mutant's result under a key — the hash of its table row, of the files it mutates, of the test
modules that must kill it and of the test harness (``tests/`` support modules,
``abstract_client/testing/``). A mutant whose key is unchanged is not run again, except for a
rotating sample (``MUTATION_SAMPLE``, default 24, drawn afresh for each commit); a new mutant, a
changed key, or one that did not end killed is always run. ``MUTATION=full`` (or ``--full``) runs
every mutant. Each run starts with the test that killed the mutant last time.

Mutants run ``--jobs`` at a time (default 2), each in its own copy of the tree; those whose tests
start a real engine server (vLLM, llama-server) run one at a time.

Usage: python scripts/mutation.py [--only ID[,ID]] [--no-baseline] [--timeout S] [--full] [--jobs N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    status: str  # killed | SURVIVED | ERROR | equivalent | unchanged (not run: its recorded kill holds)
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


RECORD = ROOT / "scripts" / "mutation_record.json"
# What every test leans on besides its own module: a change here can let a mutant through, so it
# is in every mutant's key.
HARNESS_GLOBS = ("tests/*.py", "abstract_client/testing/*.py")
# Test modules that start a real engine server: their mutants run one at a time (two vLLMs, or a
# vLLM beside llama-server, on two cores would only slow both).
HEAVY_MODULES = frozenset(
    {
        "tests/test_vllm_real.py",
        "tests/test_llamacpp_real.py",
        "tests/test_resumable_real.py",
        "tests/test_gateway_real.py",
        "tests/test_fleet_real.py",
        "tests/test_embeddings_real.py",
        "tests/test_tools_real.py",
        "tests/test_usage_real.py",
    }
)
DEFAULT_SAMPLE = 24


def _module(node: str) -> str:
    return node.split("::", 1)[0]


def harness_files(root: Path = ROOT) -> list[str]:
    found = {p.relative_to(root).as_posix() for g in HARNESS_GLOBS for p in root.glob(g)}
    return sorted(f for f in found if not Path(f).name.startswith("test_") or f == "tests/conftest.py")


def mutant_key(mutant: Mutant, root: Path = ROOT, harness: list[str] | None = None) -> str:
    """The hash a recorded result stands for: the row, the mutated files, the killing tests'
    modules and the harness. Any change to one of them runs the mutant again."""
    digest = hashlib.sha256()
    row = {"edits": [e.__dict__ for e in mutant.edits], "tests": list(mutant.tests)}
    digest.update(json.dumps(row, sort_keys=True).encode())
    files = {e.file for e in mutant.edits} | {_module(t) for t in mutant.tests}
    for rel in sorted(files) + (harness if harness is not None else harness_files(root)):
        path = root / rel
        digest.update(rel.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
        digest.update(b"\0")
    return digest.hexdigest()


def load_record(path: Path = RECORD) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return dict(data.get("mutants", {}))


def save_record(entries: dict[str, dict[str, Any]], path: Path = RECORD) -> None:
    body = {
        "about": "written by scripts/mutation.py after each gate run: a killed mutant's key "
        "(row, mutated files, killing test modules, harness) and the test that killed it",
        "mutants": {k: entries[k] for k in sorted(entries)},
    }
    path.write_text(json.dumps(body, indent=1, sort_keys=False) + "\n")


def updated_record(
    record: dict[str, dict[str, Any]], outcomes: list[Outcome], keys: dict[str, str], known: set[str]
) -> dict[str, dict[str, Any]]:
    """A kill is recorded under the key it was run with; a survivor or an error is dropped (never
    kept as a pass: the next run runs it); rows gone from the table go too."""
    out = dict(record)
    for o in outcomes:
        if o.status == "killed":
            out[o.mutant.id] = {
                "key": keys[o.mutant.id],
                "status": "killed",
                "killed_by": o.killed_by,
                "seconds": round(o.seconds, 1),
            }
        elif o.status in ("SURVIVED", "ERROR"):
            out.pop(o.mutant.id, None)
    return {k: v for k, v in out.items() if k in known}


def sample_seed() -> str:
    """The commit under test: each submission draws another sample of the unchanged mutants."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(time.time())


def plan(
    mutants: list[Mutant], record: dict[str, dict[str, Any]], keys: dict[str, str], sample: int, seed: str
) -> tuple[list[Mutant], dict[str, str]]:
    """Which live mutants to run; for the others, why not. New or changed: always; unchanged
    and killed last time: a sample of ``sample``, ranked by a hash of the seed and the id."""
    must, unchanged = [], []
    for m in mutants:
        entry = record.get(m.id)
        if entry is not None and entry.get("key") == keys[m.id] and entry.get("status") == "killed":
            unchanged.append(m)
        else:
            must.append(m)
    ranked = sorted(unchanged, key=lambda m: hashlib.sha256(f"{seed}:{m.id}".encode()).hexdigest())
    drawn = {m.id for m in ranked[:sample]}
    skipped = {m.id: f"unchanged since killed by {record[m.id]['killed_by']}" for m in unchanged if m.id not in drawn}
    return [m for m in mutants if m.id not in skipped], skipped


def killing_test_first(mutant: Mutant, entry: dict[str, Any] | None) -> tuple[str, ...]:
    """The mutant's tests, the one that killed it last time first (``-x`` stops there)."""
    killer = (entry or {}).get("killed_by", "")
    if not any(killer == t or killer.startswith((t + "[", t + "::")) for t in mutant.tests):
        return mutant.tests  # no record, or a killer no longer among its tests
    return tuple(dict.fromkeys([killer, *mutant.tests]))


def run_mutant(tree: Path, mutant: Mutant, tests: tuple[str, ...], timeout: float) -> Outcome:
    t0 = time.monotonic()
    try:
        originals = apply(tree, mutant)
    except ValueError as exc:
        return Outcome(mutant, "ERROR", detail=[str(exc)])
    try:
        rc, out = run_tests(tree, tests, timeout)
    finally:
        restore(originals)
    seconds = time.monotonic() - t0
    failed = _FAILED.findall(out)
    if rc in (1, 2) and failed:  # tests failed or errored: killed
        why = [line for line in out.splitlines() if line.startswith("E ")][:2]
        return Outcome(mutant, "killed", failed[0][1], seconds, why)
    if rc == 0:
        return Outcome(mutant, "SURVIVED", "", seconds, out.strip().splitlines()[-3:])
    # 4: a test id not found, 5: nothing collected, 3: internal error, HUNG...
    reason = f"past its {RUN_BUDGET_S:g} s budget" if rc == HUNG else f"pytest exit {rc}"
    return Outcome(mutant, "ERROR", reason, seconds, out.strip().splitlines()[-15:])


def check_text(tree: Path, mutant: Mutant) -> Outcome | None:
    """A mutant not run still has its text checked: the row must stay about code that exists."""
    try:
        restore(apply(tree, mutant))
    except ValueError as exc:
        return Outcome(mutant, "ERROR", detail=[str(exc)])
    return None


def is_heavy(mutant: Mutant) -> bool:
    return any(_module(t) in HEAVY_MODULES for t in mutant.tests)


def repeat_check(mutants: list[Mutant], args: argparse.Namespace) -> int:
    """Each selected live mutant ``args.repeat`` times with ``args.load`` CPU hogs beside: the
    kill must not depend on how the machine's load falls."""
    if args.only:
        wanted = set(args.only.split(","))
        mutants = [m for m in mutants if m.id in wanted]
    live = [m for m in mutants if not m.equivalent]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    racy = []
    try:
        with tempfile.TemporaryDirectory(prefix="abstract-client-mutation-") as scratch:
            tree = Path(scratch)
            copy_tree(tree)
            check_copy_is_imported(tree)
            for mutant in live:
                kills = 0
                for _ in range(args.repeat):
                    outcome = run_mutant(tree, mutant, mutant.tests, args.timeout)
                    kills += outcome.status == "killed"
                print(f"{mutant.id}: killed {kills} of {args.repeat} beside {args.load} busy processes", flush=True)
                if kills != args.repeat:
                    racy.append(mutant.id)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"racy: {racy or 'none'}")
    return 1 if racy else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated mutant ids")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the selected tests unmutated first")
    ap.add_argument("--timeout", type=float, default=120, help="per-test timeout (a hang counts as killed)")
    ap.add_argument("--full", action="store_true", help="run every mutant (also MUTATION=full)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "2")))
    ap.add_argument("--sample", type=int, default=int(os.environ.get("MUTATION_SAMPLE", str(DEFAULT_SAMPLE))))
    ap.add_argument(
        "--repeat",
        type=int,
        default=0,
        help="determinism check: run each selected mutant N times beside --load busy processes; "
        "a mutant not killed every time is racy (exit 1). Writes no record.",
    )
    ap.add_argument("--load", type=int, default=2, help="busy processes beside --repeat")
    args = ap.parse_args(argv)
    if args.repeat:
        return repeat_check(load_table(), args)
    full = args.full or os.environ.get("MUTATION", "") == "full" or bool(args.only)

    mutants = load_table()
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m.id for m in mutants}
        if unknown:
            raise SystemExit(f"unknown mutant ids: {sorted(unknown)}")
        mutants = [m for m in mutants if m.id in wanted]

    started = time.monotonic()
    record = load_record()
    harness = harness_files()
    keys = {m.id: mutant_key(m, ROOT, harness) for m in mutants}
    live = [m for m in mutants if not m.equivalent]
    to_run, skipped = (live, {}) if full else plan(live, record, keys, args.sample, sample_seed())
    mode = "every mutant" if full else f"{len(to_run)} new, changed or sampled; {len(skipped)} unchanged"
    print(f">> {len(live)} live mutants: running {mode}, {args.jobs} at a time", flush=True)

    outcomes: dict[str, Outcome] = {}
    with contextlib.ExitStack() as stack:
        trees = queue.SimpleQueue[Path]()
        for _ in range(max(1, args.jobs)):
            tree = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="abstract-client-mutation-")))
            copy_tree(tree)
            check_copy_is_imported(tree)
            trees.put(tree)
        first = trees.get()
        if not args.no_baseline and to_run:
            every = tuple(dict.fromkeys(t for m in to_run for t in m.tests))
            print(f">> baseline: {len(every)} test selections, unmutated", flush=True)
            t0 = time.monotonic()
            rc, out = run_tests(first, every, args.timeout)
            if rc != 0:
                print(out[-4000:])
                print("the unmutated tests fail: the gate means nothing until they pass", file=sys.stderr)
                return 2
            print(f"   passed in {time.monotonic() - t0:.0f} s", flush=True)
        for mutant in mutants:  # the text of every row, run or not, is checked in one tree
            if mutant.equivalent or mutant.id in skipped:
                bad = check_text(first, mutant)
                outcomes[mutant.id] = bad or Outcome(
                    mutant,
                    "equivalent" if mutant.equivalent else "unchanged",
                    killed_by=mutant.equivalent or skipped[mutant.id],
                )
        trees.put(first)

        heavy = threading.Lock()
        printing = threading.Lock()

        def one(mutant: Mutant) -> None:
            tree = trees.get()
            try:
                with heavy if is_heavy(mutant) else contextlib.nullcontext():
                    outcome = run_mutant(tree, mutant, killing_test_first(mutant, record.get(mutant.id)), args.timeout)
            finally:
                trees.put(tree)
            outcomes[mutant.id] = outcome
            with printing:
                print(f"{mutant.id}: {outcome.status} {outcome.killed_by} ({outcome.seconds:.1f} s)", flush=True)
                for line in outcome.detail:
                    print(f"    {line}")

        # the heavy ones first: their one-at-a-time queue is the gate's longest path
        order = sorted(to_run, key=lambda m: not is_heavy(m))
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for future in [pool.submit(one, m) for m in order]:
                future.result()

    ordered = [outcomes[m.id] for m in mutants]
    print_table(ordered, time.monotonic() - started)
    save_record(updated_record(record, ordered, keys, {m.id for m in load_table()}))
    bad = [o for o in ordered if o.status in ("SURVIVED", "ERROR")]
    return 1 if bad else 0


def print_table(outcomes: list[Outcome], total: float) -> None:
    print()
    print("| mutant | what it breaks | killed by | seconds |")
    print("|---|---|---|---|")
    for o in outcomes:
        if o.status in ("killed", "unchanged"):
            by = o.killed_by
        else:
            by = f"**{o.status}** {o.killed_by}".strip()
        secs = f"{o.seconds:.1f}" if o.status not in ("equivalent", "unchanged") else "-"
        print(f"| `{o.mutant.id}` | {o.mutant.what} | {by} | {secs} |")
    states = ("killed", "SURVIVED", "ERROR", "equivalent", "unchanged")
    counts = {s: sum(o.status == s for o in outcomes) for s in states}
    ran = counts["killed"] + counts["SURVIVED"] + counts["ERROR"]
    print()
    print(
        f"{counts['killed']} of {ran} mutants run killed, {counts['SURVIVED']} survived, {counts['ERROR']} errors; "
        f"{counts['unchanged']} unchanged since their recorded kill (scripts/mutation_record.json), "
        f"{counts['equivalent']} equivalent (listed with their reason); {total:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
