"""The anthropic SDK, on a server's Messages route (llama-server's ``/v1/messages``). Its own
ways to stop: ``stream.close()`` on a stream; ``task.cancel()`` in an asyncio app; none for a
non-streamed call made from a thread."""

from __future__ import annotations

from typing import Any

import anthropic

from ..kit import Call, Closer, Press, Trial, closing, in_asyncio, no_way_to_stop, under_stop_on

PACKAGES = ("anthropic",)
SERVERS = ("llamacpp",)


def _kw(t: Trial) -> dict[str, Any]:
    return {"model": t.model, "messages": t.messages, "max_tokens": t.max_tokens, "extra_body": t.extra}


def ask(client: Any, t: Trial, p: Press, closer: Closer | None = None) -> str:
    if not t.stream:
        return "".join(b.text for b in client.messages.create(**_kw(t)).content if b.type == "text")
    stream = client.messages.create(**_kw(t), stream=True)
    with closer.hold(stream) if closer else stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                p.text.append(event.delta.text)
    return "".join(p.text)


async def aask(client: Any, t: Trial, p: Press) -> str:
    if not t.stream:
        return "".join(b.text for b in (await client.messages.create(**_kw(t))).content if b.type == "text")
    async for event in await client.messages.create(**_kw(t), stream=True):
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            p.text.append(event.delta.text)
    return "".join(p.text)


def own(t: Trial) -> Call:
    if t.style == "task":
        return in_asyncio(lambda p: aask(anthropic.AsyncAnthropic(base_url=t.url, api_key="none"), t, p))
    client = anthropic.Anthropic(base_url=t.url, api_key="none")
    if t.stream:
        return closing(lambda p, closer: ask(client, t, p, closer))
    return no_way_to_stop(lambda p: ask(client, t, p))


def library(t: Trial) -> Call:
    from abstract_client import sdk

    if t.style == "task":
        return in_asyncio(
            lambda p: aask(
                anthropic.AsyncAnthropic(base_url=t.url, api_key="none", http_client=sdk.async_http_client()), t, p
            )
        )
    client = anthropic.Anthropic(base_url=t.url, api_key="none", http_client=sdk.http_client())
    return under_stop_on(lambda p: ask(client, t, p))
