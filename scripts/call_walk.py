"""Measure the walk of a call: ``python3 scripts/call_walk.py`` (the figures docs/architecture.md gives).

One non-streaming ``generate`` on the ``llamacpp`` lane against a fake server, traced with
``sys.setprofile``: every function of the library that is handed the call's ``Call`` as an
argument is a step of the walk, named by its module — except the ``Call``'s own methods (the
record, not the route) and the lifecycle's observers (told of each move; counted apart).
Printed: the modules in the order the walk enters them (a repeat of the module just left is the
same step), the number of files, of steps, and of climbs (entering again a module the walk left
earlier: the reader goes back up).
"""

from __future__ import annotations

import itertools
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def walk() -> list[str]:
    from abstract_client import create_llm
    from abstract_client.contract.call import Call
    from abstract_client.testing import FakeOpenAIServer

    modules: list[str] = []
    observed = [0]
    entered: dict[int, FrameType] = {}
    on = False

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if not on or event != "call" or id(frame) in entered:  # a coroutine resumed: the same step
            return
        entered[id(frame)] = frame  # held: an id is not reused while the walk is measured
        path = Path(frame.f_code.co_filename).resolve()
        if not (path.is_relative_to(ROOT / "abstract_client") or path.is_relative_to(ROOT / "providers")):
            return
        code = frame.f_code
        arguments = [frame.f_locals.get(name) for name in code.co_varnames[: code.co_argcount]]
        if not any(type(value) is Call for value in arguments) or (
            type(arguments[0]) is Call and code.co_varnames[0] == "self"
        ):
            return
        name = str(path.relative_to(ROOT))
        if name in OBSERVERS:
            observed[0] += 1
        elif not modules or modules[-1] != name:
            modules.append(name)

    threading.setprofile(profile)  # the LLM's loop thread, started below, runs the call
    sys.setprofile(profile)
    try:
        with FakeOpenAIServer() as server, create_llm("llamacpp", "m", base_url=server.base_url) as llm:
            llm.generate("warm", max_tokens=2)  # imports and the first connection, off the walk
            on = True
            llm.generate("hi", max_tokens=2)
            on = False
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    print(f"(observers told {observed[0]} times)")
    return modules


OBSERVERS = {"abstract_client/contract/lifecycle.py", "abstract_client/telemetry.py"}


def main() -> None:
    modules = walk()
    left: set[str] = set()
    climbs = 0
    for before, now in itertools.pairwise(modules):
        left.add(before)
        climbs += now in left
    print(" → ".join(Path(m).stem for m in modules))
    print(f"{len(set(modules))} files, {len(modules) - 1} steps, {climbs} climbs back up")


if __name__ == "__main__":
    main()
