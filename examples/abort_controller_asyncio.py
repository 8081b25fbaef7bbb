"""AbortController in asyncio: one controller stops a stream, a deadline stops another.

python examples/abort_controller_asyncio.py
"""

from __future__ import annotations

import asyncio

from abstract_client import AbortController, AbortSignal, GenerationCancelledError, create_llm
from abstract_client.testing import FakeOpenAIServer


async def main() -> None:
    with FakeOpenAIServer(token_delay=0.02) as server:
        async with create_llm("openai-compatible", "fake-model", base_url=server.base_url) as llm:
            controller = AbortController()
            asyncio.get_running_loop().call_later(0.3, controller.abort)
            try:
                async with llm.astream("Tell me a story.", max_tokens=1000, signal=controller.signal) as stream:
                    async for chunk in stream:
                        print(chunk.delta, end="", flush=True)
            except GenerationCancelledError as err:
                print(f"\n-> stopped ({err.reason}) after {err.generated_tokens} tokens")

            # Any of several signals: the user's button or a 0.2 s deadline.
            button = AbortController()
            signal = AbortSignal.any([button.signal, AbortSignal.timeout(0.2)])
            try:
                await llm.agenerate("Another long one.", max_tokens=1000, signal=signal)
            except GenerationCancelledError as err:
                print(f"-> stopped ({err.reason}) by the deadline")

            # Cancelling the task works too, and re-raises asyncio's own CancelledError.
            task = asyncio.create_task(llm.agenerate("x", max_tokens=1000))
            await asyncio.sleep(0.1)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                print("-> task cancelled; the server saw the connection close")


if __name__ == "__main__":
    asyncio.run(main())
