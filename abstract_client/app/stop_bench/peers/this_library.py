"""This library's own lanes (``create_llm``): ``cancel_event=`` set from the Stop thread;
``task.cancel()`` in an asyncio app."""

from __future__ import annotations

from abstract_client import create_llm

from ..kit import Call, Press, Trial, in_asyncio

PACKAGES = ("abstract-client",)
SERVERS = ("llamacpp", "vllm", "ollama", "lmstudio", "openai-compatible")


def own(t: Trial) -> Call:
    kw = {"max_tokens": t.max_tokens, **t.extra}
    base_url = t.v1 if t.server == "openai-compatible" else t.url  # a gateway: its /v1
    if t.style == "task":

        async def run(p: Press) -> str:
            async with create_llm(t.server, t.model, base_url=base_url, api_key=t.api_key) as llm:
                if not t.stream:
                    return (await llm.agenerate(t.prompt, **kw)).content
                async for chunk in llm.astream(t.prompt, **kw):
                    p.text.append(chunk.delta)
                return "".join(p.text)

        return in_asyncio(run)
    llm = create_llm(t.server, t.model, base_url=base_url, api_key=t.api_key)

    def call(p: Press) -> str:
        stop = p.flag("cancel_event.set()")
        if not t.stream:
            return llm.generate(t.prompt, cancel_event=stop, **kw).content
        for chunk in llm.stream(t.prompt, cancel_event=stop, **kw):
            p.text.append(chunk.delta)
        return "".join(p.text)

    return call
