"""The generation routes — ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` —
each a :class:`~.asgi.GenerationResponse` whose run is a whole answer (JSON) or a stream (SSE,
frames coalesced by :class:`~.sse_writer.FrameWriter`). A stopped call is recorded
(``Gateway.stop_recorded``) and answered only if its client is still there."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from starlette.requests import Request
from starlette.types import Send

from ..errors import GenerationCancelledError
from ..types import GenerateResult, StreamChunk
from ..wires.chat_server import (
    BadRequest,
    FrameEncoder,
    Shape,
    as_written,
    chat_completion,
    error_body,
    error_headers,
    generation_args,
    model_field,
    shaped_error,
    sse,
    text_completion,
    usage_frame,
)
from .asgi import GenerationResponse, guarded_send, guarded_send_json
from .body import error_response, no_backend, read_json, request_id_of
from .sse_writer import FrameWriter
from .state import Flight, Gateway

__all__ = [
    "StreamFrames",
    "embeddings_endpoint",
    "generation_endpoint",
    "stream_answer",
    "stream_generation",
    "whole_answer",
    "whole_generation",
]


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
        model_name = str(body.get("model") or backend.name)
        request_id = request_id_of(request)
        kind = stream_generation if stream else whole_generation

        async def run(flight: Flight, send: Send) -> int:
            return await kind(gateway, flight, send, kwargs, model_name, chat=chat, include_usage=include_usage)

        return GenerationResponse(
            gateway, backend, request_id, endpoint, run, max_tokens=kwargs.get("max_tokens"), prompt=kwargs
        )

    return handle


async def whole_generation(
    gateway: Gateway,
    flight: Flight,
    send: Send,
    kwargs: dict[str, Any],
    model: str,
    *,
    chat: bool,
    include_usage: bool,
) -> int:
    async def produce() -> Any:
        result = await flight.backend.llm.agenerate(
            **kwargs, signal=flight.controller.signal, request_id=flight.call_id
        )
        flight.answered(result.usage, gateway.metrics)
        return (chat_completion if chat else text_completion)(result, flight.request_id, model)

    return await whole_answer(gateway, flight, send, produce)


async def whole_answer(
    gateway: Gateway,
    flight: Flight,
    send: Send,
    produce: Callable[[], Awaitable[Any]],
    shape: Shape = as_written,
) -> int:
    """A non-streaming answer: 200 with ``produce()``'s body, or the error's status and body (in
    the route's ``shape``); a stopped call is recorded (and answered only if its client is still
    there)."""
    try:
        body = await produce()
    except GenerationCancelledError as err:
        gateway.stop_recorded(flight, err)
        if not flight.client_gone:
            await guarded_send_json(send, flight, *shaped_error(err, shape))
        return 499
    except Exception as err:
        flight.error = err
        status, payload = shaped_error(err, shape)
        await guarded_send_json(send, flight, status, payload, error_headers(err))
        return status
    await guarded_send_json(send, flight, 200, body)
    return 200


async def stream_generation(
    gateway: Gateway,
    flight: Flight,
    send: Send,
    kwargs: dict[str, Any],
    model: str,
    *,
    chat: bool,
    include_usage: bool,
) -> int:
    """SSE in OpenAI's chat (or completions) frames, ``[DONE]`` at the end."""
    frames = _ChatFrames(flight.request_id, model, chat=chat, include_usage=include_usage)
    return await stream_answer(gateway, flight, send, kwargs, frames)


class StreamFrames(Protocol):
    """What a stream route sends: the bytes of a chunk, of a complete answer's end, and of a
    failure once the first frame is out."""

    def chunk(self, chunk: StreamChunk) -> bytes: ...

    def end(self, result: GenerateResult) -> bytes: ...

    def failure(self, err: Exception) -> bytes: ...


class _ChatFrames:
    def __init__(self, request_id: str, model: str, *, chat: bool, include_usage: bool) -> None:
        self.request_id, self.model, self.chat, self.include_usage = request_id, model, chat, include_usage
        self.created = int(time.time())
        self.encoder = FrameEncoder(request_id, model, self.created, chat=chat)

    def chunk(self, chunk: StreamChunk) -> bytes:
        return self.encoder.encode(chunk)

    def end(self, result: GenerateResult) -> bytes:
        if not self.include_usage:
            return b"data: [DONE]\n\n"
        usage = usage_frame(result, self.request_id, self.model, self.created, chat=self.chat)
        return sse(usage) + b"data: [DONE]\n\n"

    def failure(self, err: Exception) -> bytes:
        return sse(error_body(err)[1])


async def stream_answer(
    gateway: Gateway,
    flight: Flight,
    send: Send,
    kwargs: dict[str, Any],
    frames: StreamFrames,
    shape: Shape = as_written,
) -> int:
    """A stream. The response starts with the first chunk, so an error before it (unknown
    model, context overflow...) gets its own status and a JSON body; one after it ends the
    stream with ``frames.failure``, never a silent EOF; a client that left is sent nothing
    more. Frames go out coalesced (:class:`FrameWriter`)."""
    writer = FrameWriter(lambda message: guarded_send(send, flight, message))
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        failed: Exception
        try:
            result = await _write_stream(gateway, flight, writer, kwargs, frames)
        except GenerationCancelledError as err:
            gateway.stop_recorded(flight, err)
            status, failed = 499, err
        except Exception as err:
            flight.error = err
            status, failed = error_body(err)[0], err
        else:
            writer.start()
            writer.finish(frames.end(result))
            return 200
        if isinstance(failed, GenerationCancelledError) and flight.client_gone:
            writer.abandon()
        elif writer.started:
            writer.finish(frames.failure(failed))
        else:
            writer.abandon()
            await guarded_send_json(send, flight, *shaped_error(failed, shape), error_headers(failed))
    return status


async def _write_stream(
    gateway: Gateway, flight: Flight, writer: FrameWriter, kwargs: dict[str, Any], frames: StreamFrames
) -> GenerateResult:
    """Run the stream into ``writer``, one chunk's bytes at a time; its result."""
    stream = flight.backend.llm.astream(**kwargs, signal=flight.controller.signal, request_id=flight.call_id)
    async with stream:
        async for chunk in stream:
            data = frames.chunk(chunk)
            if data:
                if flight.first_token_at is None:
                    flight.first_token_at = time.perf_counter()
                writer.start()
                writer.write(data)
                if writer.behind:
                    await writer.room()
    result: GenerateResult = stream.result()
    flight.answered(result.usage, gateway.metrics)
    return result


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

        async def run(flight: Flight, send: Send) -> int:
            async def produce() -> Any:
                result = await flight.backend.llm.aembed(
                    inputs,
                    dimensions=_integral(body.get("dimensions")),
                    signal=flight.controller.signal,
                    request_id=flight.call_id,
                )
                flight.usage = result.usage  # billed to its key; not a generation's prompt in /metrics
                data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(result.vectors)]
                n = result.usage.prompt_tokens if result.usage and result.usage.prompt_tokens else 0
                return {
                    "object": "list",
                    "data": data,
                    "model": model,
                    "usage": {"prompt_tokens": n, "total_tokens": n},
                }

            return await whole_answer(gateway, flight, send, produce)

        return GenerationResponse(
            gateway, backend, request_id_of(request), "embeddings", run, max_tokens=0, prompt={"input": inputs}
        )

    return handle


def _integral(value: Any) -> Any:
    """JSON Schema's integer takes 64.0 as 64 (the spec this gateway serves says integer)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
