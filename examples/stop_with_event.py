"""A UI thread owns a Stop button (a threading.Event); a worker thread streams the answer.

    python examples/stop_with_event.py [--base-url URL --provider NAME --model M]

Without arguments it runs against the bundled fake server.
"""

from __future__ import annotations

import argparse
import threading
import time

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.testing import FakeOpenAIServer


def worker(llm, stop: threading.Event, out: list[str]) -> None:  # type: ignore[no-untyped-def]
    try:
        for chunk in llm.stream("Write a long story.", max_tokens=2000, cancel_event=stop):
            out.append(chunk.delta)
        print("finished:", "".join(out))
    except GenerationCancelledError as err:
        print(f"stopped by the UI after {err.generated_tokens} tokens: {err.partial_text[:60]!r}...")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", default="openai-compatible")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--base-url")
    args = parser.parse_args()
    fake = None if args.base_url else FakeOpenAIServer(token_delay=0.02).start()
    llm = create_llm(args.provider, args.model, base_url=args.base_url or fake.base_url)  # type: ignore[union-attr]
    stop = threading.Event()
    out: list[str] = []
    thread = threading.Thread(target=worker, args=(llm, stop, out))
    thread.start()
    time.sleep(0.5)
    stop.set()  # the user pressed Stop
    thread.join()
    llm.close()
    if fake:
        fake.stop()


if __name__ == "__main__":
    main()
