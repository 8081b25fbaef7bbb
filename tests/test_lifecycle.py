"""A call's lifecycle is one table (contract/lifecycle.py): every move is checked against it,
real calls walk it, observers see every move and cannot change a call, and nothing outside the
contract writes a call."""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.contract.call import Call, CallSpec
from abstract_client.contract.lifecycle import MOVES, LifecycleError, Phase, _observers, observe
from abstract_client.contract.retry import RetryPolicy
from abstract_client.stopping.token import InflightRegistry, StopToken
from abstract_client.testing import FakeOpenAIServer
from abstract_client.types import GenerationRequest, Timeout

from .helpers import press_when

ROOT = Path(__file__).resolve().parent.parent


def _bare_call() -> Call:
    llm = create_llm("llamacpp", base_url="http://127.0.0.1:9")
    spec = CallSpec(llm.provider, GenerationRequest(messages=[], model=None), Timeout(), RetryPolicy())
    llm.close()
    return Call(spec, StopToken("t"), InflightRegistry())


@pytest.mark.parametrize("left", list(Phase))
@pytest.mark.parametrize("to", list(Phase))
def test_every_move_is_the_tables(left: Phase, to: Phase, monkeypatch: pytest.MonkeyPatch) -> None:
    from abstract_client.contract import lifecycle

    monkeypatch.setattr(lifecycle, "_observers", [])  # a bare call: no span, no log context
    call = _bare_call()
    call._phase = left
    if to in MOVES[left]:
        call.move(to, clean=True)
        assert call.phase is to
    else:
        with pytest.raises(LifecycleError):
            call.move(to, clean=True)
        assert call.phase is left


def test_the_table_is_documented_and_closed() -> None:
    from abstract_client.contract import lifecycle

    assert set(MOVES) == set(Phase)
    assert all(to in Phase for moves in MOVES.values() for to in moves)
    assert MOVES[Phase.RELEASED] == frozenset()  # released is the end
    for phase in Phase:  # the module's table names every phase
        assert f"\n{phase.name} " in (lifecycle.__doc__ or "")


@pytest.fixture
def walks() -> Iterator[dict[str, list[str]]]:
    """Every call's observed moves, by request id."""
    seen: dict[str, list[str]] = {}

    def watch(call: Any, what: str, info: Mapping[str, Any]) -> None:
        seen.setdefault(call.request_id, []).append(what)

    observe(watch)
    try:
        yield seen
    finally:
        _observers.remove(watch)


def _is_a_walk(moves: list[str]) -> bool:
    phase = Phase.BUILT
    for what in moves:
        if what == "retry":
            continue
        to = Phase(what)
        if to not in MOVES[phase]:
            return False
        phase = to
    return phase is Phase.RELEASED


def test_real_calls_walk_the_table(walks: dict[str, list[str]]) -> None:
    with FakeOpenAIServer(token_delay=0.005) as server, create_llm("llamacpp", base_url=server.base_url) as llm:
        llm.generate("hi", max_tokens=3, request_id="done")
        pre = threading.Event()
        pre.set()
        with pytest.raises(GenerationCancelledError):
            llm.generate("hi", cancel_event=pre, request_id="preset")
        llm.stream("hi", request_id="dropped").close()  # built, never iterated
        stop = threading.Event()
        before = len(server.records)  # the stream's own record: not the finished call's
        press = press_when(lambda: len(server.records) > before and server.last.tokens_sent >= 2, stop.set)
        with pytest.raises(GenerationCancelledError):
            for _ in llm.stream("hi", max_tokens=10_000, cancel_event=stop, request_id="stopped"):
                pass
        press.wait()
        server.inject("status_502")  # retryable: one retry event, then the answer
        llm.generate("hi", max_tokens=2, request_id="retried")
    assert walks["done"] == ["admitted", "prepared", "released"]
    assert walks["preset"] == ["admitted", "released"]
    assert walks["dropped"] == ["released"]
    assert walks["stopped"] == ["admitted", "prepared", "released"]
    assert walks["retried"] == ["admitted", "prepared", "retry", "released"]
    assert all(_is_a_walk(moves) for moves in walks.values()), walks


def test_an_observer_that_fails_changes_nothing(walks: dict[str, list[str]]) -> None:
    def broken(call: Any, what: str, info: Mapping[str, Any]) -> None:
        raise RuntimeError("observer bug")

    observe(broken)
    try:
        with FakeOpenAIServer(token_delay=0.0) as server, create_llm("llamacpp", base_url=server.base_url) as llm:
            assert llm.generate("hi", max_tokens=2, request_id="x").content
            assert llm.in_flight == []
    finally:
        _observers.remove(broken)
    assert walks["x"] == ["admitted", "prepared", "released"]


def test_nothing_outside_the_contract_writes_a_call() -> None:
    """A call's fields are written by the contract only (abstract_client/contract/); others
    read, or keep their own data in ``call.extensions`` (a dict the observer owns)."""
    found = []
    for path in [*(ROOT / "abstract_client").rglob("*.py"), *(ROOT / "providers").rglob("*.py")]:
        if "contract" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "call"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: call.{target.attr} = ...")
    assert found == []
