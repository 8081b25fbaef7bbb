"""Stream an answer, then start a long one and stop it: against the bundled fake server.

    python examples/quickstart.py

Shows the promise in one screen: the stop raises GenerationCancelledError with the partial
text, and the server itself records when it saw the connection close.
"""

from __future__ import annotations

import threading
import time

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.testing import FakeOpenAIServer


def main() -> None:
    with FakeOpenAIServer(answer="The capital of France is Paris.", token_delay=0.03) as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url)

        print("Q: What is the capital of France?\nA: ", end="", flush=True)
        for chunk in llm.stream("What is the capital of France?"):
            print(chunk.delta, end="", flush=True)
        print()

        server.behavior.answer = None  # now an endless answer
        stop = threading.Event()
        print("\nA long answer, stopped after 0.5 s:\n", end="", flush=True)
        threading.Timer(0.5, stop.set).start()
        try:
            for chunk in llm.stream("Tell me everything.", max_tokens=100_000, cancel_event=stop):
                print(chunk.delta, end="", flush=True)
        except GenerationCancelledError as err:
            stopped_at = time.perf_counter()
            record = server.last
            seen = server.wait_for_disconnect(record)
            print(
                f"\n\nstopped: reason={err.reason}, {err.generated_tokens} tokens kept, "
                f"stop→raise {err.cancel_to_stop_ms:.2f} ms; the server saw the disconnect "
                f"{(seen - stopped_at) * 1000:+.2f} ms from the raise and sent "
                f"{record.tokens_sent_after(seen)} tokens after it"
            )
        llm.close()


if __name__ == "__main__":
    main()
