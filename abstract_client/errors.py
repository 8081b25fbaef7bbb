"""The error hierarchy.

Every error carries what was produced before it happened (``partial_text``, ``generated_tokens``,
``usage``) and where it happened (``provider``, ``model``, ``request_id``): the contract fills
these in on whatever a provider raised, so nothing the user already paid for is lost.

Retry decisions are made from the *type* and the ``retryable`` flag set at construction, never
from message text. The categories a caller catches, and the builtin each is also::

    AbstractClientError
    ├── GenerationCancelledError      the host asked for the stop; never retried
    ├── GenerationTimeoutError        (TimeoutError) a deadline of the call passed; never retried
    ├── ProviderError                 the server answered, and refused
    │   ├── ModelNotFoundError
    │   ├── InvalidRequestError       (HTTP 400/422)
    │   │   └── ContextOverflowError
    │   ├── RateLimitError            (429)
    │   ├── ServerUnavailableError    (503, not ready)
    │   │   └── ConnectionFailedError   ... and the network failed: no connection was made
    │   └── ProviderAPIError          any other status
    ├── NotSupportedError             the backend cannot do this (known by the lane, or said
    │                                 by the server); never retried
    ├── NetworkError                  (ConnectionError) the network failed
    │   ├── ConnectionFailedError     nothing was sent (refused, reset in the handshake); retryable
    │   ├── TLSCertificateError       the server's certificate did not verify; never retried
    │   ├── ProxyError                the proxy refused the request (407, 403); never retried
    │   └── TransportError            the connection was lost during the call (not by us)
    ├── ProviderProtocolError         the server answered outside its protocol
    ├── OutputValidationError         a complete answer that does not match its schema
    ├── ModelBusyError                an eject could not free a model still computing
    ├── ImageInputError               (ValueError) an image refused at the call site
    └── AbortError                    ``AbortSignal.throw_if_aborted()`` without an exception

``except NetworkError`` (or the builtin ``ConnectionError``) is "the network failed";
``except ProviderError`` is "the server refused"; ``ConnectionFailedError`` is both a
``ServerUnavailableError`` (as a connection refused always was here) and a ``NetworkError``.
What is refused before anything is sent is never a ``ProviderError``: a wrong argument is a
``TypeError``/``ValueError`` (``ImageInputError`` too), a capability the lane lacks a
``NotSupportedError``.

**Deadlines, one rule:** a deadline given as ``timeout=`` (a number or ``Timeout(...)``) is the
call's own limit and raises ``GenerationTimeoutError`` (``kind`` says which); a deadline given
as a stop source, ``signal=AbortSignal.timeout(s)``, is a Stop like any other and raises
``GenerationCancelledError(reason="timeout")``. Both sever the connection; neither is retried.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .types import ToolCall, ToolCallDelta, Usage

StopReason = Literal["user", "timeout", "model_eject", "shutdown"]
TimeoutKind = Literal["connect", "first_token", "idle", "total"]

__all__ = [
    "AbstractClientError",
    "AbortError",
    "GenerationCancelledError",
    "GenerationTimeoutError",
    "ProviderError",
    "ModelNotFoundError",
    "InvalidRequestError",
    "ContextOverflowError",
    "RateLimitError",
    "ServerUnavailableError",
    "ProviderAPIError",
    "NotSupportedError",
    "ImageInputError",
    "OutputValidationError",
    "ModelBusyError",
    "ProviderProtocolError",
    "NetworkError",
    "ConnectionFailedError",
    "TLSCertificateError",
    "ProxyError",
    "TransportError",
]


class AbstractClientError(Exception):
    """Base of every error this library raises."""

    retryable: bool = False

    def __init__(self, message: str = "", **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.partial_text: str = context.pop("partial_text", "")
        self.generated_tokens: int = context.pop("generated_tokens", 0)
        self.usage: Usage | None = context.pop("usage", None)
        self.provider: str | None = context.pop("provider", None)
        self.model: str | None = context.pop("model", None)
        self.request_id: str | None = context.pop("request_id", None)
        self.member: str | None = context.pop("member", None)  # a Fleet call: the member it failed on
        # Embedding calls: the vectors finished before the error, in input order; they cover
        # the first ``len(partial_embeddings)`` inputs. None for generations.
        self.partial_embeddings: list[list[float]] | None = context.pop("partial_embeddings", None)
        # Generations: the reasoning text so far, the tool calls that were complete, and the raw
        # piece of the one that was not (never handed out as a call).
        self.partial_reasoning: str = context.pop("partial_reasoning", "")
        self.tool_calls: list[ToolCall] = context.pop("tool_calls", None) or []
        self.partial_tool_call: ToolCallDelta | None = context.pop("partial_tool_call", None)
        if context:
            raise TypeError(f"unexpected error context: {sorted(context)}")

    def __str__(self) -> str:
        where = ", ".join(f"{k}={v}" for k, v in (("provider", self.provider), ("request_id", self.request_id)) if v)
        return f"{self.message} ({where})" if where else self.message


class AbortError(AbstractClientError):
    """Raised by ``AbortSignal.throw_if_aborted()`` when the signal's reason is not an exception."""


