"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API, for
every backend the gateway serves (Claude Code, the ``anthropic`` SDK, the agents built on them).

The same runner as the chat route (``runner.py``): keys, request ids, slots, bounds, stop
records, and a client that leaves is the stop — the upstream severed, the
in-process engine's flag set. Only the wire differs (``wires/messages_server.py``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from ...types import GenerationRequest
from ...wires.messages_server import MessageFrames, anthropic_shape, message_body, messages_args
from ..flight import Backend
from ..gateway import Gateway
from ..http.error_answers import anthropic_error_response, refusal_response
from ..http.scope import caller_of
from ..runner import Job, JobResponse
from ..team.limits import Refusal
from .prologue import Parsed, parse_request

__all__ = ["count_tokens_endpoint", "messages_endpoint"]

log = logging.getLogger(__name__)


async def _offer_tools_if_callable(backend: Backend, request_id: str, kwargs: dict[str, Any]) -> None:
    """An agent sends its whole tool list with every turn and leaves the choice to the model
    (no ``tool_choice``: auto). On a backend whose model cannot call tools, the library refuses
    an auto choice (a typed error: it cannot be honoured); here the tools are not offered
    instead, as llama-server and Ollama do themselves, so the agent gets an answer in words. A
    ``tool_choice`` the client gave is left to the library (any/tool: constrained output)."""
    if not kwargs.get("tools") or "tool_choice" in kwargs:
        return
    provider = backend.llm.provider
    probe = GenerationRequest(messages=[], model=provider.model, tools=kwargs["tools"], tool_choice="auto")
    try:
        callable_tools = await provider.native_tools(probe)
    except Exception:  # the backend's capability could not be read: let the call say what fails
        return
    if not callable_tools:
        log.info("%s: the model does not call tools; %d tool(s) not offered", request_id, len(kwargs["tools"]))
        del kwargs["tools"]


def messages_endpoint(gateway: Gateway) -> Callable[[Request], Awaitable[Any]]:
    async def handle(request: Request) -> Any:
        got = await parse_request(gateway, request, messages_args, anthropic=True)
        if not isinstance(got, Parsed):
            return got
        (kwargs, stream), backend, model, request_id = got.args, got.backend, got.model, got.request_id
        await _offer_tools_if_callable(backend, request_id, kwargs)
        job = Job("messages", backend, request_id, "stream" if stream else "generate", kwargs, shape=anthropic_shape)
        if stream:
            job.frames = MessageFrames(request_id, model)
        else:
            job.body_of = partial(message_body, request_id=request_id, model=model)
        job.max_tokens, job.prompt = kwargs["max_tokens"], kwargs
        return JobResponse(gateway.runner, job)

    return handle


def count_tokens_endpoint(gateway: Gateway) -> Callable[[Request], Awaitable[Any]]:
    async def handle(request: Request) -> Any:
        got = await parse_request(gateway, request, partial(messages_args, count_only=True), anthropic=True)
        if not isinstance(got, Parsed):
            return got
        (kwargs, _), backend = got.args, got.backend
        # within the key's concurrency and requests per minute (a count costs no tokens), and on
        # its record
        name, started = caller_of(request.scope).name, time.time()
        request_id = got.request_id
        admitted = await gateway.accounting.admit(name, 0, count_only=True)
        if isinstance(admitted, Refusal):
            refusal, headers = gateway.accounting.refused(admitted, name, backend.name, "count_tokens", request_id)
            return refusal_response(admitted.status, refusal, headers, anthropic_shape)
        failed: BaseException | None = None
        try:
            count = await backend.llm.acount_tokens(messages=kwargs["messages"], timeout=30.0)
        except Exception as err:  # a lane without a tokenizer route: 400 not supported
            failed = err
            return anthropic_error_response(err)
        finally:
            admitted.settle(0)
            gateway.accounting.counted(name, backend.name, request_id, started, failed)
        return JSONResponse({"input_tokens": count})

    return handle
