"""The ``LLM`` facade: the same application code for every backend, sync and async twins.

Every generation method builds one :class:`~abstract_client.contract.Call` and hands it to the
contract; nothing here talks to a backend directly.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import anyio

from ._portal import Portal, portal
from .contract import Call, GenerationStream, run_generation, stopped_error
from .errors import AbstractClientError, ModelBusyError, StopReason
from .http.retry import RetryPolicy
from .provider import ModelInfo, Provider, UnloadReport
from .stop import InflightRegistry, StopToken
from .sync_stream import SyncGenerationStream
from .types import GenerateResult, GenerationRequest, Message, Timeout

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
        self._ejecting = threading.Event()
        self._closed = False
        self._portal: Portal = portal()

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
        stream: bool,
        extra: dict[str, Any],
    ) -> Call:
        if self._closed:
            raise AbstractClientError("this LLM is closed", provider=self.provider.name)
        if prompt is None and not messages:
            raise ValueError("pass a prompt or messages")
        msgs: list[Message] = []
        if system is not None:
            msgs.append({"role": "system", "content": system})
        msgs.extend(messages or [])
        if prompt is not None:
            msgs.append({"role": "user", "content": prompt})
        raw = bool(extra.pop("raw", False))
        request = GenerationRequest(
            messages=msgs,
            model=extra.pop("model", None) or self.provider.model,
            prompt=prompt,
            raw=raw,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=[stop] if isinstance(stop, str) else (list(stop) if stop else None),
            extra=extra,
        )
        token = StopToken(request_id or uuid.uuid4().hex)
        token.bind(cancel_event=cancel_event, signal=signal)  # TypeError now, never ignored
        return Call(
            provider=self.provider,
            request=request,
            token=token,
            registry=self._inflight,
            timeout=Timeout.coerce(timeout, self.timeout),
            retry=self.retry,
            # Streams are always stoppable (break is a stop), so they always get a severable
            # private connection; so do calls that carry a stop source of their own.
            private=stream or token.has_external_source,
            gate=self._ejecting,
        )

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
            stream=False,
            extra=extra,
        )
        return self._portal.run(
            lambda: run_generation(call),
            on_interrupt=call.token.stop,
            stop=call.token,
            stopped_error=lambda: stopped_error(call),
        )

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
            stream=False,
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
            stream=True,
            extra=extra,
        )
        return SyncGenerationStream(GenerationStream(call), self._portal)

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
            stream=True,
            extra=extra,
        )
        return GenerationStream(call)

    # -- stopping -----------------------------------------------------------------------------

    def cancel(self, request_id: str, reason: StopReason = "user") -> bool:
        """Stop one call in flight (from any thread). False if no such call is in flight."""
        return self._inflight.cancel(request_id, reason)

    def cancel_all(self, reason: StopReason = "user") -> int:
        """Stop every call in flight (from any thread); returns how many were stopped."""
        return self._inflight.cancel_all(reason)

    # -- models ---------------------------------------------------------------------------------

    def list_models(self) -> list[ModelInfo]:
        return self._portal.run(self.alist_models)

    async def alist_models(self) -> list[ModelInfo]:
        return await self.provider.list_models()

    def load_model(self) -> None:
        self._portal.run(self.aload_model)

    async def aload_model(self) -> None:
        await self.provider.load_model()

    def unload_model(self, drain_timeout: float = 30.0) -> UnloadReport:
        return self._portal.run(lambda: self.aunload_model(drain_timeout))

    async def aunload_model(self, drain_timeout: float = 30.0) -> UnloadReport:
        """Eject: refuse new calls meanwhile, stop ours in flight (reason ``model_eject``), wait
        for them to drain, then the lane's own unload. The LLM stays usable afterwards."""
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
            report = await self.provider.unload_model(drain_timeout=remaining)
            report.stopped_requests = stopped
            log.info("%s: unloaded %s (%d call(s) stopped)", self.provider.name, self.provider.model, stopped)
            return report
        finally:
            self._ejecting.clear()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the backend answers its readiness probe (or raise on ``timeout``)."""
        self._portal.run(lambda: self.await_ready(timeout))

    async def await_ready(self, timeout: float = 60.0) -> None:
        with anyio.fail_after(timeout + 5):
            await self.provider.wait_ready(timeout)

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._inflight.cancel_all("shutdown")
        self._inflight.wait_empty(5.0)
        self._portal.run(self.provider.aclose)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._inflight.cancel_all("shutdown")
        await self._inflight.wait_empty_async(5.0)
        await self.provider.aclose()
        # Clients made by sync calls live on the portal loop; close them there.
        if self._portal.thread is not None and self._portal.thread.is_alive():
            await anyio.to_thread.run_sync(lambda: self._portal.run(self.provider.aclose))

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> LLM:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