class GenerationCancelledError(AbstractClientError):
    """The generation was stopped on request. Request-local; never retried.

    ``reason`` is one of ``user``, ``timeout`` (an ``AbortSignal.timeout``), ``model_eject`` or
    ``shutdown``. ``cancel_to_stop_ms`` is the time from the stop being requested to this error
    being raised.
    """

    def __init__(
        self,
        message: str = "generation cancelled",
        *,
        reason: StopReason = "user",
        cancel_to_stop_ms: float | None = None,
        signal_reason: object = None,
        **context: Any,
    ) -> None:
        super().__init__(message, **context)
        self.reason: StopReason = reason
        self.cancel_to_stop_ms = cancel_to_stop_ms
        self.signal_reason = signal_reason


class GenerationTimeoutError(AbstractClientError, TimeoutError):
    """A deadline passed: ``kind`` is connect, first_token, idle or total. Never retried. A
    ``TimeoutError`` too."""

    def __init__(self, message: str, *, kind: TimeoutKind, **context: Any) -> None:
        super().__init__(message, **context)
        self.kind: TimeoutKind = kind


class ProviderError(AbstractClientError):
    """The backend answered with an error. ``retryable`` is decided by type at construction."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: Any = None,
        retryable: bool | None = None,
        retry_after: float | None = None,
        **context: Any,
    ) -> None:
        super().__init__(message, **context)
        self.status = status
        self.body = body
        self.retry_after = retry_after
        if retryable is not None:
            self.retryable = retryable


class ModelNotFoundError(ProviderError):
    """The requested model does not exist on the server."""


class InvalidRequestError(ProviderError):
    """The server rejected the request as malformed (HTTP 400/422)."""


class ContextOverflowError(InvalidRequestError):
    """The prompt (plus max_tokens) does not fit the model's context window."""

    def __init__(
        self,
        message: str,
        *,
        n_prompt_tokens: int | None = None,
        n_ctx: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class RateLimitError(ProviderError):
    """HTTP 429. Retried only when the server said when (Retry-After)."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        kw.setdefault("retryable", retry_after is not None)
        super().__init__(message, retry_after=retry_after, **kw)


class ServerUnavailableError(ProviderError):
    """The server is not ready: 503 (e.g. loading a model) or connection refused."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        kw.setdefault("retryable", retry_after is not None)
        super().__init__(message, retry_after=retry_after, **kw)


class ProviderAPIError(ProviderError):
    """Any other error status. 502 and 504 (a proxy in front of the server) are retryable."""

    def __init__(self, message: str, *, status: int | None = None, **kw: Any) -> None:
        kw.setdefault("retryable", status in (502, 504))
        super().__init__(message, status=status, **kw)


class NotSupportedError(AbstractClientError):
    """The backend cannot do this: known by the lane before anything is sent (unloading the model
    of a single-model llama-server, ``resumable=True`` on a lane without resumable streams), or
    said by the server (``status`` and ``body`` then hold its answer: vLLM started without its
    tool-call flags). Never retried. Not a ``ProviderError``: no other attempt of the same call
    can change it."""

    def __init__(self, message: str = "", *, status: int | None = None, body: Any = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.status = status
        self.body = body


class ImageInputError(AbstractClientError, ValueError):
    """An image the call cannot carry, refused at the call site before anything is sent: over a
    size or count limit (``ImageLimits``), an unreadable file, a data URL that is not base64 of
    an image. A ``ValueError`` too, as every other wrong argument is."""


class ModelBusyError(AbstractClientError):
    """An eject could not finish: a decode was still running at the drain deadline, so nothing
    was freed."""


class OutputValidationError(AbstractClientError):
    """A complete answer that does not match what was asked: text that is not JSON of the
    ``response_format`` schema, or tool-call arguments that are not JSON of the tool's
    parameters. ``raw_text`` is what the model produced, ``errors`` what was wrong. Never retried
    automatically, and never raised for a stopped answer (that is ``GenerationCancelledError``)."""

    def __init__(self, message: str, *, raw_text: str = "", errors: list[str] | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.raw_text = raw_text
        self.errors: list[str] = errors or []


class ProviderProtocolError(AbstractClientError):
    """The server sent something that is not its protocol: a malformed frame or body, a stream
    that ended without its final frame. ``partial_text`` keeps what arrived before."""


class NetworkError(AbstractClientError, ConnectionError):
    """The network failed (a category: catch it, or the builtin ``ConnectionError``, for "the
    network failed" as opposed to "the server refused", which is :class:`ProviderError`)."""


class ConnectionFailedError(ServerUnavailableError, NetworkError):
    """No connection could be made (refused, reset or closed before or during the TLS
    handshake): nothing was sent, so it is retried and a fleet fails over. A
    ``ServerUnavailableError`` too, as a refused connection always was here."""

    def __init__(self, message: str, *, retryable: bool = True, **kw: Any) -> None:
        super().__init__(message, retryable=retryable, **kw)


class TLSCertificateError(NetworkError):
    """The server's TLS certificate did not verify (an unknown CA, a wrong host name, an expired
    certificate): the connection was refused by us, for the server is not known to be who it
    says. Never retried, never failed over: a retry would meet the same certificate. ``host``
    and ``reason`` say which and why (``verify=`` / ``SSL_CERT_FILE`` choose the CAs)."""

    def __init__(self, message: str, *, host: str = "", reason: str = "", **context: Any) -> None:
        super().__init__(message, **context)
        self.host = host
        self.reason = reason


class ProxyError(NetworkError):
    """The proxy on the way refused to carry the request (``407`` wants credentials, ``403`` a
    policy): nothing reached the server. Never retried: a retry meets the same proxy. ``proxy``
    is its URL without credentials; ``status`` its answer. (A proxy that could not reach the
    server — 502/503/504 to ``CONNECT`` — is a :class:`ConnectionFailedError`, retried.)"""

    def __init__(self, message: str, *, proxy: str = "", status: int | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.proxy = proxy
        self.status = status


class TransportError(NetworkError):
    """The connection was dropped by the peer (not by us) during the call. ``no_response``: before
    a single byte of a response (a member killed with the request queued or in prefill): not
    retried by the call (the server may have started on it), but a fleet sends it to another
    member, for nobody saw anything of it."""

    def __init__(self, message: str, *, retryable: bool = False, no_response: bool = False, **context: Any) -> None:
        super().__init__(message, **context)
        self.retryable = retryable
        self.no_response = no_response
