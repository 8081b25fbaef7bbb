"""openai-python. Its own ways to stop: ``stream.close()`` on a stream (the Stop button's
thread calls it); ``task.cancel()`` in an asyncio app. A non-streamed call made from a thread
has none (closing the client does not end a request in flight)."""

from __future__ import annotations

from typing import Any

import openai

from ..kit import Call, Closer, Press, Trial, closing, in_asyncio, no_way_to_stop, under_stop_on

PACKAGES = ("openai",)
SERVERS = ("llamacpp", "vllm", "lmstudio", "openai-compatible")


def _kw(t: Trial) -> dict[str, Any]:
    return {"model": t.model, "messages": t.messages, "max_tokens": t.max_tokens, "extra_body": t.extra}


def ask(client: Any, t: Trial, p: Press, closer: Closer | None = None) -> str:
    if not t.stream:
        return str(client.chat.completions.create(**_kw(t)).choices[0].message.content)
    stream = client.chat.completions.create(**_kw(t), stream=True)
    with closer.hold(stream) if closer else stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                p.text.append(chunk.choices[0].delta.content)
    return "".join(p.text)


async def aask(client: Any, t: Trial, p: Press) -> str:
    if not t.stream:
        return str((await client.chat.completions.create(**_kw(t))).choices[0].message.content)
    async for chunk in await client.chat.completions.create(**_kw(t), stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            p.text.append(chunk.choices[0].delta.content)
    return "".join(p.text)


def own(t: Trial) -> Call:
    if t.style == "task":
        return in_asyncio(lambda p: aask(openai.AsyncOpenAI(base_url=t.v1, api_key=t.api_key), t, p))
    client = openai.OpenAI(base_url=t.v1, api_key=t.api_key)
    if t.stream:
        return closing(lambda p, closer: ask(client, t, p, closer))
    return no_way_to_stop(lambda p: ask(client, t, p))


def library(t: Trial) -> Call:
    from abstract_client import sdk

    if t.style == "task":
        return in_asyncio(
            lambda p: aask(
                openai.AsyncOpenAI(base_url=t.v1, api_key=t.api_key, http_client=sdk.async_http_client()), t, p
            )
        )
    client = openai.OpenAI(base_url=t.v1, api_key=t.api_key, http_client=sdk.http_client())
    return under_stop_on(lambda p: ask(client, t, p))
