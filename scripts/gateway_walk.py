"""Measure the walk of a gateway request: ``python3 scripts/gateway_walk.py`` (the figures
docs/architecture.md gives).

One streamed chat request (``POST /v1/chat/completions``, ``stream: true``, 3 tokens) to an
in-process gateway in front of a fake server, traced with ``threading.setprofile``: every function
of ``abstract_client/gateway/`` the gateway's threads call while the request is served is a step,
named by its module (a repeat of the module just left is the same step) — except the flight's
own methods (``flight.py``: the record, not the route; counted apart), as ``call_walk.py`` leaves
out the ``Call``'s. Printed: the modules in
the order the walk enters them, the number of files, of steps, and of climbs (entering again a
module the walk left earlier: the reader goes back up), and of those the climbs back into a route
module (the runner calling back into the route that made the request). Run it on two trees to
compare them (the routes were ``generation.py``, ``messages.py``, ``responses.py`` and
``routes.py`` before #70).
"""

from __future__ import annotations

import itertools
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = ROOT / "abstract_client" / "gateway"


def walk() -> list[str]:
    import httpx

    from abstract_client.gateway import BackendConfig, GatewayConfig
    from abstract_client.testing import FakeOpenAIServer
    from abstract_client.testing.gateway import InProcessGateway

    modules: list[str] = []
    recorded = [0]
    on = threading.Event()
    lock = threading.Lock()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not on.is_set() or frame.f_code.co_name.startswith("<"):
            return
        path = Path(frame.f_code.co_filename)
        if not path.is_relative_to(GATEWAY):
            return
        name = str(path.relative_to(GATEWAY))
        with lock:
            if name == "flight.py":
                recorded[0] += 1
            elif not modules or modules[-1] != name:
                modules.append(name)

    threading.setprofile(profile)  # the gateway's threads, started below, serve the request
    try:
        with FakeOpenAIServer(token_delay=0.0) as upstream:
            backend = BackendConfig(name="m", provider="openai-compatible", base_url=upstream.base_url)
            config = GatewayConfig(backends=[backend], health_interval=300.0)
            with InProcessGateway(config) as gateway:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
                for measured in (False, True):  # the first: imports and connections, off the walk
                    with httpx.Client(timeout=30) as client:
                        if measured:
                            on.set()
                        with client.stream("POST", gateway.url + "/v1/chat/completions", json=body) as r:
                            r.read()
                        on.clear()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    print(f"(the flight's own methods called {recorded[0]} times)")
    return modules


ROUTES = {"generation.py", "messages.py", "responses.py", "routes.py"}  # before #70; since: routes/


def main() -> None:
    modules = walk()
    left: set[str] = set()
    climbs = into_routes = 0
    for before, now in itertools.pairwise(modules):
        left.add(before)
        climbs += now in left
        into_routes += now in left and (now in ROUTES or now.startswith("routes/"))
    print(" → ".join(m.removesuffix(".py") for m in modules))
    print(
        f"{len(set(modules))} files, {len(modules) - 1} steps, {climbs} climbs back up "
        f"({into_routes} of them into a route)"
    )


if __name__ == "__main__":
    sys.exit(main())
