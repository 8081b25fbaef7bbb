"""Running ``abstract-client serve`` in tests: as a child process (its own fds and threads, its
own log) or in this process on a thread (so a test can read an in-process engine's evidence,
e.g. the MLX lane's token counter, through ``.gateway``)."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .processes import ServerProcess, free_port

_STOPPED = re.compile(r"stopped (\S+) backend=(\S+) reason=(\S+) stop->engine stopped ([0-9.]+) ms")


class GatewayProcess(ServerProcess):
    """``python -m abstract_client serve ARGS --port P`` with its log in a file."""

    @classmethod
    def launch(cls, args: list[str], *, log_path: Path, ready_timeout: float = 60, env: Any = None) -> GatewayProcess:
        port = free_port()
        argv = [sys.executable, "-m", "abstract_client", "serve", *args, "--port", str(port)]
        server = cls(argv, port, log_path, env=env)
        server.start(ready_timeout)
        return server

    def stops(self) -> list[tuple[str, str, float]]:
        """``(request id, reason, stop→engine stopped ms)`` of every stop the gateway logged."""
        return [(m[0], m[2], float(m[3])) for m in _STOPPED.findall(self.log_text())]

    def wait_for_stop(self, request_id: str | None = None, *, count: int = 1, timeout: float = 15) -> list[Any]:
        """The logged stops once ``count`` of them (or the one of ``request_id``) are there;
        ``AssertionError`` with the log's tail if they are not within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            stops = [s for s in self.stops() if request_id is None or s[0] == request_id]
            if len(stops) >= count:
                return stops
            if time.monotonic() > deadline:
                raise AssertionError(f"no stop {request_id or ''} logged by the gateway:\n{self.log_tail()}")
            time.sleep(0.01)

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(self.get_text("/metrics"), name, **labels)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


class InProcessGateway:
    """The gateway app under uvicorn on a thread of this process."""

    def __init__(self, config: Any) -> None:
        import uvicorn

        from ..gateway.app import create_app
        from ..gateway.server import uvicorn_config

        config.port = config.port if config.port not in (None, 8000) else free_port()
        config.host, config.log_level = "127.0.0.1", "warning"
        self.port = config.port
        self.app: Any = create_app(config)
        self.server = uvicorn.Server(uvicorn_config(self.app, config))
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def gateway(self) -> Any:
        return self.app.state.gateway

    def __enter__(self) -> InProcessGateway:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the in-process gateway did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
