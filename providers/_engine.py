"""What every in-process lane shares: the thread that owns the engine, the engine's own record
of each request (the evidence a stop is judged by), and the messages a worker sends back.

:class:`EngineThread`: every call that touches the engine — load, generate, close a generator,
unload — runs on it, one at a time (MLX streams are bound to their thread). ``on_exit`` runs on
the thread before it ends (MLX: ``mx.clear_streams()``, without which the process can abort at
exit); the thread is shut down at interpreter exit too.
"""

from __future__ import annotations

import abc
import atexit
import concurrent.futures
import logging
import math
import os
import queue
import threading
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio

from abstract_client.errors import (
    ContextOverflowError,
    ModelBusyError,
    ModelNotFoundError,
    NotSupportedError,
    ProviderAPIError,
)
from abstract_client.provider import CallContext, EmbeddingBatch, InProcessProvider, ModelInfo, UnloadReport
from abstract_client.stopping.loop import loop_caller
from abstract_client.stopping.token import StopToken
from abstract_client.types import GenerationRequest, StreamChunk, Usage

__all__ = ["END", "EngineModel", "EngineProvider", "EngineStop", "EngineThread", "Failure", "RequestStats"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_STOP = object()
END = object()  # a worker's last message for one request, after its last chunk


@dataclass
class RequestStats:
    """The engine side's own record of one request: the evidence a stop is judged by."""

    tokens: int = 0  # tokens sampled for this request (embeddings: inputs embedded)
    prompt_tokens: int | None = None  # the prompt's length, once tokenised
    cached_tokens: int | None = None  # of which a prompt cache served (lanes that have one)
    prefill_done: int = 0
    layers_done: int = 0  # vision lane: encoder layers of the vision tower evaluated
    prefill_total: int = 0
    tokens_at_stop: int | None = None  # the counter when the worker saw the stop flag
    stopped_in: str | None = None  # "queue", "vision", "prefill", "decode" or "embed"
    phase: str | None = None  # where a lane that reports it is now: "vision", "prefill", "decode"
    phase_started: dict[str, float] = field(default_factory=dict)  # phase -> perf_counter at its start
    stopped_at: float | None = None  # perf_counter when the worker saw the flag
    finished: bool = False
    text: list[str] = field(default_factory=list)  # the answer's text as emitted (content deltas)
    # after each counted token, in one assignment: (parts of ``text`` so far, text held back
    # by the stop-string matcher) — what a stop's partial text is, read from any thread
    snapshot: tuple[int, str] | None = None
    # The engine is done with the request (its last message sent): from here on this record
    # is final. A stopped caller is released before that; whoever wants the engine's final
    # word (the gateway's stop record) waits for it with ``when_settled``.
    settled: bool = False
    _on_settled: list[Callable[[], object]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def settle(self) -> None:
        """On the engine thread, once, after the request's last message."""
        with self._lock:
            self.settled = True
            callbacks, self._on_settled = self._on_settled, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a when_settled callback failed")

    def when_settled(self, callback: Callable[[], object]) -> None:
        """``callback()`` once the record is final: now if it is, else on the engine thread."""
        with self._lock:
            if not self.settled:
                self._on_settled.append(callback)
                return
        callback()

    def text_at_stop(self) -> str:
        """The text of every token the engine counted: what it emitted (a consumer may not have
        read it all) and what its stop-string matcher still held back, as of the last counted
        token (never a token sampled under the flag)."""
        n, held = self.snapshot or (len(self.text), "")
        return "".join(self.text[:n]) + held

    def usage_at_stop(self) -> Usage | None:
        """The engine's own count: its prompt, and the tokens it sampled and counted (a token is
        counted only after its stop flag was checked). None before the prompt was tokenised."""
        if self.prompt_tokens is None:
            return None
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.tokens, cached_tokens=self.cached_tokens)


@dataclass
class Failure:
    """An engine failure as a worker reports it: a fresh record, never the exception (its
    traceback would pin the model's memory across threads)."""

    kind: str
    message: str
    n_prompt_tokens: int | None = None  # set (with n_ctx) for a prompt that does not fit: a ContextOverflowError
    n_ctx: int | None = None


class EngineThread:
    """The one thread that owns an engine: every job on it runs one at a time, in order; ``wait_idle``
    is what an eject waits on."""

    def __init__(self, name: str, on_exit: Callable[[], object] | None = None) -> None:
        self.name = name
        self._on_exit = on_exit
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        ref = weakref.ref(self)

        def at_exit() -> None:
            thread = ref()
            if thread is not None:
                thread.shutdown()

        atexit.register(at_exit)

    @property
    def ident(self) -> int | None:
        return self._thread.ident if self._thread is not None else None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._pending == 0

    def wait_idle(self, timeout: float | None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
                self._thread.start()
            self._pending += 1
        self._jobs.put((fn, future))
        return future

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread; await it without blocking the event loop (asyncio
        or trio). A cancelled awaiter does not cancel the job: engine jobs stop via their flag."""
        future = self.submit(fn)
        done = anyio.Event()
        call = loop_caller()
        future.add_done_callback(lambda _: call(done.set))
        with anyio.CancelScope(shield=True):
            await done.wait()
        return future.result()

    def shutdown(self, timeout: float = 30.0) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        if threading.current_thread() is thread:
            return
        self._jobs.put(_STOP)
        thread.join(timeout)

    def _done_one(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def _main(self) -> None:
        try:
            while True:
                item = self._jobs.get()
                if item is _STOP:
                    return
                fn, future = item
                if not future.set_running_or_notify_cancel():
                    self._done_one()
                    continue
                try:
                    result = fn()
                except BaseException as exc:  # the job's error goes to its future, not the thread
                    del fn, item
                    self._done_one()  # idle before anyone awaiting the future wakes up
                    future.set_exception(exc)
                else:
                    del fn, item
                    self._done_one()
                    future.set_result(result)
                del future  # drop references (and tracebacks) before the next job
        finally:
            if self._on_exit is not None:
                try:
                    self._on_exit()
                except Exception:
                    log.exception("%s: exit hook failed", self.name)


class EngineStop(Exception):
    """Raised on the engine thread where a lane sees a request's stop flag (never leaves it)."""


class EngineModel(Protocol):
    """The loaded model as an engine provider sees it (``MLXModel``, ``HFModel``)."""

    @property
    def loaded(self) -> bool: ...

    def ensure_loaded(self) -> tuple[Any, Any]: ...

    def prompt_ids(self, request: GenerationRequest) -> list[int]: ...


class EngineProvider(InProcessProvider):
    """What every in-process lane's provider shares: the engine thread, the per-request evidence,
    the async side of a stream (the worker emits chunks from the engine thread; the consumer
    awaits them; a consumer that leaves early sets the flag and is released at once, the worker
    draining behind it on the engine thread), and eject (never free under a running job).

    A lane sets ``handle`` (its :class:`EngineModel`) and supplies ``_generate`` (one request, on
    the engine thread: emit chunks, raise nothing), ``_embed_on_thread`` and
    ``_unload_on_thread``; it may override ``_start`` (the MLX batch)."""

    handle: EngineModel
    kind: str

    model_is_file = False  # the model is one file (GGUF), not a directory

    def __init__(
        self, *, model: str | None, kind: str, weights: str, on_exit: Callable[[], object] | None = None
    ) -> None:
        """``model``: a local directory with ``config.json`` and ``weights`` (a glob), or, for a
        lane whose ``model_is_file``, one file matching ``weights``; ``kind`` names it in errors
        ("MLX", "Hugging Face", "GGUF")."""
        what = f"a {weights} file" if self.model_is_file else f"a local {kind} model directory"
        if model is None:
            raise ValueError(f"the {self.name} provider needs model=PATH ({what})")
        path = Path(model).expanduser().resolve()
        if self.model_is_file:
            found = path.is_file() and path.match(weights)
        else:
            found = (path / "config.json").is_file() and any(path.glob(weights))
            what += f" (config.json and {weights})"
        if not found:
            raise ModelNotFoundError(
                f"{path} is not {what}; abstract-client never downloads models from a hub",
                provider=self.name,
                model=str(model),
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # loaders treat an unknown path as a hub id
        super().__init__(model=str(path))
        self.path, self.kind = path, kind
        self.thread = EngineThread(f"abstract-client-{self.name}:{path.name}", on_exit=on_exit)
        self._stats: OrderedDict[str, RequestStats] = OrderedDict()
        self._stats_lock = threading.Lock()

    # -- evidence -----------------------------------------------------------------------------------

    def stats(self, request_id: str) -> RequestStats | None:
        with self._stats_lock:
            return self._stats.get(request_id)

    def engine_record(self, request_id: str) -> RequestStats | None:
        return self.stats(request_id)

    def _new_stats(self, request_id: str) -> RequestStats:
        with self._stats_lock:
            stats = self._stats[request_id] = RequestStats()
            while len(self._stats) > 256:
                self._stats.popitem(last=False)
            return stats

    # -- the lane's part ------------------------------------------------------------------------------

    @abc.abstractmethod
    def _generate(
        self, request: GenerationRequest, token: StopToken, stats: RequestStats, emit: Callable[[object], None]
    ) -> None:
        """One request on the engine thread: ``emit`` its chunks (or a :class:`Failure`)."""

    def _load_on_thread(self) -> None:
        """Load the weights (on the engine thread). Returns nothing: a returned model would live
        on in whatever awaited it, and an eject could not free it."""
        self.handle.ensure_loaded()

    @abc.abstractmethod
    def _embed_on_thread(
        self, texts: list[str], token: StopToken, stats: RequestStats
    ) -> tuple[list[list[float]], int]:
        """``(vectors, input tokens)`` on the engine thread; the stop checked between inputs."""

    @abc.abstractmethod
    def _unload_on_thread(self) -> UnloadReport:
        """Drop the weights (and every cache) on the engine thread, idle; report the memory."""

    def _start(
        self, request: GenerationRequest, token: StopToken, stats: RequestStats, emit: Callable[[object], None]
    ) -> concurrent.futures.Future[None] | None:
        """Start one request; the returned future (if any) is done once its job's bookkeeping is."""
        return self.thread.submit(lambda: self._job(request, token, stats, emit))

    def _job(
        self, request: GenerationRequest, token: StopToken, stats: RequestStats, emit: Callable[[object], None]
    ) -> None:
        try:
            self._generate(request, token, stats, emit)
        finally:
            emit(END)  # always the last message, whatever happened

    # -- the async side -------------------------------------------------------------------------------

    def stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        return self._stream(request, ctx)

    async def _stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        send, receive = anyio.create_memory_object_stream[object](math.inf)
        call = loop_caller()
        stats = self._new_stats(ctx.request_id)
        token = ctx.token

        text = stats.text

        def deliver(item: object) -> None:  # on the loop
            try:
                send.send_nowait(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the consumer has left: the engine is draining behind it

        def emit(item: object) -> None:
            if type(item) is StreamChunk and item.delta:
                text.append(item.delta)  # the engine's own record: a stop's partial text is all of it
            elif item is END:
                stats.settle()
            call(lambda: deliver(item))

        job_done = self._start(request, token, stats, emit)
        ended = False
        try:
            while True:
                item = await receive.receive()
                if item is END:
                    ended = True
                    return
                if isinstance(item, Failure):
                    if item.n_ctx is not None:
                        raise ContextOverflowError(
                            item.message,
                            n_prompt_tokens=item.n_prompt_tokens,
                            n_ctx=item.n_ctx,
                            provider=self.name,
                            model=self.model,
                        )
                    raise ProviderAPIError(
                        f"{self.name} engine failed: {item.kind}: {item.message}", provider=self.name
                    )
                assert isinstance(item, StreamChunk)
                yield item
        finally:
            receive.close()
            send.close()
            if not ended:
                # Leaving early (a stop, a cancelled task, a consumer that left): the worker sees
                # the flag at its next check (a token, a prefill chunk) and drains behind us. The
                # caller is not kept waiting for that: the engine thread's queue is what the next
                # call, an eject (``unload_model`` waits for idle) and ``aclose`` wait on.
                token.stop("user", internal=True)
            elif job_done is not None and not job_done.done():  # its bookkeeping, just behind END
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(job_done.result)

    async def images_refused(self, request: GenerationRequest) -> str | None:
        return f"the {self.name} lane's models take text only (no image parts)"

    # -- models ---------------------------------------------------------------------------------------

    async def list_models(self) -> list[ModelInfo]:
        return [ModelInfo(id=str(self.model), loaded=self.loaded)]

    @property
    def loaded(self) -> bool:
        return self.handle.loaded

    async def embed(
        self, texts: list[str], ctx: CallContext, *, model: str | None, dimensions: int | None = None
    ) -> EmbeddingBatch:
        if dimensions is not None:
            raise NotSupportedError(
                f"{self.kind} embeddings have the model's hidden size: dimensions= is not supported"
            )
        stats = self.stats(ctx.request_id) or self._new_stats(ctx.request_id)
        vectors, n_tokens = await self.thread.run(lambda: self._embed_on_thread(texts, ctx.token, stats))
        return EmbeddingBatch(vectors=vectors, usage=Usage(prompt_tokens=n_tokens), model=self.path.name)

    async def count_tokens(self, request: GenerationRequest) -> int:
        """The model's own tokenizer (chat template with the generation prompt for messages)."""
        return await self.thread.run(lambda: len(self.handle.prompt_ids(request)))

    async def load_model(self) -> None:
        await self.thread.run(self._load_on_thread)

    async def unload_model(self, *, drain_timeout: float = 30.0) -> UnloadReport:
        # A stream abandoned without aclose() may still be unwinding on the engine thread; its
        # flag is set, so it stops within a token or a prefill chunk. Never free memory under it.
        idle = await anyio.to_thread.run_sync(self.thread.wait_idle, drain_timeout)
        if not idle:
            raise ModelBusyError(
                f"a decode was still running after {drain_timeout}s; nothing was freed",
                provider=self.name,
                model=self.model,
            )
        return await self.thread.run(self._unload_on_thread)

    async def wait_ready(self, timeout: float) -> None:
        await self.load_model()

    async def aclose(self) -> None:
        if self.thread.alive:
            await self.unload_model(drain_timeout=30.0)
        await anyio.to_thread.run_sync(self.thread.shutdown)
