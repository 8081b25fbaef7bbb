"""LlamaIndex's ``OpenAILike`` (it pins openai-python 2.x: a venv of its own, an httpx
client). Its own ways to stop: ``break`` out of ``stream_complete``; ``task.cancel()`` on
``acomplete``/``astream_complete`` in an asyncio app; none for ``complete`` made from a thread."""

from __future__ import annotations

import threading
from typing import Any

from llama_index.llms.openai_like import OpenAILike

from ..kit import Call, Press, Trial, breaking, in_asyncio, no_way_to_stop, under_stop_on

PACKAGES = ("llama-index-llms-openai-like", "llama-index-core", "openai")
SERVERS = ("llamacpp",)


def llm(t: Trial, **clients: Any) -> OpenAILike:
    return OpenAILike(
        model=t.model,
        api_base=t.v1,
        api_key="none",
        is_chat_model=True,
        max_tokens=t.max_tokens,
        additional_kwargs={"extra_body": t.extra},
        **clients,
    )


def ask(model: OpenAILike, t: Trial, p: Press, stop: threading.Event | None = None) -> str:
    if not t.stream:
        return str(model.complete(t.prompt).text)
    for chunk in model.stream_complete(t.prompt):
        if stop is not None and stop.is_set():
            break
        p.text.append(chunk.delta or "")
    return "".join(p.text)


async def aask(model: OpenAILike, t: Trial, p: Press) -> str:
    if not t.stream:
        return str((await model.acomplete(t.prompt)).text)
    async for chunk in await model.astream_complete(t.prompt):
        p.text.append(chunk.delta or "")
    return "".join(p.text)


def own(t: Trial) -> Call:
    if t.style == "task":
        return in_asyncio(lambda p: aask(llm(t), t, p))
    model = llm(t)
    if t.stream:
        return breaking(lambda p, stop: ask(model, t, p, stop))
    return no_way_to_stop(lambda p: ask(model, t, p))


def library(t: Trial) -> Call:
    from abstract_client import sdk

    if t.style == "task":
        return in_asyncio(lambda p: aask(llm(t, async_http_client=sdk.async_http_client(flavor="httpx")), t, p))
    model = llm(t, http_client=sdk.http_client(flavor="httpx"))
    return under_stop_on(lambda p: ask(model, t, p))
