"""The outermost middleware: the request's id, its key (its owner), and its body, read here within
a size and a time limit before the app sees anything."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.types import Message, Receive, Scope, Send

from ...wires.chat_server import openai_error
from ...wires.messages_server import anthropic_shape
from ..team.keys import ANONYMOUS, METRICS
from .browsers import BrowserPolicy
from .client_writes import send_json
from .reading import REQUEST_ID

__all__ = ["RequestIdAndAuth"]


class RequestIdAndAuth:
    """Outermost middleware: every response carries ``X-Request-Id`` (the caller's, if valid);
    with API keys, every route but ``/health`` needs ``Authorization: Bearer <key>`` (compared
    in constant time; keys never logged). The key a request came with is its owner: only the
    same key, or the admin key, may cancel it; with an admin key set, only it may load and
    unload models."""

    def __init__(
        self,
        app: Starlette,
        api_keys: list[str],
        *,
        admin_key: str | None = None,
        max_body_bytes: int = 32 * 2**20,
        body_timeout: float = 30.0,
        browsers: BrowserPolicy | None = None,
        names: dict[str, str] | None = None,
        metrics_key: str | None = None,
    ) -> None:
        """``names``: each key's name (usage and limits say it, never the key). ``metrics_key``:
        a key that reads ``/metrics`` (every key's series too) and nothing else."""
        self.app = app
        self.browsers = browsers or BrowserPolicy.of("127.0.0.1", [], [])
        self.body_timeout = body_timeout
        self.state = app.state
        self._admin = admin_key.encode() if admin_key else None
        self._keys = [k.encode() for k in api_keys] + ([self._admin] if self._admin else [])
        self.max_body_bytes = max_body_bytes
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        path = str(scope.get("path", ""))
        # every refusal here in the route's own shape: Anthropic's clients read only theirs
        messages_route = path == "/v1/messages" or path.startswith("/v1/messages/")

        async def refuse(
            sender: Send, status: int, why: str, kind: str, code: str | None = None, extra: list[Any] | None = None
        ) -> None:
            body = openai_error(why, kind, code)
            await send_json(sender, status, anthropic_shape(status, body) if messages_route else body, extra)

        given = headers.get(b"x-request-id", b"").decode("latin-1")
        if (given or b"x-request-id" in headers) and not REQUEST_ID.match(given):
            await refuse(send, 400, "X-Request-Id: 1-128 of [A-Za-z0-9._:-]", "invalid_request_error")
            return
        request_id = given or f"req-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        tags = [(b"x-request-id", request_id.encode()), (b"x-content-type-options", b"nosniff")]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *tags]}
            await send(message)

        if b"transfer-encoding" in headers and b"content-length" in headers:
            # RFC 9112 section 6.3: a message with both may be a smuggling attempt; refused, and the
            # connection closed (what follows on it cannot be trusted to be a request of its own)
            why = "a request with both Content-Length and Transfer-Encoding is refused"
            close = [(b"connection", b"close")]
            await refuse(send_with_id, 400, why, "invalid_request_error", "ambiguous_length", close)
            return
        # before the key and before the body: a page on this machine is refused whatever it sends
        method = scope.get("method", "GET")
        refused = self.browsers.refusal(method, headers)
        if refused is not None:
            status, why, code = refused
            await refuse(send_with_id, status, why, "invalid_request_error", code)
            return

        accepted, owner, admin, name = self._owner(headers.get(b"authorization", b""), headers.get(b"x-api-key", b""))
        metrics_reader = not admin and self._metrics_reader(headers.get(b"authorization", b""), path)
        if metrics_reader:
            accepted, owner, name = True, None, METRICS
        # the chat page itself is public (it asks for the key); its calls carry the key
        if not accepted and path not in ("/health", "/ready", "/"):
            await refuse(send_with_id, 401, "missing or wrong API key", "authentication_error")
            return
        # after the key: a caller without one learns nothing of what a route accepts
        refused = self.browsers.media_refusal(method, headers)
        if refused is not None:
            status, why, code = refused
            await refuse(send_with_id, status, why, "invalid_request_error", code)
            return
        scope["state"].update(
            owner=owner,
            admin=admin,
            admin_required=self._admin is not None,
            key_accepted=accepted,
            key_name=name,
            metrics_reader=metrics_reader,
        )
        # The body limit: a declared length over it is refused before a byte is read; any other
        # body is read here (at most the limit, so memory stays bounded) and refused the moment
        # it passes it, before the app sees anything; the app gets the body replayed.
        limit = self.max_body_bytes
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await refuse(send_with_id, 413, _too_large(limit), "invalid_request_error", "request_too_large")
            return
        body = bytearray()
        with anyio.move_on_after(self.body_timeout) as reading:  # a slow upload holds nothing forever
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":  # the client left during its upload
                    return
                body += message.get("body", b"")
                if len(body) > limit:
                    await refuse(send_with_id, 413, _too_large(limit), "invalid_request_error", "request_too_large")
                    return
                if not message.get("more_body", False):
                    break
        if reading.cancelled_caught:
            slow = f"the request body did not arrive within {self.body_timeout}s (body_timeout)"
            await refuse(send_with_id, 408, slow, "invalid_request_error", "request_timeout")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect watch
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send_with_id)


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit} bytes (--max-body-mb / max_body_bytes)"
