"""The servers a stop is measured on, and each one's own evidence of what it computed.

A ``Watch`` starts before a trial's request is sent and reads the server as the trial runs:
the fakes' request records (each token's time, the disconnect's time), llama-server's
``/slots`` (polled every 5 ms) and its ``cancel task``/``processing task`` log lines, vLLM's
``/metrics`` (polled every 20 ms). ``settle()`` waits for the server to go idle, then says what
it saw after the Stop was pressed.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

GENERATING = ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/api/chat", "/api/generate", "/api/v1/chat")


@dataclass
class Evidence:
    """What the server saw of one trial, after the Stop was pressed at ``pressed``."""

    requests: int  # generation requests it received (a retry counts)
    stopped: bool  # it ended the generation before the answer's end
    ended_at: float | None  # when it stopped, or finished the whole answer
    decoded_after: int | None  # tokens it decoded after the press
    decoded_before: int | None  # tokens it had decoded when Stop was pressed (0: still reading the prompt)
    source: str  # which evidence


def _first(samples: list[tuple[float, Any]], after: float, test: Callable[[Any], bool]) -> float | None:
    return next((t for t, v in samples if t >= after and test(v)), None)


class Server:
    """One server under the bench: where it is, what to ask it, how to read it."""

    name = ""
    lane = ""  # the Trial's ``server``: llamacpp, vllm, ollama, lmstudio
    model = "smollm2"
    extra: ClassVar[dict[str, Any]] = {}
    api_key = "none"
    asked = 0
    prefill_prompt = "Summarise: " + " ".join(f"word{i % 97}" for i in range(200))
    url = ""

    def stage(self, stage: str) -> str:
        """The prompt for a stage: ``decode`` (a short one) or ``prefill`` (a long one). It starts
        with a number of its own, so no server's prompt cache reads it for the trial."""
        self.asked += 1
        nonce = f"Request {self.asked} ({time.time_ns() % 10**9}). "
        return nonce + (self.prefill_prompt if stage == "prefill" else "Write a long story about a dragon.")

    def watch(self) -> Watch:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


DECODED = 16  # a stop "during decode" is pressed once the server has decoded this many tokens
READING = 0.25  # a stop "during prefill": once the server has been reading the prompt this long


class Watch:
    def ready(self, stage: str, began: float) -> bool:
        """Whether the server, by its own evidence, is where the trial means to press Stop."""
        raise NotImplementedError

    def settle(self, pressed: float, timeout: float = 90.0) -> Evidence:
        raise NotImplementedError


def held(samples: list[tuple[float, Any]], test: Callable[[Any], bool], seconds: float) -> bool:
    """The newest samples pass ``test`` without a break for ``seconds`` at least."""
    since = None
    for t, value in reversed(samples):
        if not test(value):
            break
        since = t
    return since is not None and samples[-1][0] - since >= seconds


# -- the fakes --------------------------------------------------------------------------------------


class FakeServer(Server):
    """A bundled fake (Ollama's or LM Studio's wire) in its own process: each request's record
    is the evidence (every token's time, the disconnect's time)."""

    def __init__(self, kind: str, token_delay: float = 0.005) -> None:
        from ...testing.subprocess_fake import SubprocessFake

        self.lane = kind
        self.name = f"{kind} (fake)"
        self.model = "fake-model"
        self.fake = SubprocessFake(kind, token_delay=token_delay).start()
        self.url = self.fake.url

    def stage(self, stage: str) -> str:
        self.fake.set(prefill_delay=1.5 if stage == "prefill" else 0.0)
        return super().stage(stage)

    def watch(self) -> Watch:
        return FakeWatch(self.fake)

    def close(self) -> None:
        self.fake.stop()


class FakeWatch(Watch):
    def __init__(self, fake: Any) -> None:
        self.fake = fake
        self.before = len(fake.records())

    def ready(self, stage: str, began: float) -> bool:
        # a fake keeps its time: 0.3 s in is ~50 tokens (5 ms each), or a third of its 1.5 s prefill
        return time.perf_counter() - began >= 0.3

    def settle(self, pressed: float, timeout: float = 90.0) -> Evidence:
        deadline = time.monotonic() + timeout
        while True:
            records = [r for r in self.fake.records()[self.before :] if r["path"].split("?")[0] in GENERATING]
            done = all(
                r["completed"] or r["disconnected_at"] is not None or r["status"] not in (None, 200) for r in records
            )
            if (records and done) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        ends = [r["disconnected_at"] or max(r["token_times"], default=r["received_at"]) for r in records]
        return Evidence(
            requests=len(records),
            stopped=any(r["disconnected_at"] is not None and not r["completed"] for r in records),
            ended_at=max(ends) if ends else None,
            decoded_after=sum(1 for r in records for t in r["token_times"] if t > pressed),
            decoded_before=sum(1 for r in records for t in r["token_times"] if t <= pressed),
            source="the fake's record: each token's and the disconnect's time",
        )


# -- llama-server -----------------------------------------------------------------------------------


