"""Network settings: a proxy and TLS, resolved once per client, with httpx's names and rules.

``create_llm(..., proxy=, trust_env=, verify=, cert=)`` becomes one :class:`Network` per HTTP
lane, made when the lane is made (so a wrong setting fails at ``create_llm``, and a change to
the environment afterwards does not move a client already made — as an ``httpx.AsyncClient``
reads its environment when it is built):

* ``proxy=`` an ``http://`` or ``https://`` proxy URL (credentials in it become
  ``Proxy-Authorization``), or an ``httpx.Proxy``. http targets are forwarded (absolute-form
  requests); https targets go through a ``CONNECT`` tunnel. SOCKS is refused: no maintained
  sans-io SOCKS library fits this transport.
* ``trust_env=True`` (the default, as in httpx): with no ``proxy=``, ``HTTP_PROXY`` /
  ``HTTPS_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY`` (lowercase too) choose the proxy exactly as
  httpx does — httpx's own reader and pattern rules are used, so the two cannot drift — and
  ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` choose the CAs when ``verify=True``.
* ``verify=`` ``True`` (certifi's bundle, or the environment's), ``False``, a CA bundle file or
  directory, or an ``ssl.SSLContext``; ``cert=`` a client certificate: a PEM path, or
  ``(certfile, keyfile)`` / ``(certfile, keyfile, password)``.

The base URL is fixed per lane, so the proxy decision is made once, here, not per request.
"""

from __future__ import annotations

import base64
import os
import re
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx._utils import URLPattern, get_environment_proxies  # httpx's own rules, not a copy

__all__ = ["DIRECT", "Network", "NetworkSettings", "default_ssl_context", "redact_url", "resolve_network"]

CertTypes = str | tuple[str, str] | tuple[str, str, str]
VerifyTypes = bool | str | ssl.SSLContext


@dataclass(frozen=True)
class NetworkSettings:
    """What a caller gave ``create_llm`` (httpx's names and defaults)."""

    proxy: str | httpx.URL | httpx.Proxy | None = None
    trust_env: bool = True
    verify: VerifyTypes = True
    cert: CertTypes | None = None

    def __repr__(self) -> str:  # a proxy URL's password never reaches a log or a traceback
        proxy = self.proxy
        shown = redact_text(str(proxy.url if isinstance(proxy, httpx.Proxy) else proxy)) if proxy else None
        cert = self.cert[:2] if isinstance(self.cert, tuple) else self.cert  # a key's password: never
        return f"NetworkSettings(proxy={shown!r}, trust_env={self.trust_env!r}, verify={self.verify!r}, cert={cert!r})"


@dataclass(frozen=True)
class Network:
    """The settings resolved for one base URL: what the transport dials and how."""

    proxy: httpx.Proxy | None  # the proxy this base URL goes through, or None (direct)
    ssl_context: ssl.SSLContext | None  # for an https base URL (None for http: never used)
    proxy_ssl_context: ssl.SSLContext | None  # for an https proxy
    proxy_headers: tuple[tuple[bytes, bytes], ...] = field(default=(), repr=False)  # its credentials first

    def __repr__(self) -> str:
        return f"Network(proxy={self.proxy_label or None!r}, tls={self.ssl_context is not None})"

    @property
    def proxy_label(self) -> str:
        """The proxy's URL without credentials, for errors and logs."""
        return redact_url(self.proxy.url) if self.proxy is not None else ""


DIRECT = Network(None, None, None)


def resolve_network(base_url: str, settings: NetworkSettings | None = None) -> Network:
    """The :class:`Network` for ``base_url``. A ``ValueError``/``TypeError`` for a setting that
    cannot work (a SOCKS proxy, a CA file that is not there), raised now rather than at the
    first call."""
    settings = settings or NetworkSettings()
    _check_types(settings)
    url = httpx.URL(base_url)
    proxy = _proxy_for(url, settings)
    needs_tls = url.scheme == "https"
    ssl_context = _ssl_context(settings.verify, settings.cert, settings.trust_env) if needs_tls else None
    proxy_ssl_context = None
    if proxy is not None and proxy.url.scheme == "https":
        proxy_ssl_context = proxy.ssl_context or _ssl_context(settings.verify, settings.cert, settings.trust_env)
    return Network(proxy, ssl_context, proxy_ssl_context, _proxy_headers(proxy) if proxy is not None else ())


def _proxy_headers(proxy: httpx.Proxy) -> tuple[tuple[bytes, bytes], ...]:
    """What goes to the proxy: ``Proxy-Authorization`` from the URL's credentials (as httpcore
    builds it), then the proxy's own headers."""
    headers = list(proxy.headers.raw)
    if proxy.raw_auth is not None:
        username, password = proxy.raw_auth
        token = base64.b64encode(username + b":" + password)
        headers.insert(0, (b"Proxy-Authorization", b"Basic " + token))
    return tuple(headers)


def redact_url(url: httpx.URL | str) -> str:
    """``url`` without its user name and password."""
    try:
        parsed = httpx.URL(str(url))
    except (ValueError, httpx.InvalidURL):
        return redact_text(str(url))
    if parsed.userinfo:
        return str(parsed.copy_with(username=None, password=None))
    return redact_text(str(parsed))  # a password with "/" or "#" is not userinfo to a URL parser


_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^@]*@")


def redact_text(value: str) -> str:
    """A proxy or base URL as typed, with everything before its last ``@`` replaced: a password
    may hold ``/``, ``#`` or ``:`` (which a URL parser reads as a path or a port), so this works
    on the text, not on a parse."""
    if "@" not in value:
        return value
    scheme = _USERINFO.match(value)
    head = scheme.group(1) or "" if scheme else ""
    return f"{head}***@{value.rpartition('@')[2]}"


