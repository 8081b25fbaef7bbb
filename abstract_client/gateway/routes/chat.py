"""The generation routes — ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` —
each parsed into a :class:`~.runner.Job` the runner runs: a stream (SSE, OpenAI's chat or
completions frames) or a whole answer (JSON)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from starlette.requests import Request

from ...wires.chat_server import (
    BadRequest,
    ChatFrames,
    chat_completion,
    embeddings_body,
    generation_args,
    model_field,
    text_completion,
)
from ..gateway import Gateway
from ..runner import Job, JobResponse
from .prologue import Parsed, parse_request

__all__ = ["embeddings_endpoint", "generation_endpoint"]


def generation_endpoint(gateway: Gateway, *, chat: bool) -> Callable[[Request], Awaitable[Any]]:
    endpoint = "chat" if chat else "completions"

    async def handle(request: Request) -> Any:
        got = await parse_request(gateway, request, partial(generation_args, chat=chat))
        if not isinstance(got, Parsed):
            return got
        (kwargs, stream, include_usage), model, request_id = got.args, got.model, got.request_id
        job = Job(endpoint, got.backend, request_id, "stream" if stream else "generate", kwargs)
        if stream:
            job.frames = ChatFrames(request_id, model, chat=chat, include_usage=include_usage)
        else:
            job.body_of = partial(chat_completion if chat else text_completion, request_id=request_id, model=model)
        job.max_tokens, job.prompt = kwargs.get("max_tokens"), kwargs
        return JobResponse(gateway.runner, job)

    return handle


def embeddings_endpoint(gateway: Gateway) -> Callable[[Request], Awaitable[Any]]:
    async def handle(request: Request) -> Any:
        got = await parse_request(gateway, request, _embedding_args)
        if not isinstance(got, Parsed):
            return got
        kwargs, body_of = got.args, partial(embeddings_body, model=got.model)
        job = Job("embeddings", got.backend, got.request_id, "embed", kwargs, body_of=body_of, max_tokens=0)
        job.prompt = {"input": kwargs["texts"]}
        return JobResponse(gateway.runner, job)

    return handle


def _embedding_args(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
        raise BadRequest("input must be a string or a list of strings")
    model_field(body)
    return {"texts": inputs, "dimensions": _integral(body.get("dimensions"))}


def _integral(value: Any) -> Any:
    """JSON Schema's integer takes 64.0 as 64 (the spec this gateway serves says integer)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