class LlamaCpp(Server):
    """A real llama-server (SmolLM2-135M, 2 threads, one slot, ``--ignore-eos``: every answer
    runs to ``max_tokens`` unless stopped)."""

    name = "llama-server"
    lane = "llamacpp"

    def __init__(self) -> None:
        from ...testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

        binary, model = llama_server_binary(), smollm2_gguf()
        if binary is None or model is None:
            raise RuntimeError("no llama-server build or model (abstract-client prepare llama-server; prepare smollm2)")
        self._tmp = tempfile.TemporaryDirectory()
        self.server = LlamaServer.launch(
            binary, model, log_path=Path(self._tmp.name) / "server.log", extra=["--ignore-eos"]
        )
        self.url = self.server.url
        # the model's id as the server lists it (a client that checks the name finds it)
        self.model = str(self.server.get_json("/v1/models")["data"][0]["id"])

    def watch(self) -> Watch:
        self.server.wait_idle(120)
        return LlamaWatch(self.server)

    def close(self) -> None:
        self.server.stop()
        self._tmp.cleanup()


LAUNCHED = re.compile(r"launch_slot_.*processing task")
RELEASED = re.compile(r"slot +release: .*stop processing")


class Poller:
    """Samples ``read()`` every ``interval`` seconds on a thread of its own: (time, value)."""

    def __init__(self, read: Callable[[], Any], interval: float) -> None:
        self.samples: list[tuple[float, Any]] = []
        self._read, self._interval = read, interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            with contextlib.suppress(OSError, ValueError):
                value = self._read()
                self.samples.append((time.perf_counter(), value))
            self._done.wait(self._interval)

    def stop(self) -> list[tuple[float, Any]]:
        self._done.set()
        self._thread.join(5)
        return self.samples


class LogTail:
    """The lines a server's log gained since the last read (cheap enough to read every 2 ms)."""

    def __init__(self, path: Path, line: re.Pattern[str]) -> None:
        self.path, self.line = path, line
        self.offset = path.stat().st_size if path.exists() else 0
        self.seen = 0

    def read(self) -> int:
        """How many ``line``s the log has gained since the watch began."""
        with open(self.path, "rb") as log:
            log.seek(self.offset)
            new = log.read()
        cut = new.rfind(b"\n") + 1  # whole lines only
        self.offset += cut
        self.seen += len(self.line.findall(new[:cut].decode(errors="replace")))
        return self.seen


class LlamaWatch(Watch):
    def __init__(self, server: Any) -> None:
        self.server = server
        log = server.log_text()
        self.cancels, self.launches = len(server.CANCEL.findall(log)), len(LAUNCHED.findall(log))
        self.released = len(RELEASED.findall(log))
        self.poller = Poller(server.processing_decoded, 0.005)  # None: idle; else tokens decoded
        self.log = Poller(LogTail(server.log_path, server.CANCEL).read, 0.002)

    def ready(self, stage: str, began: float) -> bool:
        samples = self.poller.samples
        if stage == "prefill":
            return bool(samples) and held(samples, lambda v: v == 0, READING)
        return bool(samples) and (samples[-1][1] or 0) >= DECODED

    def settle(self, pressed: float, timeout: float = 90.0) -> Evidence:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            samples = self.poller.samples
            if samples and samples[-1][0] > pressed and samples[-1][1] is None and self.server.wait_idle(0.05):
                break
            time.sleep(0.02)
        samples, lines = self.poller.stop(), self.log.stop()
        # llama-server writes its log from a thread of its own: the task's lines (its cancel
        # first, then its release) may come after /slots says idle
        log = self.server.log_text()
        while len(RELEASED.findall(log)) <= self.released and time.monotonic() < deadline:
            time.sleep(0.01)
            log = self.server.log_text()
        at_press = [v for t, v in samples if t <= pressed]
        base = at_press[-1] if at_press and at_press[-1] is not None else 0
        later = [v for t, v in samples if t > pressed and v is not None]
        stopped = len(self.server.CANCEL.findall(log)) > self.cancels
        idle = _first(samples, pressed, lambda v: v is None)
        cancelled = _first(lines, pressed, lambda n: n > 0) if stopped else None
        return Evidence(
            requests=len(LAUNCHED.findall(log)) - self.launches,
            stopped=stopped,
            ended_at=min((t for t in (cancelled, idle) if t is not None), default=None),
            decoded_after=max(0, max(later, default=base) - base),
            decoded_before=base,
            source="llama-server: its log's 'cancel task' (read every 2 ms), /slots every 5 ms",
        )


# -- vLLM -------------------------------------------------------------------------------------------


class VLLM(Server):
    """A real vLLM (CPU) with SmolLM2-135M; ``ignore_eos`` is sent with every request."""

    name = "vllm"
    lane = "vllm"
    extra: ClassVar[dict[str, Any]] = {"ignore_eos": True}

    def __init__(self) -> None:
        from ...testing.processes import VLLMServer, vllm_environment

        env = vllm_environment()
        if env is None:
            raise RuntimeError("no vLLM venv (abstract-client prepare vllm)")
        self._tmp = tempfile.TemporaryDirectory()
        self.server = VLLMServer.launch(env[0], env[1], log_path=Path(self._tmp.name) / "server.log")
        self.url = self.server.url
        self.prefill_prompt = "Summarise: " + " ".join(f"word{i % 97}" for i in range(600))

    def watch(self) -> Watch:
        deadline = time.monotonic() + 120
        while self.server.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        return VLLMWatch(self.server)

    def close(self) -> None:
        self.server.stop()
        self._tmp.cleanup()


