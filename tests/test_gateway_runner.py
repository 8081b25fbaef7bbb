"""One runner for every request the gateway serves (#70): a foreground request and a background
response go through the same steps — a slot (bounded), a stop while queued, the answer, the
accounting — so what one gets, the other gets. The drifts the two copies had are tested here and
in tests/test_gateway.py (a background response refused by a full queue is counted)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

from abstract_client.errors import GenerationCancelledError
from abstract_client.gateway.app import create_app
from abstract_client.gateway.background import Background, KeptEvents
from abstract_client.gateway.config import load_config
from abstract_client.gateway.flight import Flight
from abstract_client.gateway.runner import Job
from abstract_client.gateway.sinks import ClientWhole
from abstract_client.wires.responses_server import ResponseBuilder


def test_a_request_stopped_while_queued_carries_the_stops_reason_wherever_its_answer_goes(tmp_path: Path) -> None:
    """A shutdown that ends a request waiting for a slot is a ``shutdown`` stop, whether its answer
    goes to its client or is kept for a background response's readers (the background copy of
    the runner said ``user``)."""
    path = tmp_path / "gateway.toml"
    path.write_text('[[backend]]\nname = "m"\nprovider = "openai-compatible"\nmax_concurrent = 1\n')
    gateway = create_app(load_config(path)).state.gateway
    backend = gateway.backends["m"]
    stops: list[GenerationCancelledError] = []
    gateway.stop_recorded = lambda flight, err: stops.append(err)

    async def send(message: Any) -> None:
        return None

    async def main() -> list[int]:
        assert backend.slots.try_acquire("someone else", 1)  # the only slot is taken
        statuses = []
        for kept in (False, True):
            flight = Flight(f"r{kept}", backend, loop=asyncio.get_running_loop())
            job = Job("responses", backend, f"r{kept}", "stream", {"messages": [{"role": "user", "content": "hi"}]})
            builder = ResponseBuilder(f"resp_{kept}", "m", {"model": "m", "input": "hi"}, background=True)
            sink = KeptEvents(Background(builder, flight, None), 1 << 20) if kept else ClientWhole(send, flight, dict)
            waiting = asyncio.create_task(gateway.runner._in_slot(flight, job, sink))
            while flight.queue_scope is None:  # queued
                await asyncio.sleep(0.001)
            flight.stop("shutdown")
            statuses.append(await waiting)
        backend.slots.release("someone else")
        return statuses

    assert asyncio.run(main()) == [499, 499]
    assert [(e.reason, e.signal_reason) for e in stops] == [("shutdown", "shutdown")] * 2


def _rooted_at_a_flight(node: ast.expr) -> bool:
    """``flight.x``, ``record.flight.x``, ``self.flight.x[0]``: an expression reaching into a
    flight (a name or an attribute called ``flight``)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
        if isinstance(node, ast.Attribute) and node.attr == "flight":
            return True
    return isinstance(node, ast.Name) and node.id == "flight"


def _flight_writes(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets = [node.optional_vars]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            targets = [ast.Attribute(value=node.args[0], attr="?")] if node.args else []
        for target in targets:
            for part in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
                if isinstance(part, ast.Attribute | ast.Subscript) and _rooted_at_a_flight(part):
                    found.append((node.lineno if hasattr(node, "lineno") else 0, ast.unparse(part)))
    return found


def test_the_flight_write_guard_sees_every_form() -> None:
    code = (
        "flight.x = 1\nrecord.flight.x = 1\nflight.a, flight.b = 1, 2\nflight.n += 1\n"
        "setattr(flight, 'x', 1)\ndel flight.x\nwith f() as flight.span: pass\nflight.stop('r')\nx = flight.y\n"
    )
    assert len(_flight_writes(ast.parse(code))) == 8


def test_nothing_but_the_flight_writes_a_flight() -> None:
    """A flight's fields are set where it is made and by its own methods (``gateway/flight.py``);
    every other module of the gateway reads them, or calls a method named for what happened."""
    gateway = Path(__file__).resolve().parent.parent / "abstract_client" / "gateway"
    found = [
        f"{path.name}:{line}: {what}"
        for path in sorted(gateway.rglob("*.py"))
        if path.name != "flight.py"
        for line, what in _flight_writes(ast.parse(path.read_text()))
    ]
    assert found == []


def test_an_answer_is_on_its_keys_record_before_its_client_can_see_its_end(tmp_path: Path) -> None:
    """The record of an answered request is written (to the usage journal, at once) before the
    answer's last bytes go to its client: a gateway killed the moment after loses none
    (tests/test_gateway_team_defects.py kills one; this is the order that makes it hold)."""
    from abstract_client.gateway.team.keys import ANONYMOUS
    from abstract_client.testing import FakeOpenAIServer

    accounted_at_the_end: list[bool] = []

    class Watching(ClientWhole):
        async def end(self, result: Any) -> int:
            accounted_at_the_end.append(self.flight.accounted)
            return await super().end(result)

    async def send(message: Any) -> None:
        return None

    with FakeOpenAIServer(token_delay=0.0) as upstream:
        path = tmp_path / "gateway.toml"
        path.write_text(
            f'[server]\ndata_dir = "{tmp_path / "data"}"\n[[backend]]\nname = "m"\n'
            f'provider = "openai-compatible"\nmodel = "fake-model"\nbase_url = "{upstream.base_url}"\n'
        )
        gateway = create_app(load_config(path)).state.gateway

        async def main() -> int:
            messages = [{"role": "user", "content": "hi"}]
            job = Job("chat", gateway.backends["m"], "r1", "generate", {"messages": messages, "max_tokens": 2})
            admitted = await gateway.runner.admit(job, ANONYMOUS)
            flight = gateway.runner.flight(job, ANONYMOUS, admitted, None, "r1")
            status = await gateway.runner.run(flight, job, Watching(send, flight, lambda result: {"ok": True}))
            assert flight.error is None, flight.error
            return status

        try:
            assert asyncio.run(main()) == 200
        finally:
            gateway.accounting.close()
    assert accounted_at_the_end == [True]
