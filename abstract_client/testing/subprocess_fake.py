"""A fake server in a child process, driven over its ``/_fake/`` control routes.

Use it when the server must not share the test's interpreter (its GIL): latency benchmarks,
soak runs, thread/fd accounting. Timestamps are ``time.perf_counter()`` values, which on Linux
come from the system-wide monotonic clock, so they compare across processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from typing import Any


class SubprocessFake:
    def __init__(self, kind: str = "openai", **knobs: Any) -> None:
        self.kind = kind
        self._knobs = knobs
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.url = ""

    def start(self) -> SubprocessFake:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "abstract_client.testing", "--kind", self.kind], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url:
            raise RuntimeError("the fake server did not start")
        self.url = self.base_url.removesuffix("/v1")
        if self._knobs:
            self.set(**self._knobs)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def __enter__(self) -> SubprocessFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def set(self, **knobs: Any) -> None:
        self._call("POST", "/_fake/behavior", knobs)

    def inject(self, fault: str, count: int = 1) -> None:
        self._call("POST", "/_fake/inject", {"fault": fault, "count": count})

    def records(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/_fake/records")["records"])

    @property
    def connections(self) -> int:
        return int(self._call("GET", "/_fake/records")["connections"])

    def wait_for_disconnect(self, index: int = -1, timeout: float = 5.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = self.records()
            if records and records[index]["disconnected_at"] is not None:
                return float(records[index]["disconnected_at"])
            time.sleep(0.002)
        raise TimeoutError("the fake server did not see a disconnect")
