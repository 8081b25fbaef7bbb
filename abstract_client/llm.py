"""The ``LLM`` facade: the same application code for every backend, sync and async twins.

Every generation method builds one :class:`~abstract_client.contract.Call` and hands it to the
contract; model management runs through the contract's ``run_operation``. Nothing here talks to
a backend directly. The LLM owns its sync runtime (the loop thread the sync API runs on) and
shuts it down in ``close()``.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict, TypeVar, Unpack, cast, get_type_hints

import anyio

from ._sync import Portal, SyncGenerationStream
from ._validate import (
    check_dimensions,
    check_generation,
    check_messages,
    check_request_id,
    check_text,
    check_wire_json,
)
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
from .errors import AbstractClientError, ModelBusyError, NotSupportedError, StopReason
from .images import ImageLimits, resolve_images
from .output.structured import normalize_tool_choice, normalize_tools, response_format_from
from .provider import ModelInfo, Provider, UnloadReport
from .stopping.abort import AbortSignal
from .stopping.token import InflightRegistry, StopToken
from .types import EmbeddingResult, GenerateResult, GenerationRequest, Message, Timeout

__all__ = ["LLM", "GenerateOptions"]

T = TypeVar("T")
_REASONING = (None, False, True, "low", "medium", "high")

log = logging.getLogger(__name__)


class GenerateOptions(TypedDict, total=False):
    """The options of :meth:`LLM.generate`, :meth:`~LLM.agenerate`, :meth:`~LLM.stream` and
    :meth:`~LLM.astream`, written once. All are keyword-only and optional.

    Attributes:
        messages: the conversation (OpenAI-style dicts: ``role``, ``content`` — a string or
            content parts —, ``tool_calls``, ``tool_call_id``); the prompt, if any, comes last.
        system: a system message put first.
        max_tokens: the most tokens to generate (the lane's default when None).
        temperature: sampling temperature (0 or None: greedy where the lane allows).
        seed: a sampling seed, where the lane honours one.
        stop: stop sequences (text that ends the answer; not a cancellation).
        cancel_event: a ``threading.Event``: setting it stops the call, from any thread.
        signal: an :class:`AbortSignal` (``AbortController().signal``, ``AbortSignal.timeout``).
        timeout: seconds for the whole call, or a :class:`Timeout` (connect, first token, idle,
            total); the LLM's default when None.
        request_id: the call's id, for ``llm.cancel(request_id)`` and the server's logs
            (unique among the calls in flight; a fresh one when None).
        tools: tool specs (OpenAI function specs, ``{"name", "parameters"}`` dicts) or typed
            Python functions (see :func:`function_tool`).
        tool_choice: ``"auto"``, ``"none"``, ``"required"`` or a named function.
        response_format: a JSON schema dict, OpenAI's ``json_schema``/``json_object`` forms, or
            a pydantic model class; the answer is parsed into ``GenerateResult.parsed``.
        reasoning: the model's thinking switch or level (``True``/``False``, ``"low"``,
            ``"medium"``, ``"high"``), where the lane has one.
        raw: send ``prompt`` as plain text, without the chat template.
        plain_route: for a non-streaming call, use the server's plain route instead of the
            streaming wire (the server then notices a stop only at its next connection poll).
        model: another model than the LLM's, for this call.
        top_p, top_k, min_p, logit_bias, repetition_penalty, presence_penalty,
            frequency_penalty, ignore_eos, min_tokens: sampling fields every lane that has them
            honours (sent as they are; ``logit_bias`` maps token ids to biases).
        extra_body: fields merged into the request's JSON body as they are (as openai-python's
            ``extra_body``): what a server takes that no option here names.
        extra: the same as ``extra_body`` (its older name).

    Any other keyword is a ``TypeError`` naming it, before anything is sent — unless the lane
    declares it (``llm.provider.call_options``: LM Studio's ``native``, Ollama's ``options``,
    vLLM's ``json_schema``, a fleet's ``session``, an in-process lane's ``prefill_step_size``).
        resumable: the answer outlives a dropped connection: the library reads on from where
            it was, and the caller sees one stream (lanes with ``resumable_streams``: llamacpp,
            vllm, and any lane with ``wire="responses"`` (a background response); others raise
            ``NotSupportedError``). A stop then also calls the server's own cancel.
        resume_timeout: seconds from a drop to the resumed stream (30), then ``TransportError``
            with the partial text.
    """

    messages: list[Message] | None
    system: str | None
    max_tokens: int | None
    temperature: float | None
    seed: int | None
    stop: str | list[str] | None
    cancel_event: threading.Event | None
    signal: AbortSignal | None
    timeout: Timeout | float | None
    request_id: str | None
    tools: list[Any] | None
    tool_choice: str | dict[str, Any] | None
    response_format: Any
    reasoning: bool | str | None
    raw: bool
    resumable: bool
    resume_timeout: float
    plain_route: bool
    model: str | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    logit_bias: dict[int | str, float] | None
    repetition_penalty: float | None
    presence_penalty: float | None
    frequency_penalty: float | None
    ignore_eos: bool | None
    min_tokens: int | None
    extra_body: dict[str, Any] | None
    extra: dict[str, Any] | None


OPTION_NAMES = frozenset(GenerateOptions.__annotations__)
# what a keyword-only option defaults to in the methods' signatures (None when not listed)
_DEFAULTS: dict[str, Any] = {"raw": False, "resumable": False, "resume_timeout": 30.0, "plain_route": False}


_RENAMED = {"plain_wire": "plain_route"}  # an option's old name: its error names the new one


def _unknown_keywords(method: str, given: Any, provider: Provider) -> TypeError | None:
    """The ``TypeError`` for keywords neither :class:`GenerateOptions` nor the lane names (a
    typo such as ``max_token=3`` was sent to the server, and ``max_tokens`` never applied)."""
    unknown = sorted(set(given) - OPTION_NAMES - set(provider.call_options))
    if not unknown:
        return None
    name = unknown[0]
    known = sorted(OPTION_NAMES | set(provider.call_options))
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if name in _RENAMED:
        hint = f" (it is {_RENAMED[name]}= now)"
    lane = (
        f"the {provider.name} lane also takes {', '.join(f'{k}=' for k in sorted(provider.call_options))}"
        if provider.call_options
        else f"the {provider.name} lane takes no options of its own"
    )
    return TypeError(
        f"{method}() got an unexpected keyword argument {name!r}{hint}; {lane}; a field for the server's "
        f"request body goes in extra_body={{{name!r}: ...}}"
    )


def with_option_signature(fn: Callable[..., T]) -> Callable[..., T]:
    """Give ``fn`` (``prompt, **options: Unpack[GenerateOptions]``) a signature listing every
    option as a keyword-only parameter, built from :class:`GenerateOptions` — the one definition
    the four generation methods share — so ``help()``, ``inspect.signature`` and IDEs show them.
    The lane's own options stay behind ``**lane_options``."""
    sig = inspect.signature(fn)
    hints = get_type_hints(GenerateOptions)
    head = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    options = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=_DEFAULTS.get(name), annotation=hints[name])
        for name in GenerateOptions.__annotations__
    ]
    lane = inspect.Parameter("lane_options", inspect.Parameter.VAR_KEYWORD, annotation=Any)
    fn.__signature__ = sig.replace(parameters=[*head, *options, lane])  # type: ignore[attr-defined]
    return fn


