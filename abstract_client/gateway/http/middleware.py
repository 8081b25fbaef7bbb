"""The gateway's middleware, outermost first, one job each — before the app sees a request:

1. :class:`RequestIds` — its ``X-Request-Id`` (the caller's, if valid), on every response;
2. :class:`OneLength` — a message with both ``Content-Length`` and ``Transfer-Encoding`` (a
   smuggling attempt) refused, its connection closed;
3. :class:`BrowserGuard` — a web page on this machine refused whatever it sends (``browsers.py``),
   before the key;
4. :class:`Keys` — its key (its owner, its name): every route but ``/health``, ``/ready`` and the
   chat page needs one when keys are set;
5. :class:`MediaTypes` — what a route accepts, judged only once the key was (a caller without
   one learns nothing);
6. :class:`BodyLimit` — its body read within a size and a time limit, then replayed to the app.

Each refusal is in the shape of the route it was meant for (``error_answers.refuse``).
:func:`stack` builds them around the app, in this order.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..team.keys import ANONYMOUS, METRICS
from .browsers import BrowserPolicy
from .error_answers import refuse
from .reading import REQUEST_ID
from .scope import Caller

__all__ = ["BodyLimit", "BrowserGuard", "Keys", "MediaTypes", "OneLength", "RequestIds", "stack"]


def stack(
    app: ASGIApp,
    api_keys: list[str],
    *,
    admin_key: str | None = None,
    max_body_bytes: int = 32 * 2**20,
    body_timeout: float = 30.0,
    browsers: BrowserPolicy | None = None,
    names: dict[str, str] | None = None,
    metrics_key: str | None = None,
) -> ASGIApp:
    """The app inside its middleware (see the module docstring). ``names``: each key's name
    (usage and limits say it, never the key). ``metrics_key``: a key that reads ``/metrics``
    (every key's series too) and nothing else."""
    policy = browsers or BrowserPolicy.of("127.0.0.1", [], [])
    app = BodyLimit(app, max_body_bytes, body_timeout)
    app = MediaTypes(app, policy)
    app = Keys(app, api_keys, admin_key=admin_key, names=names, metrics_key=metrics_key)
    app = BrowserGuard(app, policy)
    app = OneLength(app)
    return RequestIds(app)


class _Http:
    """A middleware that acts on HTTP requests only (lifespan and the rest pass through)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state: Any = getattr(app, "state", None)  # the app's (``app.state.gateway``), from outside

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return dict(scope.get("headers") or [])


class RequestIds(_Http):
    """Every response carries ``X-Request-Id`` (the caller's, if valid; else one made here) and
    ``X-Content-Type-Options: nosniff``; the id is the request's in ``scope["state"]``."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        if (given or b"x-request-id" in headers) and not REQUEST_ID.match(given):
            await refuse(scope, send, 400, "X-Request-Id: 1-128 of [A-Za-z0-9._:-]", "invalid_request_error")
            return
        request_id = given or f"req-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        tags = [(b"x-request-id", request_id.encode()), (b"x-content-type-options", b"nosniff")]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *tags]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class OneLength(_Http):
    """RFC 9112 section 6.3: a message with both ``Content-Length`` and ``Transfer-Encoding`` may
    be a smuggling attempt; refused, and the connection closed (what follows on it cannot be
    trusted to be a request of its own)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        if b"transfer-encoding" in headers and b"content-length" in headers:
            why = "a request with both Content-Length and Transfer-Encoding is refused"
            close = [(b"connection", b"close")]
            await refuse(scope, send, 400, why, "invalid_request_error", "ambiguous_length", close)
            return
        await self.app(scope, receive, send)


class _Judged(_Http):
    """A middleware that refuses what its judgement of a request's method and headers refuses
    (``browsers.BrowserPolicy``), in the route's shape."""

    def __init__(self, app: ASGIApp, policy: BrowserPolicy) -> None:
        super().__init__(app)
        self.policy = policy

    def judge(self, method: str, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
        raise NotImplementedError

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self.judge(scope.get("method", "GET"), _headers(scope))
        if refused is not None:
            status, why, code = refused
            await refuse(scope, send, status, why, "invalid_request_error", code)
            return
        await self.app(scope, receive, send)


class BrowserGuard(_Judged):
    """Before the key and before the body: a page on this machine is refused whatever it sends
    (``browsers.BrowserPolicy.refusal``)."""

    def judge(self, method: str, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
        return self.policy.refusal(method, headers)


class Keys(_Http):
    """With API keys, every route but ``/health`` (and ``/ready``, and the chat page, which asks
    for the key) needs ``Authorization: Bearer <key>`` or ``x-api-key`` (compared in constant
    time; keys never logged). The key a request came with is its owner: only the same key, or the
    admin key, may cancel it; with an admin key set, only it may load and unload models."""

    def __init__(
        self,
        app: ASGIApp,
        api_keys: list[str],
        *,
        admin_key: str | None = None,
        names: dict[str, str] | None = None,
        metrics_key: str | None = None,
    ) -> None:
        super().__init__(app)
        self._admin = admin_key.encode() if admin_key else None
        self._keys = [k.encode() for k in api_keys] + ([self._admin] if self._admin else [])
        self._names = {key.encode(): name for name, key in (names or {}).items()}
        self._metrics_key = metrics_key.encode() if metrics_key else None

    def _metrics_reader(self, auth: bytes, path: str) -> bool:
        """The ``metrics_key``, on ``GET /metrics`` (anywhere else it is no key at all)."""
        if self._metrics_key is None or path != "/metrics":
            return False
        given = auth[7:].strip() if auth.startswith(b"Bearer ") else b""
        return hmac.compare_digest(given, self._metrics_key)

    def _owner(self, auth: bytes, api_key: bytes = b"") -> tuple[bool, str | None, bool, str]:
        """(accepted, the key's identity (a hash, never the key), is it the admin key, its name).
        The key comes as ``Authorization: Bearer`` (OpenAI's clients) or ``x-api-key``
        (Anthropic's)."""
        if not self._keys:
            return True, None, False, ANONYMOUS
        given = auth[7:].strip() if auth.startswith(b"Bearer ") else api_key.strip()
        found = None
        for key in self._keys:  # every key compared, in constant time: no early exit
            if hmac.compare_digest(given, key):
                found = key
        if found is None:
            return False, None, False, ANONYMOUS
        name = self._names.get(found, ANONYMOUS)
        return True, hashlib.sha256(found).hexdigest()[:16], found == self._admin, name

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        path = str(scope.get("path", ""))
        accepted, owner, admin, name = self._owner(headers.get(b"authorization", b""), headers.get(b"x-api-key", b""))
        metrics_reader = not admin and self._metrics_reader(headers.get(b"authorization", b""), path)
        if metrics_reader:
            accepted, owner, name = True, None, METRICS
        # the chat page itself is public (it asks for the key); its calls carry the key
        if not accepted and path not in ("/health", "/ready", "/"):
            await refuse(scope, send, 401, "missing or wrong API key", "authentication_error")
            return
        scope.setdefault("state", {})["caller"] = Caller(
            owner=owner,
            name=name,
            admin=admin,
            admin_required=self._admin is not None,
            accepted=accepted,
            metrics_reader=metrics_reader,
        )
        await self.app(scope, receive, send)


class MediaTypes(_Judged):
    """After the key: a caller without one learns nothing of what a route accepts
    (``browsers.BrowserPolicy.media_refusal``)."""

    def judge(self, method: str, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
        return self.policy.media_refusal(method, headers)


class BodyLimit(_Http):
    """The body limit: a declared length over it is refused before a byte is read; any other
    body is read here (at most the limit, so memory stays bounded) and refused the moment it
    passes it, before the app sees anything; a slow upload holds nothing past ``body_timeout``
    (a 408). The app gets the body replayed."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout: float) -> None:
        super().__init__(app)
        self.max_body_bytes, self.body_timeout = max_body_bytes, body_timeout

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.max_body_bytes
        declared = _headers(scope).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await refuse(scope, send, 413, _too_large(limit), "invalid_request_error", "request_too_large")
            return
        body = bytearray()
        with anyio.move_on_after(self.body_timeout) as reading:  # a slow upload holds nothing forever
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":  # the client left during its upload
                    return
                body += message.get("body", b"")
                if len(body) > limit:
                    await refuse(scope, send, 413, _too_large(limit), "invalid_request_error", "request_too_large")
                    return
                if not message.get("more_body", False):
                    break
        if reading.cancelled_caught:
            slow = f"the request body did not arrive within {self.body_timeout}s (body_timeout)"
            await refuse(scope, send, 408, slow, "invalid_request_error", "request_timeout")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect watch
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit} bytes (--max-body-mb / max_body_bytes)"
