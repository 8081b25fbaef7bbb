"""Stop for the code applications already have: the HTTP clients openai-python, the anthropic SDK,
ollama-python and the frameworks on them take, over this library's severing connections.

    client = OpenAI(base_url=..., http_client=abstract_client.sdk.http_client())
    with abstract_client.sdk.stop_on(stop_event):
        client.chat.completions.create(...)   # stop_event.set() from any thread: it ends now

A request sent inside ``stop_on(...)`` ends, the moment a source says so, with the contract's
``GenerationCancelledError`` (reason, time to release, bytes and the text received), raised
through the SDK unwrapped and never retried; the server sees its connection close. A cancelled
asyncio or trio task closes it too. See docs/sdks.md.
"""

from __future__ import annotations

from typing import Any

from .blocks import stop_on
from .exchange import cancel, stop_error_class
from .transports import async_transport, flavor_module, transport

__all__ = ["async_http_client", "async_transport", "cancel", "http_client", "stop_error_class", "stop_on", "transport"]

# Client settings that would put another transport beside ours (a request that skips the stop)
_REFUSED = ("transport", "mounts", "proxies", "app")


def http_client(
    *,
    flavor: str = "httpx2",
    proxy: Any = None,
    verify: Any = True,
    cert: Any = None,
    trust_env: bool = True,
    carry_plain_calls: bool = True,
    **client_kwargs: Any,
) -> Any:
    """A ``httpx2.Client`` (``flavor="httpx"``: an ``httpx.Client``) for an SDK's
    ``http_client=``; ``proxy``, ``verify``, ``cert`` and ``trust_env`` as httpx reads them,
    ``carry_plain_calls`` as :func:`transport` takes it, the other keywords (``timeout``,
    ``headers``…) passed to the client."""
    return _client(False, flavor, proxy, verify, cert, trust_env, carry_plain_calls, client_kwargs)


def async_http_client(
    *,
    flavor: str = "httpx2",
    proxy: Any = None,
    verify: Any = True,
    cert: Any = None,
    trust_env: bool = True,
    carry_plain_calls: bool = True,
    **client_kwargs: Any,
) -> Any:
    """The async twin of :func:`http_client`: a ``httpx2.AsyncClient`` (or ``httpx.AsyncClient``)."""
    return _client(True, flavor, proxy, verify, cert, trust_env, carry_plain_calls, client_kwargs)


def _client(
    is_async: bool,
    flavor: str,
    proxy: Any,
    verify: Any,
    cert: Any,
    trust_env: bool,
    carry: bool,
    kwargs: dict[str, Any],
) -> Any:
    for name in _REFUSED:
        if name in kwargs:
            raise TypeError(f"http_client(): {name}= would bypass the stopping transport; not accepted")
    if kwargs.pop("http2", False):
        raise ValueError("http_client(): http2=True cannot be honoured: the stopping transport speaks HTTP/1.1")
    make = async_transport if is_async else transport
    # The environment's proxy is the transport's to read: a client given a transport mounts no
    # other for it (httpx and httpx2 alike), so every request goes through the stop.
    sending = make(flavor=flavor, proxy=proxy, verify=verify, cert=cert, trust_env=trust_env, carry_plain_calls=carry)
    module = flavor_module(flavor)
    return (module.AsyncClient if is_async else module.Client)(transport=sending, trust_env=trust_env, **kwargs)