def _body_fields(options: dict[str, Any], name: str) -> dict[str, Any]:
    """``extra_body=`` (or ``extra=``): fields merged into the request body, never a field of
    that name (``extra_body={"f": 1}`` was sent as ``{"extra_body": {"f": 1}}``)."""
    fields = options.pop(name, None)
    if fields is None:
        return {}
    if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
        raise TypeError(f"{name}= takes a dict of body fields, not {type(fields).__name__}")
    return fields


class LLM:
    """A model behind one backend. Create it with :func:`abstract_client.create_llm`."""

    def __init__(
        self,
        provider: Provider,
        *,
        timeout: Timeout | float | None = None,
        max_retries: int = 2,
        image_limits: ImageLimits | None = None,
    ) -> None:
        if not isinstance(max_retries, int) or isinstance(max_retries, bool):
            raise TypeError(f"max_retries must be an int, not {type(max_retries).__name__}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.provider = provider
        self.image_limits = image_limits or ImageLimits()  # checked on every call's images
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
        """The lane's registered name (``"llamacpp"``, ``"mlx"``, ...)."""
        return self.provider.name

    @property
    def model(self) -> str | None:
        """The model this LLM asks for (a path for in-process lanes)."""
        return self.provider.model

    @property
    def in_flight(self) -> list[str]:
        """Request ids of the calls in flight: admitted, and their outcome not yet handed to the
        caller. A call leaves the list the moment it returns or raises — a stop raised at once
        to a sync caller included, while the loop still closes its connection (or an in-process
        engine drains) behind it."""
        return self._inflight.ids()

    # -- building a call --------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._closed:
            raise AbstractClientError("this LLM is closed", provider=self.provider.name)

    def _new_call(self, spec: CallSpec, request_id: str | None, *, kind: str, sync: bool) -> Call:
        """A call of this LLM: its own stop token, registered in flight at admission, waiting for
        an eject in progress; ``sync``: a caller's thread waits on it (it builds the stop's error)."""
        if request_id is not None:
            check_request_id(request_id)
        token = StopToken(request_id or uuid.uuid4().hex)
        return Call(spec, token, self._inflight, gate=self._ejecting, kind=kind, sync=sync)

    def check_call(self, prompt: str | None = None, **options: Any) -> None:
        """Check a generation's arguments exactly as :meth:`generate` does — the same
        ``TypeError`` or ``ValueError`` — and send nothing. For a caller that must refuse a
        request before it answers (the gateway's background responses answer 200 before they
        run)."""
        self._call(prompt, cast(GenerateOptions, options), "generate")

    def _call(self, prompt: str | None, options: GenerateOptions, method: str) -> Call:
        """The one constructor of a generation call, shared by the four generation methods:
        every option is checked here, before anything is held or sent."""
        self._ensure_open()
        unknown = _unknown_keywords(method, options, self.provider)
        if unknown is not None:
            raise unknown
        extra: dict[str, Any] = dict(options)
        messages: list[Message] | None = extra.pop("messages", None)
        system: str | None = extra.pop("system", None)
        if prompt is None and not messages:
            raise ValueError("pass a prompt or messages")
        for text, what in ((prompt, "prompt"), (system, "system")):
            if text is not None:
                if not isinstance(text, str):
                    raise TypeError(f"{what} must be a string, not {type(text).__name__}")
                check_text(text, what)
        if messages is not None:
            check_messages(messages)
            messages = resolve_images(messages, self.image_limits)  # files read, limits checked
        check_generation(extra)
        msgs: list[Message] = []
        if system is not None:
            msgs.append({"role": "system", "content": system})
        msgs.extend(messages or [])
        if prompt is not None:
            msgs.append({"role": "user", "content": prompt})
        cancel_event = extra.pop("cancel_event", None)
        signal = extra.pop("signal", None)
        timeout = extra.pop("timeout", None)
        request_id = extra.pop("request_id", None)
        stop = extra.pop("stop", None)
        reasoning = extra.pop("reasoning", None)
        normalized_tools = normalize_tools(extra.pop("tools", None))
        if reasoning not in _REASONING:
            raise ValueError(f"reasoning must be one of {_REASONING}, not {reasoning!r}")
        tool_choice = extra.pop("tool_choice", None)
        response_format = extra.pop("response_format", None)
        resumable, resume_timeout = self._resumable(extra)
        request = GenerationRequest(
            messages=msgs,
            model=extra.pop("model", None) or self.provider.model,
            prompt=prompt,
            raw=bool(extra.pop("raw", False)),
            plain_route=bool(extra.pop("plain_route", False)),
            max_tokens=extra.pop("max_tokens", None),
            temperature=extra.pop("temperature", None),
            seed=extra.pop("seed", None),
            stop=[stop] if isinstance(stop, str) else (list(stop) if stop else None),
            tools=normalized_tools,
            tool_choice=normalize_tool_choice(tool_choice, normalized_tools),
            response_format=response_format_from(response_format),
            reasoning=reasoning,
            extra={**_body_fields(extra, "extra"), **_body_fields(extra, "extra_body"), **extra},  # sent as they are
            resumable=resumable,
            resume_timeout=resume_timeout,
        )
        check_wire_json({"messages": request.messages, "tools": request.tools, "extra": request.extra})
        StopToken.check_sources(cancel_event, signal)  # a TypeError now, never ignored
        spec = CallSpec(
            provider=self.provider,
            request=request,
            timeout=Timeout.coerce(timeout, self.timeout),
            retry=self.retry,
            cancel_event=cancel_event,
            signal=signal,
        )
        # Every generation runs on a severable private connection: whether it is stopped by its
        # own source, cancel(id), cancel_all() or an eject, the server hears it the same way.
        kind = "text_completion" if spec.request.raw else "chat"
        return self._new_call(spec, request_id, kind=kind, sync=method in ("generate", "stream"))

    def _resumable(self, extra: dict[str, Any]) -> tuple[bool, float]:
        """``resumable`` / ``resume_timeout``, checked: a lane that cannot resume says so before
        anything is sent (a dropped stream would otherwise be silently unrecoverable)."""
        resumable = extra.pop("resumable", False)
        resume_timeout = extra.pop("resume_timeout", 30.0)
        if not isinstance(resumable, bool):
            raise TypeError(f"resumable must be true or false, not {type(resumable).__name__}")
        if isinstance(resume_timeout, bool) or not isinstance(resume_timeout, (int, float)) or not resume_timeout > 0:
            raise ValueError(f"resume_timeout must be a number of seconds > 0, not {resume_timeout!r}")
        refused = self.provider.resumable_refused() if resumable else None
        if refused is not None:
            raise NotSupportedError(refused, provider=self.provider.name)
        if resumable and extra.get("plain_route"):
            raise ValueError("a resumable call is a stream: plain_route=True cannot be resumed")
        return resumable, float(resume_timeout)

    # -- generation ---------------------------------------------------------------------------

    @with_option_signature
    def generate(self, prompt: str | None = None, **options: Unpack[GenerateOptions]) -> GenerateResult:
        """Generate a whole answer, blocking this thread (the call runs on the LLM's loop thread).

        Args:
            prompt: the user's message (sent as one user message; with ``raw=True``, the text
                itself). Pass ``prompt`` or ``messages=`` (or both: the prompt comes last).
            **options: see :class:`GenerateOptions` — messages, sampling, ``cancel_event`` /
                ``signal`` (the stop), ``timeout``, ``request_id``, tools, ``response_format``,
                ``reasoning``, and lane-specific fields.

        Returns:
            The complete answer: text, ``finish_reason``, ``usage``, ``timings``, ``tool_calls``,
            ``parsed`` (structured output), ``reasoning``.

        Raises:
            GenerationCancelledError: the stop was requested (any source): raised at once in this
                thread, with the partial text; never retried.
            GenerationTimeoutError: a deadline of ``timeout`` passed.
            ProviderError: the backend answered with an error (typed: ``ModelNotFoundError``,
                ``ContextOverflowError``, ``RateLimitError``, ...); retryable ones were retried.
            ProviderProtocolError: the answer was malformed (partial text kept).
            TransportError: the connection failed or was dropped by the peer.
            OutputValidationError: the answer does not match ``response_format`` or the tools.
            TypeError, ValueError: a wrong argument; nothing was sent.
        """
        call = self._call(prompt, options, "generate")
        return self._portal.run(lambda: run_generation(call), call=call)

    @with_option_signature
    async def agenerate(self, prompt: str | None = None, **options: Unpack[GenerateOptions]) -> GenerateResult:
        """:meth:`generate` for async code (asyncio or trio). Cancelling the task stops the call
        and re-raises the framework's own cancellation unchanged. Same arguments, result and
        errors."""
        call = self._call(prompt, options, "agenerate")
        return await run_generation(call)

    @with_option_signature
    def stream(self, prompt: str | None = None, **options: Unpack[GenerateOptions]) -> SyncGenerationStream:
        """Stream the answer as :class:`StreamChunk` s, from this thread.

        Nothing is sent until the first ``next()``. ``break``, ``close()`` or leaving a ``with``
        block stops the generation at once (the server sees the connection go); ``cancel()``
        stops it from any thread. After the end, ``result()`` gives the whole answer.

        Args:
            prompt: as for :meth:`generate`.
            **options: see :class:`GenerateOptions`.

        Returns:
            An iterator of chunks that is also a context manager.

        Raises:
            The errors of :meth:`generate`, from the ``next()`` where they happen.
        """
        call = self._call(prompt, options, "stream")
        return SyncGenerationStream(GenerationStream(call), self._portal, owner=self)

    @with_option_signature
    def astream(self, prompt: str | None = None, **options: Unpack[GenerateOptions]) -> GenerationStream:
        """:meth:`stream` for async code: an async iterator of chunks that is also an async
        context manager (``aclose()`` or leaving the block stops the generation at once)."""
        call = self._call(prompt, options, "astream")
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
        *,
        sync: bool,
    ) -> tuple[Call, list[str], int]:
        self._ensure_open()
        if not isinstance(texts, (str, list, tuple)):  # a dict would embed its keys; None has no items
            raise TypeError(f"embed() takes a string or a list of strings, not {type(texts).__name__}")
        inputs = [texts] if isinstance(texts, str) else list(texts)
        if not all(isinstance(t, str) for t in inputs):
            raise TypeError("embed() takes a string or a list of strings")
        for i, text in enumerate(inputs):
            check_text(text, f"texts[{i}]")
        if model is not None:
            check_text(model, "model")
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
        return self._new_call(spec, request_id, kind="embeddings", sync=sync), inputs, size

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
        between batches raises ``GenerationCancelledError`` with ``partial_embeddings``.

        Args:
            texts: one string or a list of strings.
            batch_size: inputs per request (the lane's default when None).
            dimensions: the vector length, where the model can shorten it.
            cancel_event, signal: the stop, as for :meth:`generate`.
            timeout: seconds for the whole call (every batch).
            request_id: as for :meth:`generate`.
            model: another model than the LLM's.

        Returns:
            The vectors in input order, ``usage`` and ``model``.

        Raises:
            GenerationCancelledError: stopped; ``partial_embeddings`` holds the finished batches.
            GenerationTimeoutError, ProviderError, TransportError: as for :meth:`generate`
                (with the finished batches kept).
            NotSupportedError: the lane or model has no embeddings.
        """
        call, inputs, size = self._embed_call(
            texts, batch_size, cancel_event, signal, timeout, request_id, model, sync=True
        )
        check_dimensions(dimensions)
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
        """:meth:`embed` for async code; same arguments, result and errors."""
        call, inputs, size = self._embed_call(
            texts, batch_size, cancel_event, signal, timeout, request_id, model, sync=False
        )
        check_dimensions(dimensions)
        return await run_embedding(call, inputs, batch_size=size, dimensions=dimensions)

    def count_tokens(
        self, prompt: str | None = None, *, messages: list[Message] | None = None, timeout: float | None = 30.0
    ) -> int:
        """Tokens of ``prompt`` as given, or of ``messages`` with the chat template applied (what
        ``generate(messages=...)`` reports as ``usage.prompt_tokens``).

        Returns:
            The number of tokens, by the model's own tokenizer.

        Raises:
            NotSupportedError: the lane has no tokenize route (Ollama, LM Studio).
            GenerationTimeoutError, ProviderError, TransportError: as for :meth:`generate`.
        """
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
        """:meth:`count_tokens` for async code."""
        if (prompt is None) == (messages is None):
            raise ValueError("pass a prompt or messages (one of them)")
        # the call boundary's checks, as a generation's (nothing a generation refuses is sent here)
        if prompt is not None:
            check_text(prompt, "prompt")
        if messages is not None:
            check_messages(messages)
            messages = resolve_images(messages, self.image_limits)
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
        if request_id is not None:
            check_request_id(request_id)
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
        """The models the backend has (``ModelInfo``: id, loaded).

        Args:
            timeout: seconds for the whole operation.
            cancel_event, signal: a stop, as for :meth:`generate` (``close()`` stops it too).

        Raises:
            NotSupportedError: the lane cannot list models.
            GenerationCancelledError, GenerationTimeoutError, ProviderError, TransportError.
        """
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
        """:meth:`list_models` for async code."""
        return await self._operation(self.provider.list_models, timeout, cancel_event, signal, request_id)

    def load_model(
        self, *, timeout: float | None = 600.0, cancel_event: threading.Event | None = None, signal: Any = None
    ) -> None:
        """Load (warm) the model, so that the first call does not pay for it.

        Args:
            timeout: seconds for the whole operation.
            cancel_event, signal: a stop, as for :meth:`generate` (``close()`` stops it too).

        Raises:
            NotSupportedError: the lane cannot load models.
            GenerationCancelledError, GenerationTimeoutError, ProviderError, TransportError.
        """
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
        """:meth:`load_model` for async code."""
        await self._operation(self.provider.load_model, timeout, cancel_event, signal, request_id)

    def unload_model(self, drain_timeout: float = 30.0, *, timeout: float | None = 120.0) -> UnloadReport:
        """Eject the model: new calls wait; this LLM's calls in flight are stopped (reason
        ``model_eject``) and drained; then the lane unloads it (in-process lanes free the
        memory). The LLM stays usable: the next call reloads.

        Args:
            drain_timeout: seconds to wait for the stopped calls (and an in-process engine) to
                be idle; nothing is freed under a running computation.
            timeout: seconds for the lane's own unload.

        Returns:
            What was stopped and freed (``stopped_requests``, memory before and after).

        Raises:
            ModelBusyError: still busy at ``drain_timeout``; nothing was unloaded.
            NotSupportedError: the lane cannot unload models.
        """
        return self._run_operation(lambda rid: self.aunload_model(drain_timeout, timeout=timeout, request_id=rid))

    async def aunload_model(
        self, drain_timeout: float = 30.0, *, timeout: float | None = 120.0, request_id: str | None = None
    ) -> UnloadReport:
        """:meth:`unload_model` for async code: refuse new calls meanwhile, stop ours in flight
        (reason ``model_eject``), wait for them to drain, then the lane's own unload (bounded by
        ``timeout``). The LLM stays usable afterwards."""
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
        """Block until the backend answers its readiness probe (an in-process lane: loads the
        model).

        Raises:
            ServerUnavailableError: not ready within ``timeout`` seconds.
            NotSupportedError: the lane has no readiness probe.
        """
        self._run_operation(lambda rid: self.await_ready(timeout, request_id=rid))

    async def await_ready(self, timeout: float = 60.0, *, request_id: str | None = None) -> None:
        """:meth:`wait_ready` for async code."""
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
        """:meth:`close` for async code (use ``async with llm:`` to call it)."""
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
