"""AbstractCore, the seed system. Its own way to stop, from a thread or in an asyncio app
alike: a ``cancel_event`` (a ``threading.Event``) given to ``generate``/``agenerate``, set from
the Stop thread. It takes no HTTP client: no row with this library under it."""

from __future__ import annotations

import asyncio
from typing import Any

from abstractcore import create_llm

from ..kit import Call, Press, Trial

PACKAGES = ("abstractcore",)
SERVERS = ("llamacpp", "ollama", "lmstudio")
PROVIDERS = {"llamacpp": ("openai-compatible", "/v1"), "ollama": ("ollama", ""), "lmstudio": ("lmstudio", "/v1")}


def own(t: Trial) -> Call:
    provider, suffix = PROVIDERS[t.server]
    llm: Any = create_llm(provider, model=t.model, base_url=t.url + suffix, api_key="none")

    async def aask(p: Press, kw: dict[str, Any]) -> str:
        if not t.stream:
            return str((await llm.agenerate(t.prompt, **kw)).content)
        async for chunk in await llm.agenerate(t.prompt, **kw):
            p.text.append(chunk.content or "")
        return "".join(p.text)

    def call(p: Press) -> str:
        stop = p.flag("cancel_event.set()")
        kw = {"max_output_tokens": t.max_tokens, "stream": t.stream, "cancel_event": stop, **t.extra}
        if t.style == "task":
            return asyncio.run(aask(p, kw))
        if not t.stream:
            return str(llm.generate(t.prompt, **kw).content)
        for chunk in llm.generate(t.prompt, **kw):
            p.text.append(chunk.content or "")
        return "".join(p.text)

    return call
