"""Small helpers shared by tests."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


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