ACCESS = re.compile(r'"POST (?:/v1/chat/completions|/v1/completions|/v1/responses|/v1/messages) HTTP')
FINISHED = "vllm:request_success_total"  # requests that ran to their end (an abort is not counted)
TOKENS = "vllm:generation_tokens_total"


class VLLMWatch(Watch):
    def __init__(self, server: Any) -> None:
        self.server = server
        self.posts = len(ACCESS.findall(server.log_text()))
        self.poller = Poller(server.metrics, 0.02)

    def ready(self, stage: str, began: float) -> bool:
        samples = self.poller.samples
        if not samples:
            return False
        start = float(samples[0][1].get(TOKENS, 0.0))

        def reading(m: dict[str, float]) -> bool:  # a request in, no token out yet
            return bool(m.get("vllm:num_requests_running")) and m.get(TOKENS, 0.0) == start

        if stage == "prefill":
            return held(samples, reading, READING)
        return float(samples[-1][1].get(TOKENS, 0.0)) - start >= DECODED

    def settle(self, pressed: float, timeout: float = 90.0) -> Evidence:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            samples = self.poller.samples
            if samples and samples[-1][0] > pressed + 0.1 and not samples[-1][1].get("vllm:num_requests_running"):
                break
            time.sleep(0.05)
        samples = self.poller.stop()
        first, last = samples[0][1], samples[-1][1]
        at_press = [m for t, m in samples if t <= pressed] or [first]
        finished = int(last.get(FINISHED, 0.0) - first.get(FINISHED, 0.0))
        # uvicorn logs a request once its answer starts, /metrics counts only those that finish:
        # a plain call stopped early is seen where the running count rises
        busy = [bool(m.get("vllm:num_requests_running") or m.get("vllm:num_requests_waiting")) for _, m in samples]
        rises = sum(1 for was, now in zip([False, *busy[:-1]], busy, strict=True) if now and not was)
        requests = max(finished, rises, len(ACCESS.findall(self.server.log_text())) - self.posts)
        return Evidence(
            requests=requests,
            stopped=requests > finished,
            ended_at=_first(samples, pressed, lambda m: not m.get("vllm:num_requests_running")),
            decoded_after=int(last.get(TOKENS, 0.0) - at_press[-1].get(TOKENS, 0.0)),
            decoded_before=int(at_press[-1].get(TOKENS, 0.0) - first.get(TOKENS, 0.0)),
            source="vLLM: /metrics every 20 ms, its access log",
        )


# -- llama-server behind a gateway ------------------------------------------------------------------


class Behind(Server):
    """llama-server behind a gateway: the client talks to the gateway, the evidence is still
    llama-server's own. ``lane`` is the plain /v1 dialect (what a client sees of a gateway)."""

    lane = "openai-compatible"
    api_key = "sk-stop-bench"  # the LiteLLM proxy refuses to start without a master key

    def __init__(self, kind: str) -> None:
        self.upstream = LlamaCpp()
        self._tmp = tempfile.TemporaryDirectory()
        try:
            self.gateway = self._start(kind, Path(self._tmp.name))
        except BaseException:
            self.upstream.close()
            raise
        self.url = self.gateway.url

    def _start(self, kind: str, where: Path) -> Any:
        from ...testing.processes import ServerProcess, free_port

        if kind == "serve":
            from ...testing.gateway import GatewayProcess

            self.name = "llama-server behind abstract-client serve"
            args = ["--provider", "llamacpp", "--base-url", self.upstream.url, "--name", self.model, "--no-usage"]
            return GatewayProcess.launch(args, log_path=where / "gateway.log")
        from .venvs import python_for

        python = python_for("litellm-proxy")
        version = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        self.name = f"llama-server behind the LiteLLM proxy {version}"
        config = where / "litellm.yaml"
        config.write_text(
            f"model_list:\n  - model_name: {self.model}\n    litellm_params:\n      model: openai/{self.model}\n"
            f"      api_base: {self.upstream.url}/v1\n      api_key: none\n"
        )
        port = free_port()
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": self.api_key}
        proxy = ServerProcess(
            [str(python.parent / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            port,
            where / "litellm.log",
            env=env,
        )
        proxy.ready_path = "/health/liveliness"
        return proxy.start(180)

    def watch(self) -> Watch:
        return self.upstream.watch()

    def close(self) -> None:
        self.gateway.stop()
        self.upstream.close()
        self._tmp.cleanup()


SERVERS: dict[str, Callable[[], Server]] = {
    "llamacpp": LlamaCpp,
    "vllm": VLLM,
    "ollama": lambda: FakeServer("ollama"),
    "lmstudio": lambda: FakeServer("lmstudio"),
    "litellm-proxy": lambda: Behind("litellm-proxy"),
    "serve": lambda: Behind("serve"),
}
