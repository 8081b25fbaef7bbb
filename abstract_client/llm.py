"""The ``LLM`` facade: the same application code for every backend, sync and async twins.

Every generation method builds one :class:`~abstract_client.contract.Call` and hands it to the
contract; model management runs through the contract's ``run_operation``. Nothing here talks to
a backend directly. The LLM owns its sync runtime (the loop thread the sync API runs on) and
shuts it down in ``close()``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from ._sync import Portal, SyncGenerationStream
from .contract import (
    Call,
    CallSpec,
    GenerationStream,
    operation_spec,
    run_embedding,
    run_generation,
    run_operation,
)
from .contract.retry import RetryPolicy
from .errors import AbstractClientError, ModelBusyError, StopReason
from .output.structured import normalize_tool_choice, normalize_tools, response_format_from
from .provider import ModelInfo, Provider, UnloadReport
from .stopping.abort import AbortSignal
from .stopping.token import InflightRegistry, StopToken
from .types import EmbeddingResult, GenerateResult, GenerationRequest, Message, Timeout

__all__ = ["LLM"]

T = TypeVar("T")
_REASONING = (None, False, True, "low", "medium", "high")

log = logging.getLogger(__name__)


class LLM:
    """A model behind one backend. Create it with :func:`abstract_client.create_llm`."""

    def __init__(self, provider: Provider, *, timeout: Timeout | float | None = None, max_retries: int = 2) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.provider = provider
        self.timeout = Timeout.coerce(timeout)
        self.retry = RetryPolicy(max_retries=max_retries)
        self._inflight = InflightRegistry()
        self._operations = InflightRegistry()  # model management calls (stopped by close())
        self._ejecting = threading.Event()
        self._closed = False
        self._portal = Portal()
        # An LLM dropped without close() still ends its loop thread (the portal holds no
        # reference back to the LLM, so this does not keep it alive).
        self._finalizer = weakref.finalize(self, self._portal.shutdown)

    def __repr__(self) -> str:
        return f"<LLM provider={self.provider.name!r} model={self.provider.model!r}>"

    @property
    def provider_name(self) -> str:
        return self.provider.name

    @property
    def model(self) -> str | None:
        return self.provider.model

    @property
    def in_flight(self) -> list[str]:
        """Request ids of the calls in flight."""
        return self._inflight.ids()

    # -- building a call --------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._closed:
            raise AbstractClientError("this LLM is closed", provider=self.provider.name)

    def _new_call(self, spec: CallSpec, request_id: str | None) -> Call:
        """A call of this LLM: its own stop token, registered in flight at admission, waiting for
        an eject in progress."""
        return Call(spec, StopToken(request_id or uuid.uuid4().hex), self._inflight, gate=self._ejecting)

    def _call(
        self,
        prompt: str | None,
        *,
        messages: list[Message] | None,
        system: str | None,
        max_tokens: int | None,
        temperature: float | None,
        seed: int | None,
        stop: str | list[str] | None,
        cancel_event: object,
        signal: object,
        timeout: Timeout | float | None,
        request_id: str | None,
        features: tuple[Any, Any, Any, Any],
        extra: dict[str, Any],
    ) -> Call:
        self._ensure_open()
        if prompt is None and not messages:
            raise ValueError("pass a prompt or messages")
        msgs: list[Message] = []
        if system is not None:
            msgs.append({"role": "system", "content": system})
        msgs.extend(messages or [])
        if prompt is not None:
            msgs.append({"role": "user", "content": prompt})
        raw = bool(extra.pop("raw", False))
        plain_wire = bool(extra.pop("plain_wire", False))
        tools, tool_choice, response_format, reasoning = features
        normalized_tools = normalize_tools(tools)
        if reasoning not in _REASONING:
            raise ValueError(f"reasoning must be one of {_REASONING}, not {reasoning!r}")
        request = GenerationRequest(
            messages=msgs,
            model=extra.pop("model", None) or self.provider.model,
            prompt=prompt,
            raw=raw,
            plain_wire=plain_wire,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=[stop] if isinstance(stop, str) else (list(stop) if stop else None),
            tools=normalized_tools,
            tool_choice=normalize_tool_choice(tool_choice, normalized_tools),
            response_format=response_format_from(response_format),
            reasoning=reasoning,
            extra=extra,
        )
        StopToken.check_sources(cancel_event, signal)  # a TypeError now, never ignored
        spec = CallSpec(
            provider=self.provider,
            request=request,
            timeout=Timeout.coerce(timeout, self.timeout),
            retry=self.retry,
            cancel_event=cancel_event,  # type: ignore[arg-type]
            signal=signal,  # type: ignore[arg-type]
        )
        # Every generation runs on a severable private connection: whether it is stopped by its
        # own source, cancel(id), cancel_all() or an eject, the server hears it the same way.
        return self._new_call(spec, request_id)

    # -- generation ---------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | None = None,
        *,
        messages: list[Message] | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        cancel_event: threading.Event | None = None,
        signal: Any = None,
        timeout: Timeout | float | None = None,
        request_id: str | None = None,
        tools: list[Any] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: Any = None,
        reasoning: bool | str | None = None,
        **extra: Any,
    ) -> GenerateResult:
        call = self._call(
            prompt,
            messages=messages,
            system=system,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=stop,
            cancel_event=cancel_event,
            signal=signal,
            timeout=timeout,
            request_id=request_id,
            features=(tools, tool_choice, response_format, reasoning),
            extra=extra,
        )
        return self._portal.run(lambda: run_generation(call), call=call)

    async def agenerate(
        self,
        prompt: str | None = None,
        *,
        messages: list[Message] | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        cancel_event: threading.Event | None = None,
        signal: Any = None,
        timeout: Timeout | float | None = None,
        request_id: str | None = None,
        tools: list[Any] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: Any = None,
        reasoning: bool | str | None = None,
        **extra: Any,
    ) -> GenerateResult:
        call = self._call(
            prompt,
            messages=messages,
            system=system,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=stop,
            cancel_event=cancel_event,
            signal=signal,
            timeout=timeout,
            request_id=request_id,
            features=(tools, tool_choice, response_format, reasoning),
            extra=extra,
        )
        return await run_generation(call)

    def stream(
        self,
        prompt: str | None = None,
        *,
        messages: list[Message] | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        cancel_event: threading.Event | None = None,
        signal: Any = None,
        timeout: Timeout | float | None = None,
        request_id: str | None = None,
        tools: list[Any] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: Any = None,
        reasoning: bool | str | None = None,
        **extra: Any,
    ) -> SyncGenerationStream:
        call = self._call(
            prompt,
            messages=messages,
            system=system,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=stop,
            cancel_event=cancel_event,
            signal=signal,
            timeout=timeout,
            request_id=request_id,
            features=(tools, tool_choice, response_format, reasoning),
            extra=extra,
        )
        return SyncGenerationStream(GenerationStream(call), self._portal, owner=self)

    def astream(
        self,
        prompt: str | None = None,
        *,
        messages: list[Message] | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        cancel_event: threading.Event | None = None,
        signal: Any = None,
        timeout: Timeout | float | None = None,
        request_id: str | None = None,
        tools: list[Any] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: Any = None,
        reasoning: bool | str | None = None,
        **extra: Any,
    ) -> GenerationStream:
        call = self._call(
            prompt,
            messages=messages,
            system=system,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=stop,
            cancel_event=cancel_event,
            signal=signal,
            timeout=timeout,
            request_id=request_id,
            features=(tools, tool_choice, response_format, reasoning),
            extra=extra,
        )
        return GenerationStream(call)

    # -- embeddings and tokens ------------------------------------------------------------------

    def _embed_call(
        self,
        texts: str | list[str],
        batch_size: int | None,
        cancel_event: threading.Event | None,
        signal: Any,
        timeout: float | None,
        request_id: str | None,
        model: str | None,
    ) -> tuple[Call, list[str], int]:
        self._ensure_open()
        inputs = [texts] if isinstance(texts, str) else list(texts)
        if not all(isinstance(t, str) for t in inputs):
            raise TypeError("embed() takes a string or a list of strings")
        size = self.provider.default_embed_batch_size if batch_size is None else batch_size
        if size < 1:
            raise ValueError("batch_size must be >= 1")
        StopToken.check_sources(cancel_event, signal)
        spec = CallSpec(
            provider=self.provider,
            request=GenerationRequest(messages=[], model=model or self.provider.model),
            # the whole embed (every batch) is bounded by ``timeout``; first-token/idle do not apply
            timeout=Timeout(connect=self.timeout.connect, total=timeout if timeout is not None else self.timeout.total),
            retry=self.retry,
            cancel_event=cancel_event,
            signal=signal,
        )
        return self._new_call(spec, request_id), inputs, size

    def embed(
        self,
        texts: str | list[str],
        *,
        batch_size: int | None = None,
        dimensions: int | None = None,
        cancel_event: threading.Event | None = None,
        signal: Any = None,
        timeout: float | None = None,
        request_id: str | None = None,
        model: str | None = None,
    ) -> EmbeddingResult:
        """Embed ``texts`` in batches of ``batch_size`` (the lane's default when None). A stop
        between batches raises ``GenerationCancelledError`` with ``partial_embeddings``."""
        call, inputs, size = self._embed_call(texts, batch_size, cancel_event, signal, timeout, request_id, model)
        return self._portal.run(lambda: run_embedding(call, inputs, batch_size=size, dimensions=dimensions), call=call)

    async def aembed(
        self,
        texts: str | list[str],
        *,
        batch_size: int | None = None,
        dimensions: int | None = None,
        cancel_event: threading.Event | None = None,
        signal: Any = None,
        timeout: float | None = None,
        request_id: str | None = None,
        model: str | None = None,
    ) -> EmbeddingResult:
        call, inputs, size = self._embed_call(texts, batch_size, cancel_event, signal, timeout, request_id, model)
        return await run_embedding(call, inputs, batch_size=size, dimensions=dimensions)

    def count_tokens(
        self, prompt: str | None = None, *, messages: list[Message] | None = None, timeout: float | None = 30.0
    ) -> int:
        """Tokens of ``prompt`` as given, or of ``messages`` with the chat template applied.
        ``NotSupportedError`` on lanes without a tokenize route (Ollama, LM Studio)."""
        return self._run_operation(
            lambda rid: self.acount_tokens(prompt, messages=messages, timeout=timeout, request_id=rid)
        )

    async def acount_tokens(
        self,
        prompt: str | None = None,
        *,
        messages: list[Message] | None = None,
        timeout: float | None = 30.0,
        request_id: str | None = None,
    ) -> int:
        if (prompt is None) == (messages is None):
            raise ValueError("pass a prompt or messages (one of them)")
        request = GenerationRequest(
            messages=list(messages or []), model=self.provider.model, prompt=prompt, raw=prompt is not None
        )
        return await self._operation(lambda: self.provider.count_tokens(request), timeout, request_id=request_id)

    # -- stopping -----------------------------------------------------------------------------

    def cancel(self, request_id: str, reason: StopReason = "user") -> bool:
        """Stop one call in flight (from any thread). False if no such call is in flight.
        The provider's ``on_cancel`` is told as well (the "remote" lane calls the gateway's cancel
        endpoint)."""
        stopped = self._inflight.cancel(request_id, reason)
        if stopped:
            self.provider.on_cancel(request_id)
        return stopped

    def cancel_all(self, reason: StopReason = "user") -> int:
        """Stop every call in flight (from any thread); returns how many were stopped."""
        return self._inflight.cancel_all(reason)

    # -- models ---------------------------------------------------------------------------------
    # Each runs through the contract (``run_operation``): stoppable by ``cancel_event``/``signal``
    # and by close(), bounded by ``timeout``, raising only this library's errors.

    async def _operation(
        self,
        fn: Callable[[], Awaitable[T]],
        timeout: float | None,
        cancel_event: threading.Event | None = None,
        signal: AbortSignal | None = None,
        request_id: str | None = None,
    ) -> T:
        self._ensure_open()
        spec = operation_spec(self.provider, timeout, cancel_event=cancel_event, signal=signal)
        return await run_operation(spec, fn, registry=self._operations, request_id=request_id or uuid.uuid4().hex)

    def _run_operation(self, make: Callable[[str], Awaitable[T]]) -> T:
        request_id = uuid.uuid4().hex

        async def run() -> T:
            return await make(request_id)

        return self._portal.run(run, on_interrupt=lambda: self._operations.cancel(request_id))

    def list_models(
        self, *, timeout: float | None = 30.0, cancel_event: threading.Event | None = None, signal: Any = None
    ) -> list[ModelInfo]:
        return self._run_operation(
            lambda rid: self.alist_models(timeout=timeout, cancel_event=cancel_event, signal=signal, request_id=rid)
        )

    async def alist_models(
        self,
        *,
        timeout: float | None = 30.0,
        cancel_event: threading.Event | None = None,
        signal: Any = None,
        request_id: str | None = None,
    ) -> list[ModelInfo]:
        return await self._operation(self.provider.list_models, timeout, cancel_event, signal, request_id)

    def load_model(
        self, *, timeout: float | None = 600.0, cancel_event: threading.Event | None = None, signal: Any = None
    ) -> None:
        self._run_operation(
            lambda rid: self.aload_model(timeout=timeout, cancel_event=cancel_event, signal=signal, request_id=rid)
        )

    async def aload_model(
        self,
        *,
        timeout: float | None = 600.0,
        cancel_event: threading.Event | None = None,
        signal: Any = None,
        request_id: str | None = None,
    ) -> None:
        await self._operation(self.provider.load_model, timeout, cancel_event, signal, request_id)

    def unload_model(self, drain_timeout: float = 30.0, *, timeout: float | None = 120.0) -> UnloadReport:
        return self._run_operation(lambda rid: self.aunload_model(drain_timeout, timeout=timeout, request_id=rid))

    async def aunload_model(
        self, drain_timeout: float = 30.0, *, timeout: float | None = 120.0, request_id: str | None = None
    ) -> UnloadReport:
        """Eject: refuse new calls meanwhile, stop ours in flight (reason ``model_eject``), wait
        for them to drain, then the lane's own unload (bounded by ``timeout``). The LLM stays
        usable afterwards."""
        self._ejecting.set()
        try:
            started = time.monotonic()
            stopped = self._inflight.cancel_all("model_eject")
            if not await self._inflight.wait_empty_async(drain_timeout):
                raise ModelBusyError(
                    f"{len(self._inflight)} call(s) still running after {drain_timeout}s; nothing was unloaded",
                    provider=self.provider.name,
                    model=self.provider.model,
                )
            remaining = max(0.0, drain_timeout - (time.monotonic() - started))
            report = await self._operation(
                lambda: self.provider.unload_model(drain_timeout=remaining), timeout, request_id=request_id
            )
            report.stopped_requests = stopped
            log.info("%s: unloaded %s (%d call(s) stopped)", self.provider.name, self.provider.model, stopped)
            return report
        finally:
            self._ejecting.clear()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the backend answers its readiness probe (or raise on ``timeout``)."""
        self._run_operation(lambda rid: self.await_ready(timeout, request_id=rid))

    async def await_ready(self, timeout: float = 60.0, *, request_id: str | None = None) -> None:
        # The probe has its own deadline (a typed ServerUnavailableError); ours is the backstop.
        await self._operation(lambda: self.provider.wait_ready(timeout), timeout + 5, request_id=request_id)

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every call in flight (reason ``shutdown``), close the connections, and end the
        sync loop thread."""
        if self._closed:
            return
        self._closed = True
        self._stop_everything()
        self._inflight.wait_empty(5.0)
        try:
            self._portal.run(self.provider.aclose)
        finally:
            self._finalizer()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_everything()
        await self._inflight.wait_empty_async(5.0)
        try:
            await self.provider.aclose()
            # Clients made by sync calls live on the sync loop; close them there, then end it.
            if self._portal.running:
                await anyio.to_thread.run_sync(lambda: self._portal.run(self.provider.aclose))
        finally:
            self._finalizer()

    def _stop_everything(self) -> None:
        self._inflight.cancel_all("shutdown")
        self._operations.cancel_all("shutdown")

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> LLM:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
