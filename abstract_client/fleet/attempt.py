"""One attempt of a fleet call on one member: its own stop token and socket guard, tied to the
call's.

The call's stop reaches every attempt (a hook on the call's token stops the attempt's, at the
TELL step: the member's server is told at once), but an attempt can also be stopped alone — a
hedge that lost — without touching the call. The attempt's guard owns the member connection's
socket exactly as the contract's guard owns a single-backend call's: the stop shuts it down, a
clean end leaves the connection for the next call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio

from ..errors import AbstractClientError
from ..http.guard import SocketGuard, current_guard
from ..provider import CallContext, http_clients
from ..stopping.token import Step, StopToken
from ..types import GenerationRequest, StreamChunk
from .health import counts_against

if TYPE_CHECKING:
    from .member import Member

__all__ = ["Attempt"]

log = logging.getLogger(__name__)


class Attempt:
    """One member's try at a fleet call: its own stop token (stopped by the call's, or by losing a
    hedge) and its stream."""

    def __init__(
        self,
        member: Member,
        request: GenerationRequest,
        call_ctx: CallContext,
        *,
        fleet_model: str | None,
        hedge: bool,
    ) -> None:
        self.member = member
        self.hedge = hedge
        provider = member.llm.provider
        self.provider = provider
        if request.model == fleet_model and provider.model is not None:
            request = replace(request, model=provider.model)  # each member asks for its own name
        self.request = request
        self.token = StopToken(call_ctx.request_id)
        self.guard: SocketGuard | None = None
        self.clients = http_clients(provider)
        if self.clients is not None:
            self.guard = SocketGuard()
            self.guard.register(self.token)
        self._event = call_ctx.span_event
        if self._event is not None:
            self._event("fleet.attempt", {"member": member.name, "hedge": hedge})
        self.ctx = CallContext(
            token=self.token,
            request_id=call_ctx.request_id,
            clients=self.clients,
            connect_timeout=call_ctx.connect_timeout,
            extensions=call_ctx.extensions,
        )
        parent = call_ctx.token
        self._parent = parent
        self._unhook = parent.add_hook(
            lambda: self.token.stop(parent.reason or "user", internal=parent.internal), step=Step.TELL
        )
        self._source: AsyncGenerator[StreamChunk, None] | None = None
        self.started_at = time.perf_counter()
        self.first_at: float | None = None
        self.lost = False  # a hedge race this attempt did not win
        self.closed = False
        member.enter(self)
        if hedge:
            member.count("hedges_sent")

    async def next(self) -> StreamChunk:
        """The member's next chunk (``StopAsyncIteration`` at its end), under this attempt's guard."""
        reset = current_guard.set(self.guard)  # a connection made (or reused) now is this attempt's
        try:
            if self._source is None:
                if self.clients is not None:
                    await self.clients.prepare()
                self._source = self.provider.stream(self.request, self.ctx)
            chunk = await self._source.__anext__()
        finally:
            current_guard.reset(reset)
        if self.first_at is None:
            self.first_at = time.perf_counter()
        return chunk

    @property
    def running(self) -> bool:
        """Neither closed nor stopped: the call's own token is set before any hook of its stop
        runs, so this turns false before the caller can learn of the stop."""
        return not (self.closed or self.token.is_set or self._parent.is_set)

    def stop(self) -> None:
        """Stop this attempt alone (a hedge that lost): its server is told, its socket severed."""
        self.lost = True
        self.token.stop("user", internal=True)

    async def close(self, *, error: AbstractClientError | None = None, completed: bool = False) -> None:
        """End the attempt (idempotent): stop it unless it completed, close the member's stream,
        free or sever its connection, and judge the member. ``error``: the attempt failed while
        nothing had stopped it — the only case the member is judged by (a stop, a lost hedge, a
        consumer that left never count, whatever error the severed connection surfaced)."""
        if self.closed:
            return
        self.closed = True
        self._unhook()
        member = self.member
        stopped = self.token.is_set
        if not completed:
            self.token.stop("user", internal=True)
        try:
            if self._source is not None:
                with anyio.CancelScope(shield=True):
                    await self._source.aclose()
        except Exception:  # the stream's own unwinding after a stop: nothing for the caller
            log.debug("fleet: closing %s's stream", member.name, exc_info=True)
        finally:
            if self.guard is not None:
                if completed:
                    self.guard.detach()
                else:
                    self.guard.sever()
            self.token.release()
            member.leave(self)
        outcome = "served"
        if completed:
            member.health.succeeded()
        elif error is not None and not stopped:
            outcome = "failed"
            if counts_against(error):
                member.count("failed")
                if member.health.failed():
                    log.warning("fleet: %s is cooling down after %s", member.name, error)
        else:
            outcome = "lost" if self.lost else "stopped"
            member.count("stopped")
        if self._event is not None:
            attributes: dict[str, object] = {"member": member.name, "outcome": outcome}
            if outcome == "failed" and error is not None:
                attributes["error.type"] = type(error).__name__
            self._event("fleet.attempt_end", attributes)