def _check_types(settings: NetworkSettings) -> None:
    if not isinstance(settings.trust_env, bool):
        raise TypeError(f"trust_env= must be True or False, not {settings.trust_env!r}")
    if not isinstance(settings.verify, (bool, str, os.PathLike, ssl.SSLContext)):
        raise TypeError(
            f"verify= must be a bool, a CA bundle path or an ssl.SSLContext, not {type(settings.verify).__name__}"
        )
    proxy = settings.proxy
    if proxy is not None and not isinstance(proxy, (str, httpx.URL, httpx.Proxy)):
        raise TypeError(f"proxy= must be a URL string, an httpx.URL or an httpx.Proxy, not {type(proxy).__name__}")
    cert = settings.cert
    if cert is not None and not (
        isinstance(cert, (str, os.PathLike))
        or (isinstance(cert, tuple) and len(cert) in (2, 3) and all(isinstance(p, (str, os.PathLike)) for p in cert))
    ):
        raise TypeError("cert= must be a PEM path, or (certfile, keyfile) or (certfile, keyfile, password)")


def _proxy_for(url: httpx.URL, settings: NetworkSettings) -> httpx.Proxy | None:
    if settings.proxy is not None:  # as httpx: an explicit proxy applies to every URL, NO_PROXY aside
        proxy = settings.proxy if isinstance(settings.proxy, httpx.Proxy) else _proxy(settings.proxy, "proxy=")
        return _supported(proxy, "proxy=")
    if not settings.trust_env:
        return None
    mounts = {URLPattern(key): value for key, value in get_environment_proxies().items()}
    for pattern, value in sorted(mounts.items()):  # httpx's order: the most specific pattern first
        if pattern.matches(url):
            return None if value is None else _supported(_proxy(value, "the environment's proxy"), "the environment")
    return None


def _proxy(value: str | httpx.URL, where: str) -> httpx.Proxy:
    text = str(value)
    shown = redact_text(text)
    if isinstance(value, str) and "://" not in text:
        raise ValueError(f"{where}: {shown!r} has no scheme (http://HOST:PORT or https://HOST:PORT)")
    try:
        return httpx.Proxy(value)
    except (ValueError, httpx.InvalidURL) as exc:  # a scheme httpx knows nothing of, a bad port
        # httpx's message can hold the password (a "/" in it reads as the end of the port)
        if "@" in text:
            reason = f"{type(exc).__name__} (percent-encode '/', '#', '?' and '@' in a user name or password)"
        else:
            reason = str(exc)
        raise ValueError(f"{where}: {shown!r} is not a usable proxy URL: {reason}") from None


def _supported(proxy: httpx.Proxy, where: str) -> httpx.Proxy:
    port = proxy.url.port
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"{where}: {redact_url(proxy.url)} has port {port}, outside 1-65535")
    if proxy.url.scheme not in ("http", "https"):
        raise ValueError(
            f"{where}: {redact_url(proxy.url)} is a {proxy.url.scheme} proxy; abstract-client speaks to "
            "http:// and https:// proxies only (set NO_PROXY for this host, trust_env=False, or proxy=)"
        )
    return proxy


# Building an SSLContext costs milliseconds (certifi's bundle is parsed): one per distinct
# setting serves every client made with it — a fleet of 20 members builds one.
_contexts: dict[tuple[Any, ...], ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def _ssl_context(verify: VerifyTypes, cert: CertTypes | None, trust_env: bool) -> ssl.SSLContext:
    if isinstance(verify, ssl.SSLContext):
        if cert is not None:
            _load_cert(verify, cert)
        return verify
    verify = os.fspath(verify) if isinstance(verify, os.PathLike) else verify
    env: tuple[str, str] = ("", "")
    if verify is True and trust_env:
        env = (os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))
    key = (verify, _cert_key(cert), env)
    with _contexts_lock:
        context = _contexts.get(key)
        if context is None:
            context = _contexts[key] = _build(verify, cert, env)
        return context


def default_ssl_context() -> ssl.SSLContext:
    """``verify=True`` with the environment's CAs: for a transport made without settings."""
    return _ssl_context(True, None, True)


def _build(verify: bool | str, cert: CertTypes | None, env: tuple[str, str]) -> ssl.SSLContext:
    cafile, cadir = env
    if verify is True and cafile:
        context = _from_cas(cafile, "SSL_CERT_FILE")
    elif verify is True and cadir:
        context = _from_cas(cadir, "SSL_CERT_DIR")
    elif verify is True:
        context = httpx.create_ssl_context(trust_env=False)  # certifi's bundle, as httpx
    elif verify is False:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = _from_cas(verify, "verify=")
    if cert is not None:
        _load_cert(context, cert)
    return context


def _from_cas(path: str, where: str) -> ssl.SSLContext:
    if not os.path.exists(path):
        raise ValueError(f"{where}: {path!r} does not exist (point it at a CA bundle file or directory, or unset it)")
    try:
        if os.path.isdir(path):
            return ssl.create_default_context(capath=path)
        return ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"{where}: {path!r} holds no usable CA certificate: {exc}") from None


def _load_cert(context: ssl.SSLContext, cert: CertTypes) -> None:
    parts = [os.fspath(cert)] if isinstance(cert, (str, os.PathLike)) else [os.fspath(p) for p in cert]
    for path in parts[:2]:
        if not os.path.isfile(path):
            raise ValueError(f"cert=: {path!r} does not exist")
    try:
        context.load_cert_chain(*parts)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"cert=: the client certificate could not be loaded: {exc}") from None


def _cert_key(cert: CertTypes | None) -> Any:
    if cert is None or isinstance(cert, str):
        return cert
    if isinstance(cert, os.PathLike):
        return os.fspath(cert)
    return tuple(os.fspath(p) for p in cert)
