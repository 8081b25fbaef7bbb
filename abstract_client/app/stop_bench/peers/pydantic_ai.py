"""pydantic-ai. Its own way to stop, from a thread or in an asyncio app alike: a
``CancellationToken`` given to the run, ``token.cancel()`` pressed from the Stop thread."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic_ai import Agent, CancellationToken
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from ..kit import Call, Press, Trial, in_asyncio, under_stop_on

PACKAGES = ("pydantic-ai-slim",)
SERVERS = ("llamacpp",)


def agent(t: Trial, http_client: Any = None) -> Agent[None, str]:
    provider = OpenAIProvider(base_url=t.v1, api_key="none", http_client=http_client)
    return Agent(OpenAIChatModel(t.model, provider=provider))


def settings_of(t: Trial) -> Any:
    # it sends max_tokens as max_completion_tokens; the LM Studio fake reads max_tokens only
    return {"max_tokens": t.max_tokens, "extra_body": {"max_tokens": t.max_tokens, **t.extra}}


def ask(a: Agent[None, str], t: Trial, p: Press, token: CancellationToken | None = None) -> str:
    settings = settings_of(t)
    if not t.stream:
        return a.run_sync(t.prompt, model_settings=settings, cancellation_token=token).output
    result = a.run_stream_sync(t.prompt, model_settings=settings, cancellation_token=token)
    for delta in result.stream_text(delta=True):
        p.text.append(delta)
    return "".join(p.text)


async def aask(a: Agent[None, str], t: Trial, p: Press, token: CancellationToken | None = None) -> str:
    settings = settings_of(t)
    if not t.stream:
        return (await a.run(t.prompt, model_settings=settings, cancellation_token=token)).output
    async with a.run_stream(t.prompt, model_settings=settings, cancellation_token=token) as result:
        async for delta in result.stream_text(delta=True):
            p.text.append(delta)
    return "".join(p.text)


def own(t: Trial) -> Call:
    a = agent(t)

    def call(p: Press) -> str:
        token = CancellationToken()
        p.arm("CancellationToken.cancel()", token.cancel)
        if t.style == "task":
            return asyncio.run(aask(agent(t), t, p, token))
        return ask(a, t, p, token)

    return call


def library(t: Trial) -> Call:
    from abstract_client import sdk

    if t.style == "task":
        return in_asyncio(lambda p: aask(agent(t, sdk.async_http_client()), t, p))
    a = agent(t, sdk.async_http_client())  # pydantic-ai's runs are async, run_sync too
    return under_stop_on(lambda p: ask(a, t, p))
