"""Small helpers shared by tests."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any


def set_later(fn: Callable[[], object], delay: float) -> threading.Thread:
    """Call ``fn`` from another thread after ``delay`` seconds (a host's Stop button)."""

    def run() -> None:
        time.sleep(delay)
        fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def stream_in_threads(
    llm: Any, n: int, prompt: str = "x", **kwargs: Any
) -> tuple[list[threading.Thread], list[BaseException]]:
    """Start ``n`` threads that each consume ``llm.stream(prompt, **kwargs)`` to the end; every
    exception they end with is collected (in order of arrival) in the returned list."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in llm.stream(prompt, **kwargs):
                pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, errors


def launch_llama_server(tmp_path_factory: Any, name: str, **launch: Any) -> Any:
    """A real llama-server on SmolLM2 (``LlamaServer.launch`` options), or a FAILED test with
    the reason when the binary or the model is missing."""
    import pytest

    from abstract_client.testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        pytest.fail(
            "llama-server or the SmolLM2 GGUF is missing: run scripts/get_llama_server.sh and "
            "scripts/get_model.py (.ci/run does)"
        )
    return LlamaServer.launch(binary, model, log_path=tmp_path_factory.mktemp(name) / "server.log", **launch)


# A tool every real-engine test can force (a short string argument: quick on a 135M model).
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
