"""Real servers as child processes, for tests and benchmarks: start on a free loopback port,
wait until ready, capture the log, read the server's own evidence of a stop, stop cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cache_dir() -> Path:
    return Path(os.environ.get("ABSTRACT_CLIENT_CACHE", Path.home() / ".cache" / "abstract-client"))


class ServerProcess:
    """A child process serving HTTP on 127.0.0.1, its log kept in a file."""

    ready_path = "/health"

    def __init__(self, argv: list[str], port: int, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv, self.port, self.log_path = argv, port, log_path
        self._env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout: float) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, env=self._env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.argv[0]} not ready after {ready_timeout}s; log:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def kill(self) -> None:
        """``kill -9``: the server dies mid-whatever, its connections reset."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as resp:
            return json.loads(resp.read())

    def get_text(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=5) as resp:
            return str(resp.read().decode())


class LlamaServer(ServerProcess):
    """llama.cpp's llama-server, with small batches so prefill is cancellable in small steps."""

    CANCEL = re.compile(r"cancel task, id_task = (\d+)")

    @classmethod
    def launch(
        cls,
        binary: str | Path,
        model: str | Path,
        *,
        log_path: Path,
        ctx: int = 8192,
        batch: int = 64,
        parallel: int = 1,
        threads: int = 2,
        extra: list[str] | None = None,
        ready_timeout: float = 120,
    ) -> LlamaServer:
        port = free_port()
        argv = [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            str(ctx),
            "-b",
            str(batch),
            "-ub",
            str(batch),
            "-t",
            str(threads),
            "-np",
            str(parallel),
            "--metrics",
            *(extra or []),
        ]
        server = cls(argv, port, log_path)
        server.start(ready_timeout)
        return server

    def cancelled_tasks(self) -> list[int]:
        """Task ids of llama-server's ``srv stop: cancel task`` log lines."""
        return [int(m) for m in self.CANCEL.findall(self.log_text())]

    def slots(self) -> list[dict[str, Any]]:
        body = self.get_json("/slots")
        return body if isinstance(body, list) else []

    def wait_idle(self, timeout: float = 2.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if not any(s.get("is_processing") for s in self.slots()):
                    return True
            time.sleep(0.02)
        return False

    def processing_decoded(self) -> int | None:
        """Tokens decoded by the task a slot is processing now: 0 while its prompt is still
        being processed, None when no slot is busy (or /slots did not answer)."""
        try:
            slots = self.slots()
        except (OSError, ValueError):
            return None
        for slot in slots:
            if slot.get("is_processing"):
                return _decoded(slot)
        return None

    def n_decoded(self) -> int:
        return sum(_decoded(slot) for slot in self.slots())


def _decoded(slot: dict[str, Any]) -> int:
    nt = slot.get("next_token")
    items = nt if isinstance(nt, list) else [nt]
    return sum(item["n_decoded"] for item in items if isinstance(item, dict) and isinstance(item.get("n_decoded"), int))


class VLLMServer(ServerProcess):
    """vLLM's OpenAI-compatible server on the CPU, small chunks so prefill aborts in small steps."""

    @classmethod
    def launch(
        cls,
        python: str | Path,
        model_dir: str | Path,
        *,
        log_path: Path,
        served_name: str = "smollm2",
        max_model_len: int = 2048,
        extra: list[str] | None = None,
        ready_timeout: float = 420,
    ) -> VLLMServer:
        port = free_port()
        argv = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            str(max_model_len),
            "--max-num-batched-tokens",
            "64",
            "--max-num-seqs",
            "4",
            "--dtype",
            "bfloat16",
            "--gpu-memory-utilization",
            "0.3",
            *(extra or []),
        ]
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # Responses API background mode (resumable=True on the vllm lane) needs the store
            "VLLM_ENABLE_RESPONSES_API_STORE": "1",
        }
        server = cls(argv, port, log_path, env=env)
        server.start(ready_timeout)
        return server

    def metrics(self) -> dict[str, float]:
        """Prometheus samples from ``/metrics``, summed over labels, by metric name."""
        out: dict[str, float] = {}
        for line in self.get_text("/metrics").splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(value)
        return out

    def running(self) -> float:
        return self.metrics().get("vllm:num_requests_running", 0.0)

    def generation_tokens(self) -> float:
        return self.metrics().get("vllm:generation_tokens_total", 0.0)

    def prompt_tokens(self) -> float:
        return self.metrics().get("vllm:prompt_tokens_total", 0.0)


def vllm_environment() -> tuple[Path, Path] | None:
    """(python, model_dir) prepared by scripts/get_vllm.sh, if present."""
    base = cache_dir()
    pythons = sorted(base.glob("vllm-*/bin/python"))
    model = base / "models" / "SmolLM2-135M-Instruct-hf"
    if not pythons or not (model / ".complete").exists() or not (pythons[-1].parent.parent / ".complete").exists():
        return None
    return pythons[-1], model


def llama_server_binary() -> Path | None:
    env = os.environ.get("LLAMA_SERVER")
    if env and Path(env).is_file():
        return Path(env)
    found = sorted((cache_dir() / "llama-server").glob("*/llama-server"))
    return found[-1] if found else None


def smollm2_gguf() -> Path | None:
    path = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None
