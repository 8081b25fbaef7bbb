"""What a web page on the same machine may do to the gateway: nothing it was not allowed to.

The threat: the gateway listens on loopback with no key (the default), and any page the user
opens can send it requests — a ``fetch(..., {mode: "no-cors"})`` POST with a ``text/plain`` body
needs no CORS preflight, and DNS rebinding (``attacker.example`` resolving to 127.0.0.1) lets a
page read the answers too. Ollama shipped this class of bug and fixed it the same way:

* **Host allow-list**: the ``Host`` header must name the gateway — by default a loopback name
  (``localhost``, ``127.0.0.1``, ``[::1]``) or the address it was told to bind; ``allowed_hosts``
  adds names (a proxy's public name), ``"*"`` allows any. A rebinding page sends its own name.
* **Origin check, every route**: a request a browser sends from another origin carries an
  ``Origin``; only the gateway's own page (same host and port) and ``allowed_origins`` pass.
  ``Origin: null`` (sandboxed frames, some redirects) never does.
* **JSON only**: a request whose body has a content type must say ``application/json`` (or
  ``+json``): the types a page can send without a preflight (``text/plain``, forms, multipart)
  are refused, ``Origin`` or not. A body with no content type at all is a program's (a page's
  fetch of a type-less Blob carries an ``Origin``, judged above).

Every refusal is an OpenAI error body, sent before the body is read and before anything reaches
a backend.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = ["BrowserPolicy", "LOOPBACK_NAMES"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
_JSON_TYPES = ("application/json",)


@dataclass(frozen=True, slots=True)
class BrowserPolicy:
    """The hosts a request may name, and the origins (besides the gateway's own) that may send."""

    hosts: frozenset[str]  # lowercase names, IPv6 without brackets; "*" = any
    origins: frozenset[str]  # "scheme://host[:port]", lowercase

    @classmethod
    def of(cls, bind_host: str, allowed_hosts: list[str], allowed_origins: list[str]) -> BrowserPolicy:
        hosts = set(LOOPBACK_NAMES)
        bind = bind_host.strip("[]").lower()
        if bind not in _WILDCARD_BINDS:
            hosts.add(bind)
        hosts.update(h.strip().strip("[]").lower() for h in allowed_hosts if h.strip())
        origins = frozenset(o.strip().rstrip("/").lower() for o in allowed_origins if o.strip())
        return cls(frozenset(hosts), origins)

    def refusal(self, method: str, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
        """``(status, message, code)`` for a request a page must not make; None to let it in."""
        raw_host = headers.get(b"host", b"").decode("latin-1").strip().lower()
        name = _host_name(raw_host)
        if "*" not in self.hosts and (name is None or name not in self.hosts):
            return 403, f"Host {raw_host[:100]!r} is not this gateway's name (allowed_hosts)", "host_not_allowed"
        origin = headers.get(b"origin")
        if origin is not None:
            given = origin.decode("latin-1").strip().rstrip("/").lower()
            same = given in (f"http://{raw_host}", f"https://{raw_host}")
            if given == "null" or not (same or given in self.origins):
                return 403, f"Origin {given[:100]!r} may not use this gateway (allowed_origins)", "origin_not_allowed"
        return None

    def media_refusal(self, method: str, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
        """A body that is not JSON (a page's form or text/plain post), judged after the key: a
        caller without one learns nothing of what a route accepts."""
        if method not in ("GET", "HEAD", "OPTIONS") and _has_body(headers) and b"content-type" in headers:
            # (no Content-Type at all: a program's request; a page's body without one — a Blob —
            # carries an Origin, judged above)
            kind = headers[b"content-type"].decode("latin-1").split(";", 1)[0].strip().lower()
            if not (kind in _JSON_TYPES or (kind.startswith("application/") and kind.endswith("+json"))):
                shown = kind[:100] or "empty"
                return 415, f"the request body must be application/json, not {shown}", "unsupported_media_type"
        return None


def _host_name(host: str) -> str | None:
    """The name in a ``Host`` header (no port, IPv6 unbracketed); None when it is not one."""
    if not host:
        return None
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return None
        name, rest = host[1:end], host[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        return name
    name, _, port = host.partition(":")
    if port and not port.isdigit():
        return None
    return name or None


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length", b"").strip()
    if length:
        return length != b"0"
    return b"transfer-encoding" in headers
