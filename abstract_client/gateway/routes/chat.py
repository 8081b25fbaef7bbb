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
from ..http.error_answers import error_response, no_backend
from ..http.reading import read_json, request_id_of
from ..runner import Job, JobResponse

__all__ = ["embeddings_endpoint", "generation_endpoint"]


def generation_endpoint(gateway: Gateway, *, chat: bool) -> Callable[[Request], Awaitable[Any]]:
    endpoint = "chat" if chat else "completions"

    async def handle(request: Request) -> Any:
        try:
            body = await read_json(request)
            kwargs, stream, include_usage = generation_args(body, chat=chat)
        except BadRequest as err:
            return error_response(err)
        backend = gateway.backend_for(body.get("model"))
        if backend is None:
            return no_backend(body.get("model"))
        model = str(body.get("model") or backend.name)
        request_id = request_id_of(request)
        job = Job(endpoint, backend, request_id, "stream" if stream else "generate", kwargs)
        if stream:
            job.frames = ChatFrames(request_id, model, chat=chat, include_usage=include_usage)
        else:
            job.body_of = partial(chat_completion if chat else text_completion, request_id=request_id, model=model)
        job.max_tokens, job.prompt = kwargs.get("max_tokens"), kwargs
        return JobResponse(gateway.runner, job)

    return handle


def embeddings_endpoint(gateway: Gateway) -> Callable[[Request], Awaitable[Any]]:
    async def handle(request: Request) -> Any:
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            inputs = body.get("input")
            if isinstance(inputs, str):
                inputs = [inputs]
            if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
                raise BadRequest("input must be a string or a list of strings")
            model_field(body)
        except BadRequest as err:
            return error_response(err)
        backend = gateway.backend_for(body.get("model"))
        if backend is None:
            return no_backend(body.get("model"))
        model = str(body.get("model") or backend.name)

        kwargs = {"texts": inputs, "dimensions": _integral(body.get("dimensions"))}
        body_of = partial(embeddings_body, model=model)
        job = Job("embeddings", backend, request_id_of(request), "embed", kwargs, body_of=body_of, max_tokens=0)
        job.prompt = {"input": inputs}
        return JobResponse(gateway.runner, job)

    return handle


def _integral(value: Any) -> Any:
    """JSON Schema's integer takes 64.0 as 64 (the spec this gateway serves says integer)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
