"""ollama-python, on Ollama's own ``/api/chat``. Its own ways to stop: ``break`` out of a
stream; ``task.cancel()`` on the ``AsyncClient`` in an asyncio app; none for a non-streamed
call made from a thread."""

from __future__ import annotations

import threading
from typing import Any

import ollama

from ..kit import Call, Press, Trial, breaking, in_asyncio, no_way_to_stop, under_stop_on

PACKAGES = ("ollama",)
SERVERS = ("ollama",)


def _kw(t: Trial) -> dict[str, Any]:
    return {"model": t.model, "messages": t.messages, "options": {"num_predict": t.max_tokens, **t.extra}}


def ask(client: Any, t: Trial, p: Press, stop: threading.Event | None = None) -> str:
    if not t.stream:
        return str(client.chat(**_kw(t)).message.content)
    for part in client.chat(**_kw(t), stream=True):
        if stop is not None and stop.is_set():
            break
        p.text.append(part.message.content or "")
    return "".join(p.text)


async def aask(client: Any, t: Trial, p: Press) -> str:
    if not t.stream:
        return str((await client.chat(**_kw(t))).message.content)
    async for part in await client.chat(**_kw(t), stream=True):
        p.text.append(part.message.content or "")
    return "".join(p.text)


def own(t: Trial) -> Call:
    if t.style == "task":
        return in_asyncio(lambda p: aask(ollama.AsyncClient(host=t.url), t, p))
    client = ollama.Client(host=t.url)
    if t.stream:
        return breaking(lambda p, stop: ask(client, t, p, stop))
    return no_way_to_stop(lambda p: ask(client, t, p))


def library(t: Trial) -> Call:
    from abstract_client import sdk

    if t.style == "task":
        return in_asyncio(
            lambda p: aask(ollama.AsyncClient(host=t.url, transport=sdk.async_transport(flavor="httpx")), t, p)
        )
    client = ollama.Client(host=t.url, transport=sdk.transport(flavor="httpx"))
    return under_stop_on(lambda p: ask(client, t, p))
