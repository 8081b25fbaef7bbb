"""LangChain's ``ChatOpenAI`` (langchain-openai). Its own ways to stop: ``break`` out of
``chat.stream(...)``; ``task.cancel()`` on ``ainvoke``/``astream`` in an asyncio app; none for
``invoke`` made from a thread."""

from __future__ import annotations

import threading
from typing import Any

from langchain_openai import ChatOpenAI

from ..kit import Call, Press, Trial, breaking, in_asyncio, no_way_to_stop, under_stop_on

PACKAGES = ("langchain-openai", "langchain-core")
SERVERS = ("llamacpp", "vllm")


def chat(t: Trial, **clients: Any) -> ChatOpenAI:
    settings: dict[str, Any] = {"model": t.model, "base_url": t.v1, "api_key": "none", "max_tokens": t.max_tokens}
    # it sends max_tokens as max_completion_tokens; the LM Studio fake reads max_tokens only
    return ChatOpenAI(**settings, extra_body={"max_tokens": t.max_tokens, **t.extra}, **clients)


def ask(model: ChatOpenAI, t: Trial, p: Press, stop: threading.Event | None = None) -> str:
    if not t.stream:
        return str(model.invoke(t.prompt).content)
    for chunk in model.stream(t.prompt):
        if stop is not None and stop.is_set():
            break
        p.text.append(str(chunk.content))
    return "".join(p.text)


async def aask(model: ChatOpenAI, t: Trial, p: Press) -> str:
    if not t.stream:
        return str((await model.ainvoke(t.prompt)).content)
    async for chunk in model.astream(t.prompt):
        p.text.append(str(chunk.content))
    return "".join(p.text)


def own(t: Trial) -> Call:
    if t.style == "task":
        return in_asyncio(lambda p: aask(chat(t), t, p))
    model = chat(t)
    if t.stream:
        return breaking(lambda p, stop: ask(model, t, p, stop))
    return no_way_to_stop(lambda p: ask(model, t, p))


def library(t: Trial) -> Call:
    from abstract_client import sdk

    if t.style == "task":
        return in_asyncio(lambda p: aask(chat(t, http_async_client=sdk.async_http_client()), t, p))
    model = chat(t, http_client=sdk.http_client(), http_async_client=sdk.async_http_client())
    return under_stop_on(lambda p: ask(model, t, p))
