"""``create_llm`` and the provider registry.

Built-in lanes are registered by name; third parties add theirs through the entry point group
``abstract_client.providers`` (``name = "package.module:ProviderClass"``) or
:func:`register_provider`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from .images import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGES, ImageLimits
from .llm import LLM
from .provider import InProcessProvider, Provider
from .types import Timeout

__all__ = ["ENTRY_POINT_GROUP", "available_providers", "create_llm", "register_provider", "runs_in_process"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "abstract_client.providers"

_BUILTIN: dict[str, str] = {
    "openai-compatible": "abstract_client.providers.openai_compatible:OpenAICompatibleProvider",
    "llamacpp": "abstract_client.providers.llamacpp:LlamaCppProvider",
    "ollama": "abstract_client.providers.ollama:OllamaProvider",
    "lmstudio": "abstract_client.providers.lmstudio:LMStudioProvider",
    "mlx": "abstract_client.providers.mlx:MLXProvider",
    "transformers": "abstract_client.providers.transformers:TransformersProvider",
    "gguf": "abstract_client.providers.gguf:GGUFProvider",
    "vllm": "abstract_client.providers.vllm:VLLMProvider",
    "remote": "abstract_client.providers.remote:RemoteProvider",
    "anthropic": "abstract_client.providers.anthropic:AnthropicProvider",
}
_registered: dict[str, Callable[..., Provider]] = {}
_FLEET_OPTIONS = (
    "policy",
    "load_bound",
    "hedge_after",
    "max_attempts",
    "weights",
    "failure_threshold",
    "failure_window",
    "cooldown",
    "max_cooldown",
    "probe_timeout",
    "probe_interval",
)


# httpx's client settings this library does not take: never a request body's fields, so naming
# one is a TypeError (a password or an SSL context must not reach a server as JSON). The ones it
# takes — proxy=, trust_env=, verify=, cert= — are the lanes' own keyword options.
_CLIENT_SETTINGS = frozenset(
    {
        "auth",
        "cookies",
        "event_hooks",
        "follow_redirects",
        "http1",
        "http2",
        "http_client",
        "limits",
        "mounts",
        "proxies",
        "ssl_context",
        "transport",
    }
)
NETWORK_SETTINGS = ("proxy", "trust_env", "verify", "cert")
_SET_BY_CREATE_LLM = frozenset({"model", "base_url", "api_key", "connect_timeout"})
_OWN_OPTIONS = ("timeout", "max_retries", "max_image_bytes", "max_images")


def _check_options(provider: str, factory: Callable[..., Provider], options: dict[str, Any]) -> None:
    """An HTTP lane's options, checked by name before anything is built: httpx settings this
    library does not take, and names the lane does not know, are a ``TypeError`` (a typo such as
    ``verfy=False`` would otherwise travel to the server in the body); request body fields go in
    ``extra_body={...}``, which must be JSON."""
    given = sorted(_CLIENT_SETTINGS.intersection(options))
    if given:
        names = ", ".join(f"{n}=" for n in given)
        raise TypeError(
            f"create_llm({provider!r}): {names} is an HTTP client setting abstract-client does not take "
            f"(it takes {', '.join(f'{n}=' for n in NETWORK_SETTINGS)}); it is never sent to the server"
        )
    known = _option_names(factory)
    if known is None:  # a lane that takes any keyword: what it does not name goes in its body
        _check_json(provider, {k: v for k, v in options.items() if k not in NETWORK_SETTINGS}, "extra request fields")
    else:
        unknown = sorted(set(options) - known)
        if unknown:
            valid = sorted((known - _SET_BY_CREATE_LLM) | set(_OWN_OPTIONS))
            raise TypeError(
                f"create_llm({provider!r}): unknown option {', '.join(f'{n}=' for n in unknown)}; "
                f"valid: {', '.join(f'{n}=' for n in valid)}; a request body field goes in extra_body={{...}}"
            )
    extra = options.get("extra_body")
    if extra is not None:
        if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
            raise TypeError(f"create_llm({provider!r}): extra_body= must be a dict with string keys")
        _check_json(provider, extra, "extra_body")


def _check_json(provider: str, fields: dict[str, Any], what: str) -> None:
    try:
        json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:  # an object or a NaN: it could only fail at the first call
        raise TypeError(f"create_llm({provider!r}): the {what} must be JSON: {exc}") from None


def _option_names(factory: Callable[..., Provider]) -> set[str] | None:
    """The keyword options ``factory`` takes, following ``**kw`` up its classes' ``__init__``;
    None when it ends in ``**kw`` (it takes any name)."""
    names: set[str] = set()
    inits = (
        [c.__dict__["__init__"] for c in factory.__mro__ if "__init__" in c.__dict__]
        if isinstance(factory, type)
        else [factory]
    )
    for init in inits:
        params = inspect.signature(init).parameters.values()
        names |= {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names
    return None


def register_provider(name: str, factory: Callable[..., Provider]) -> None:
    """Register a provider class (or factory) under ``name``."""
    _registered[name] = factory


def available_providers() -> list[str]:
    """The lane names ``create_llm`` accepts: built in, registered, and from entry points."""
    names = set(_BUILTIN) | set(_registered)
    names |= {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def runs_in_process(name: str) -> bool:
    """Does lane ``name`` run its engine in this process (its class an ``InProcessProvider``)?"""
    return _in_process(_factory(name))


def _in_process(factory: Callable[..., Provider]) -> bool:
    return isinstance(factory, type) and issubclass(factory, InProcessProvider)


def _load(spec: str) -> Callable[..., Provider]:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def _factory(name: str) -> Callable[..., Provider]:
    if name in _registered:
        return _registered[name]
    if name in _BUILTIN:
        return _load(_BUILTIN[name])
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            factory: Callable[..., Provider] = ep.load()
            return factory
    raise ValueError(f"unknown provider {name!r}; available: {', '.join(available_providers())}")


def create_llm(
    provider: str,
    model: str | None = None,
    *,
    base_url: str | list[str] | None = None,
    api_key: str | None = None,
    timeout: Timeout | float | None = None,
    max_retries: int = 2,
    **options: Any,
) -> LLM:
    """Create an :class:`LLM` for ``provider`` (e.g. ``"llamacpp"``, ``"ollama"``, ``"mlx"``).

    ``base_url`` may be a list: the same model on several replicas, as one :class:`Fleet`
    (``policy=``, ``hedge_after=``, ``max_attempts=``, ``weights=`` and the health options go to
    the fleet, the rest to every member). ``max_image_bytes`` / ``max_images`` set the call's
    :class:`~abstract_client.images.ImageLimits`."""
    factory = _factory(provider)
    if isinstance(base_url, str) and not base_url.strip():  # it would silently become the lane's default
        raise ValueError("base_url is empty: pass the server's URL, or leave it out for the lane's default")
    coerced = Timeout.coerce(timeout)
    limits: dict[str, Any] = {k: options.pop(k) for k in ("max_image_bytes", "max_images") if k in options}
    image_limits = _image_limits(limits)  # a wrong limit fails before a provider is built
    if _in_process(factory):
        # an engine in this process has no server: a server's options are a mistake, said now
        given = [name for name, value in (("base_url", base_url), ("api_key", api_key)) if value is not None]
        given += [name for name in NETWORK_SETTINGS if name in options]
        if given:
            raise TypeError(f"the {provider} lane runs in this process: {' and '.join(given)} do not apply to it")
        return LLM(factory(model=model, **options), timeout=coerced, max_retries=max_retries, image_limits=image_limits)
    if isinstance(base_url, (list, tuple)):
        from .fleet import Fleet

        fleet_options = {k: options.pop(k) for k in list(options) if k in _FLEET_OPTIONS}
        members = [
            create_llm(
                provider, model, base_url=url, api_key=api_key, timeout=timeout, max_retries=0, **limits, **options
            )
            for url in base_url
        ]
        fleet = Fleet(members, timeout=coerced, **fleet_options)
        fleet.image_limits = image_limits
        return fleet
    _check_options(provider, factory, options)
    instance = factory(model=model, base_url=base_url, api_key=api_key, connect_timeout=coerced.connect, **options)
    return LLM(instance, timeout=coerced, max_retries=max_retries, image_limits=image_limits)


def _image_limits(given: dict[str, Any]) -> ImageLimits:
    return ImageLimits(
        max_bytes=given.get("max_image_bytes", DEFAULT_MAX_IMAGE_BYTES),
        max_images=given.get("max_images", DEFAULT_MAX_IMAGES),
    )
