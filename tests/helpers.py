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
