"""A call's lifecycle is one table that drives it (contract/lifecycle.py): every (phase, event)
pair is the table's or refused, real calls walk it, ADMITTED means what its row says when
observers hear of it, observers cannot change a call, and nothing outside the contract writes a
call (in any form)."""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.contract.call import Call, CallSpec
from abstract_client.contract.lifecycle import FINAL, TRANSITIONS, Event, LifecycleError, Phase, _observers, observe
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
@pytest.mark.parametrize("event", list(Event))
def test_every_pair_is_the_tables(left: Phase, event: Event, monkeypatch: pytest.MonkeyPatch) -> None:
    from abstract_client.contract import lifecycle

    monkeypatch.setattr(lifecycle, "_observers", [])  # a bare call: no span, no log context
    monkeypatch.setattr(lifecycle, "ACTIONS", {})  # the table alone: nothing held or let go
    call = _bare_call()
    call._phase = left
    to = TRANSITIONS.get((left, event))
    if to is not None:
        call.handle(event, clean=True)
        assert call.phase is to
    else:
        with pytest.raises(LifecycleError):
            call.handle(event, clean=True)
        assert call.phase is left


def test_the_table_is_documented_and_closed() -> None:
    from abstract_client.contract import lifecycle

    assert {left for left, _ in TRANSITIONS} | set(TRANSITIONS.values()) == set(Phase)
    assert all(left not in FINAL for left, _ in TRANSITIONS)  # an outcome is the end
    assert set(lifecycle.ACTIONS) <= set(TRANSITIONS)
    for phase in Phase:  # the module's table names every phase
        assert f"\n{phase.name} " in (lifecycle.__doc__ or "")


def test_admitted_means_what_its_row_says_when_observers_hear_of_it() -> None:
    """Listed in flight, its stop sources bound, its socket guard made — before the move is
    announced: an event set by the observer at that moment is already the call's stop, so
    nothing is sent."""
    seen: list[tuple[bool, bool, bool]] = []
    stop = threading.Event()

    def at_admission(call: Any, what: str, info: Mapping[str, Any]) -> None:
        if what == "admitted":
            stop.set()
            seen.append((call.request_id in call.registry.ids(), call.token.is_set, call.guard is not None))

    observe(at_admission)
    try:
        with FakeOpenAIServer() as server, create_llm("llamacpp", base_url=server.base_url) as llm:
            with pytest.raises(GenerationCancelledError):
                llm.generate("hi", cancel_event=stop, request_id="row")
            assert server.records == [] and llm.in_flight == []
    finally:
        _observers.remove(at_admission)
    assert seen == [(True, True, True)]


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
        if what in {event.value for event in Event}:  # a move that stays: its event's name
            assert (phase, Event(what)) in TRANSITIONS, (phase, what)
            continue
        to = Phase(what)
        if to not in {TRANSITIONS[pair] for pair in TRANSITIONS if pair[0] is phase}:
            return False
        phase = to
    return phase in FINAL


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
    assert walks["done"] == ["admitted", "prepared", "answered", "completed"]
    assert walks["preset"] == ["admitted", "released"]
    assert walks["dropped"] == ["released"]
    # the sync caller raises its stop from its thread (HAND_OVER) unless the loop released it first
    assert walks["stopped"] in (["admitted", "prepared", "hand_over", "released"], ["admitted", "prepared", "released"])
    assert walks["retried"] == ["admitted", "prepared", "retry", "answered", "completed"]
    assert all(_is_a_walk(moves) for moves in walks.values()), walks


def test_a_call_refused_while_it_is_prepared_never_enters_prepared(walks: dict[str, list[str]]) -> None:
    """PREPARED means the request is fixed and checked: an image URL the wire takes as data only
    (Ollama's native wire) is refused before the move, so observers never hear of it."""
    from abstract_client import NotSupportedError
    from abstract_client.testing import FakeOllamaServer

    picture = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]
    with FakeOllamaServer() as server, create_llm("ollama", "m", base_url=server.base_url) as llm:
        with pytest.raises(NotSupportedError):
            llm.generate(messages=picture, request_id="refused")
        assert server.records == []
    assert walks["refused"] == ["admitted", "released"]


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
    assert walks["x"] == ["admitted", "prepared", "answered", "completed"]


def _rooted_at_call(node: ast.expr) -> bool:
    """``call``, ``call.x``, ``call.ctx.x``, ``call.progress.parts[0]``: an expression reaching
    into a call (``call.extensions[...]`` is the observers' own dict, and excepted; ``call[...]``
    is some other ``call``: a Call has no items)."""
    first: ast.expr = node
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            if node.value.attr == "extensions":
                return False
        first, node = node, node.value
    return isinstance(node, ast.Name) and node.id == "call" and not isinstance(first, ast.Subscript)


def _writes(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                for part in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
                    if isinstance(part, ast.Attribute | ast.Subscript) and _rooted_at_call(part):
                        yield node.lineno, ast.unparse(part)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and _rooted_at_call(node.args[0]):
                yield node.lineno, ast.unparse(node)


def test_the_write_guard_sees_every_form() -> None:
    code = (
        "call.x = 1\ncall.ctx.x = 1\ncall.progress.parts[0] = 'a'\ncall.t0 += 1\na, call.y = 1, 2\n"
        "setattr(call, 'x', 1)\nsetattr(call.ctx, 'x', 1)\ndel call.guard\ncall.extensions['k'] = 1\n"
    )
    assert sorted(line for line, _ in _writes(ast.parse(code))) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_nothing_outside_the_contract_writes_a_call() -> None:
    """A call's fields — and its context's, its progress's — are written by the contract only
    (abstract_client/contract/); others read, or keep their own data in ``call.extensions``
    (a dict the observer owns)."""
    found = []
    for path in [*(ROOT / "abstract_client").rglob("*.py"), *(ROOT / "providers").rglob("*.py")]:
        if "contract" in path.relative_to(ROOT).parts:
            continue
        found += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in _writes(ast.parse(path.read_text()))]
    assert found == []
