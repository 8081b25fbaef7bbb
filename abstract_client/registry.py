"""``create_llm`` and the provider registry.

Built-in lanes are registered by name; third parties add theirs through the entry point group
``abstract_client.providers`` (``name = "package.module:ProviderClass"``) or
:func:`register_provider`.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from .images import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGES, ImageLimits
from .llm import LLM
from .provider import Provider
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
}
_registered: dict[str, Callable[..., Provider]] = {}
_FLEET_OPTIONS = (
    "policy",
    "hedge_after",
    "max_attempts",
    "weights",
    "failure_threshold",
    "failure_window",
    "cooldown",
    "max_cooldown",
    "probe_timeout",
)


# HTTP client settings (httpx's names): never a request body's fields. Until the network settings
# land, naming one is a TypeError — a proxy password or an SSL context must not reach a server.
_CLIENT_SETTINGS = frozenset(
    {
        "auth",
        "cert",
        "cookies",
        "event_hooks",
        "follow_redirects",
        "http1",
        "http2",
        "http_client",
        "limits",
        "mounts",
        "proxies",
        "proxy",
        "ssl_context",
        "transport",
        "trust_env",
        "verify",
    }
)


def _refuse_client_settings(provider: str, options: dict[str, Any]) -> None:
    given = sorted(_CLIENT_SETTINGS.intersection(options))
    if given:
        names = ", ".join(f"{n}=" for n in given)
        raise TypeError(
            f"create_llm({provider!r}): {names} is an HTTP client setting, not a request field; "
            "abstract-client does not take it, and never sends it to the server"
        )
    try:
        json.dumps(options, allow_nan=False)
    except (TypeError, ValueError) as exc:  # an object or a NaN: it could only fail at the first call
        raise TypeError(f"create_llm({provider!r}): the extra request fields must be JSON: {exc}") from None


def register_provider(name: str, factory: Callable[..., Provider]) -> None:
    """Register a provider class (or factory) under ``name``."""
    _registered[name] = factory


def available_providers() -> list[str]:
    """The lane names ``create_llm`` accepts: built in, registered, and from entry points."""
    names = set(_BUILTIN) | set(_registered)
    names |= {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def runs_in_process(name: str) -> bool:
    """Does lane ``name`` run its engine in this process (a provider class's ``in_process``)?"""
    return bool(getattr(_factory(name), "in_process", False))


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
    coerced = Timeout.coerce(timeout)
    limits: dict[str, Any] = {k: options.pop(k) for k in ("max_image_bytes", "max_images") if k in options}
    image_limits = _image_limits(limits)  # a wrong limit fails before a provider is built
    if getattr(factory, "in_process", False):
        # an engine in this process has no server: a server's options are a mistake, said now
        given = [name for name, value in (("base_url", base_url), ("api_key", api_key)) if value is not None]
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
    _refuse_client_settings(provider, options)
    instance = factory(model=model, base_url=base_url, api_key=api_key, connect_timeout=coerced.connect, **options)
    return LLM(instance, timeout=coerced, max_retries=max_retries, image_limits=image_limits)


def _image_limits(given: dict[str, Any]) -> ImageLimits:
    return ImageLimits(
        max_bytes=given.get("max_image_bytes", DEFAULT_MAX_IMAGE_BYTES),
        max_images=given.get("max_images", DEFAULT_MAX_IMAGES),
    )
