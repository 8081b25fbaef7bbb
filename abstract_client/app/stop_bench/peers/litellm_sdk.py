"""The LiteLLM SDK (``litellm.completion``). Its own ways to stop: ``break`` out of a stream
(its documented way: the Stop button sets a flag the loop reads); ``task.cancel()`` on
``acompletion`` in an asyncio app; none for a non-streamed call made from a thread."""

from __future__ import annotations

import threading
from typing import Any

import litellm

from ..kit import Call, Press, Trial, breaking, in_asyncio, no_way_to_stop, under_stop_on

PACKAGES = ("litellm",)
SERVERS = ("llamacpp", "vllm")


def _kw(t: Trial, more: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "openai/" + t.model,
        "api_base": t.v1,
        "api_key": "none",
        "messages": t.messages,
        "max_tokens": t.max_tokens,
        "stream": t.stream,
        "extra_body": t.extra,
        **more,
    }


def ask(t: Trial, p: Press, stop: threading.Event | None = None, **more: Any) -> str:
    response: Any = litellm.completion(**_kw(t, more))
    if not t.stream:
        return str(response.choices[0].message.content)
    for chunk in response:
        if stop is not None and stop.is_set():
            break
        p.text.append(chunk.choices[0].delta.content or "")
    return "".join(p.text)


async def aask(t: Trial, p: Press, **more: Any) -> str:
    response: Any = await litellm.acompletion(**_kw(t, more))
    if not t.stream:
        return str(response.choices[0].message.content)
    async for chunk in response:
        p.text.append(chunk.choices[0].delta.content or "")
    return "".join(p.text)


def own(t: Trial) -> Call:
    if t.style == "task":
        return in_asyncio(lambda p: aask(t, p))
    if t.stream:
        return breaking(lambda p, stop: ask(t, p, stop))
    return no_way_to_stop(lambda p: ask(t, p))


def library(t: Trial) -> Call:
    import openai

    from abstract_client import sdk

    if t.style == "task":
        return in_asyncio(
            lambda p: aask(
                t, p, client=openai.AsyncOpenAI(base_url=t.v1, api_key="none", http_client=sdk.async_http_client())
            )
        )
    client = openai.OpenAI(base_url=t.v1, api_key="none", http_client=sdk.http_client())
    return under_stop_on(lambda p: ask(t, p, client=client))
