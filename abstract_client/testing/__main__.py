"""Run a fake server in its own process: ``python -m abstract_client.testing --kind ollama``.

Prints its base URL on the first line of stdout, then serves until killed. Control it over HTTP:
``GET /_fake/records``, ``POST /_fake/behavior``, ``POST /_fake/inject`` (see ``SubprocessFake``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .lmstudio import FakeLMStudioServer
from .ollama import FakeOllamaServer
from .openai import FakeOpenAIServer

KINDS = {"openai": FakeOpenAIServer, "ollama": FakeOllamaServer, "lmstudio": FakeLMStudioServer}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m abstract_client.testing", description=__doc__)
    parser.add_argument("--kind", choices=sorted(KINDS), default="openai")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-delay", type=float, default=0.005)
    parser.add_argument("--prefill-delay", type=float, default=0.0)
    parser.add_argument("--answer", default=None)
    args = parser.parse_args(argv)
    server = KINDS[args.kind](
        host=args.host,
        port=args.port,
        token_delay=args.token_delay,
        prefill_delay=args.prefill_delay,
        answer=args.answer,
    ).start()
    print(server.base_url, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(0.2):  # a short wait: the handler runs promptly whatever the threads do
            pass
    except KeyboardInterrupt:
        pass
    server.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
