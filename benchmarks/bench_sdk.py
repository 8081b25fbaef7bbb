"""The SDKs on abstract_client.sdk's transport, beside the same SDK on its default one (#61).

A fake server in its own process (10 ms a token, 300-token answers; its clock is the system's
monotonic one, so its disconnect time compares with ours), the SDK here:

* per SDK and mode, over ``-n`` stops pressed from another thread 0.3 s into the answer: stop →
  the caller released (its call raises), and stop → the server saw the connection close. The
  default transport's row uses what its user can do (``stream.close()`` from another thread;
  not streamed: ``client.close()``, which releases nobody until the answer ends);
* the transport's cost: a one-token request (p50/p99 ms), and a pre-rendered 2,000-chunk stream
  read to the end through openai-python (ms per stream, µs per chunk).

    python benchmarks/bench_sdk.py [-n 50]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anthropic
import ollama
import openai
from _tables import pct, print_table

from abstract_client import GenerationCancelledError, sdk
from abstract_client.testing import SubprocessFake

CHAT = [{"role": "user", "content": "Tell me a long story"}]
PRESS_AFTER = 0.3


def one_stop(fake: SubprocessFake, run: Callable[[threading.Event], None]) -> tuple[float, float]:
    """(stop → released ms, stop → server disconnect ms) for one call stopped from a thread."""
    stop = threading.Event()
    pressed: list[float] = []

    def press() -> None:
        time.sleep(PRESS_AFTER)
        pressed.append(time.perf_counter())
        stop.set()

    threading.Thread(target=press, daemon=True).start()
    try:
        run(stop)
    except Exception:  # the stop's error: ours, or the SDK's word for a closed connection
        pass
    released = time.perf_counter()
    at = pressed[0]
    try:
        gone = (fake.wait_for_disconnect(-1, 10) - at) * 1000
    except TimeoutError:  # the answer ran to its end: the server never saw the stop
        gone = float("nan")
    return (released - at) * 1000, gone


def stop_row(fake: SubprocessFake, label: str, n: int, run: Callable[[threading.Event], None]) -> dict[str, Any]:
    released, gone = [], []
    one_stop(fake, run)  # untimed: an SDK builds its models on its first call, in the caller's thread
    for _ in range(n):
        r, g = one_stop(fake, run)
        released.append(r)
        gone.append(g)
    return {
        "SDK, mode, transport": label,
        "n": n,
        "released p50 ms": f"{pct(released, 50):.1f}",
        "released p99 ms": f"{pct(released, 99):.1f}",
        "server saw it p50 ms": _ms(gone, 50),
        "server saw it p99 ms": _ms(gone, 99),
    }


def _ms(values: list[float], q: float) -> str:
    found = pct(values, q)
    return "never" if found != found else f"{found:.1f}"


def ours(stop: threading.Event, call: Callable[[], Any]) -> None:
    try:
        with sdk.stop_on(stop):
            call()
    except GenerationCancelledError:
        pass


def closing(stop: threading.Event, target: Callable[[], Any]) -> None:
    """The default transport: a thread that waits for the stop, then closes ``target()``."""

    def close_on_stop() -> None:
        stop.wait()
        target().close()

    threading.Thread(target=close_on_stop, daemon=True).start()


def stop_rows(fake: SubprocessFake, ollama_fake: SubprocessFake, n: int) -> list[dict[str, Any]]:
    base = fake.base_url
    mine = openai.OpenAI(base_url=base, api_key="k", http_client=sdk.http_client())
    plain = openai.OpenAI(base_url=base, api_key="k", max_retries=0)
    a_mine = anthropic.Anthropic(base_url=fake.url, api_key="k", http_client=sdk.http_client())
    a_plain = anthropic.Anthropic(base_url=fake.url, api_key="k", max_retries=0)
    o_mine = ollama.Client(host=ollama_fake.url, transport=sdk.transport(flavor="httpx"))

    def create(client: openai.OpenAI, **kw: Any) -> Any:
        return client.chat.completions.create(model="fake-model", messages=CHAT, **kw)  # type: ignore[arg-type]

    def drain(stream: Any) -> None:
        for _ in stream:
            pass

    def plain_stream(stop: threading.Event) -> None:
        stream = create(plain, stream=True)
        closing(stop, lambda: stream)
        drain(stream)

    def plain_not_streamed(stop: threading.Event) -> None:
        client = openai.OpenAI(base_url=base, api_key="k", max_retries=0)
        closing(stop, lambda: client)
        create(client)

    def a_plain_stream(stop: threading.Event) -> None:
        with a_plain.messages.stream(model="fake-model", max_tokens=300, messages=CHAT) as stream:  # type: ignore[arg-type]
            closing(stop, lambda: stream)
            drain(stream.text_stream)

    def a_stream(stop: threading.Event) -> None:
        def call() -> None:
            with a_mine.messages.stream(model="fake-model", max_tokens=300, messages=CHAT) as stream:  # type: ignore[arg-type]
                drain(stream.text_stream)

        ours(stop, call)

    few = max(3, n // 10)  # the default's non-streamed row waits out each whole answer
    rows = [
        stop_row(fake, "openai chat, not streamed, sdk.http_client()", n, lambda s: ours(s, lambda: create(mine))),
        stop_row(fake, "openai chat, not streamed, default: client.close()", few, plain_not_streamed),
        stop_row(
            fake,
            "openai chat, streamed, sdk.http_client()",
            n,
            lambda s: ours(s, lambda: drain(create(mine, stream=True))),
        ),
        stop_row(fake, "openai chat, streamed, default: stream.close()", n, plain_stream),
        stop_row(
            fake,
            "openai Responses, streamed, sdk.http_client()",
            n,
            lambda s: ours(s, lambda: drain(mine.responses.create(model="fake-model", input="Tell me", stream=True))),
        ),
        stop_row(
            fake,
            "anthropic messages.create, sdk.http_client()",
            n,
            lambda s: ours(s, lambda: a_mine.messages.create(model="fake-model", max_tokens=300, messages=CHAT)),  # type: ignore[arg-type]
        ),
        stop_row(fake, "anthropic messages.stream, sdk.http_client()", n, a_stream),
        stop_row(fake, "anthropic messages.stream, default: stream.close()", n, a_plain_stream),
        stop_row(
            ollama_fake,
            "ollama chat, streamed, sdk.transport(flavor='httpx')",
            n,
            lambda s: ours(s, lambda: drain(o_mine.chat(model="fake-model", messages=CHAT, stream=True))),
        ),
    ]
    for client in (mine, plain, a_mine, a_plain):
        client.close()
    return rows


def cost_rows(fake: SubprocessFake, n: int) -> list[dict[str, Any]]:
    """The clients alternated request by request (a machine's drift falls on all of them): a
    1-token call (ours carries it over the stream and folds it back, unless told not to) and a
    pre-rendered 2,000-chunk stream read to the end."""
    fake.set(token_delay=0.0)
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "_prerendered.py"), "2000"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    prerendered = proc.stdout.readline().strip()
    clients = {
        "default transport (the floor)": {},
        "sdk.http_client()": {"http_client": sdk.http_client()},
        "sdk.http_client(carry_plain_calls=False)": {"http_client": sdk.http_client(carry_plain_calls=False)},
    }
    made = {
        label: (
            openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0, **kw),
            openai.OpenAI(base_url=prerendered, api_key="k", max_retries=0, **kw),
        )
        for label, kw in clients.items()
    }
    request_ms: dict[str, list[float]] = {label: [] for label in made}
    stream_ms: dict[str, list[float]] = {label: [] for label in made}
    try:
        with sdk.stop_on(threading.Event()):  # inside a block, as a user's calls are
            for i in range(n * 6 + 20):
                for label, (small, _) in made.items():
                    t0 = time.perf_counter()
                    small.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=1)  # type: ignore[arg-type]
                    if i >= 20:
                        request_ms[label].append((time.perf_counter() - t0) * 1000)
            for i in range(n + 3):
                for label, (_, big) in made.items():
                    t0 = time.perf_counter()
                    for _ in big.chat.completions.create(model="fake-model", messages=CHAT, stream=True):  # type: ignore[arg-type]
                        pass
                    if i >= 3:
                        stream_ms[label].append((time.perf_counter() - t0) * 1000)
    finally:
        for small, big in made.values():
            small.close()
            big.close()
        proc.terminate()
        proc.wait(10)
    return [
        {
            "openai-python on": label,
            "1-token call p50 ms": f"{pct(request_ms[label], 50):.3f}",
            "p99 ms": f"{pct(request_ms[label], 99):.3f}",
            "2,000-chunk stream p50 ms": f"{pct(stream_ms[label], 50):.1f}",
            "chunks/s": f"{2000 / pct(stream_ms[label], 50) * 1000:,.0f}",
        }
        for label in made
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=50)
    args = parser.parse_args()
    knobs = {"token_delay": 0.01, "default_max_tokens": 300}
    with SubprocessFake("openai", **knobs) as fake, SubprocessFake("ollama", **knobs) as ollama_fake:
        rows = stop_rows(fake, ollama_fake, args.n)
        print_table("Stop → released and stop → the server saw the connection close", rows)
        print_table("The transport's cost (floor: the SDK's default transport)", cost_rows(fake, args.n))


if __name__ == "__main__":
    main()
