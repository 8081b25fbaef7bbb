"""The ``abstract-client`` command (also ``python -m abstract_client``).

    abstract-client chat --provider llamacpp --base-url http://127.0.0.1:8080
    abstract-client generate --provider ollama --model llama3.2 "Why is the sky blue?"
    abstract-client models|load|unload --provider ...
    abstract-client bench cancel [--lanes fake,llamacpp,vllm,mlx,transformers,gguf] [--json]
    abstract-client bench stop [--servers ...] [--clients ...] [--out DIR] [--json]   # the peers
    abstract-client demo                      # the README's main job (MLX + SmolLM2)
    abstract-client prepare smollm2|llama-server|llama-cpp-python|vllm

Ctrl-C while an answer streams stops that answer: the server is told (the connection is
severed), the partial answer stays on screen marked as stopped, and the conversation goes on.
Ctrl-C at the prompt, or twice in a row, exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from ..errors import AbstractClientError, GenerationCancelledError
from ..llm import LLM
from ..registry import available_providers, create_llm, runs_in_process
from ..types import GenerateResult, Message
from .line_reader import LineReader

EXIT_STOPPED = 130  # the shell's convention for "ended by SIGINT"


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _add_backend(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", "-p", default="openai-compatible", choices=available_providers())
    p.add_argument(
        "--model", "-m", default=None, help="model name (mlx, transformers: a directory; gguf: a .gguf file)"
    )
    p.add_argument("--base-url", "-u", default=None, help="server URL (each provider has a default)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=None, help="total deadline per answer, seconds")


# In-process lanes whose model is a file or directory: what `abstract-client prepare TARGET`
# makes is their default, when it is there (never prepared behind the user's back).
_PREPARED = {"mlx": "smollm2-mlx", "transformers": "smollm2-hf", "gguf": "smollm2"}


class Usage(Exception):
    """A command line that cannot run as given: one line, exit 2."""


def _default_model(provider: str) -> str:
    from .assets import prepared

    path = prepared(_PREPARED[provider])
    if path is None:
        raise Usage(
            f"-p {provider} needs a model: `abstract-client prepare {_PREPARED[provider]}` makes the default "
            "(SmolLM2-135M-Instruct), or pass -m PATH"
        )
    return str(path)


def _llm(args: argparse.Namespace) -> LLM:
    model = args.model
    if model is None and args.provider in _PREPARED:
        model = _default_model(args.provider)
    return create_llm(args.provider, model, base_url=args.base_url, api_key=args.api_key, timeout=args.timeout)


class StopKey:
    """While an answer streams, SIGINT sets a stop event instead of raising KeyboardInterrupt;
    a second Ctrl-C within ``double_press`` seconds exits.

    The press is set by a thread of the key's own, never inside the signal handler: a Python
    handler runs in the main thread between two of its bytecodes, and that thread may hold, at
    that instant, the very lock ``Event.set()`` takes (``Event.wait`` holds it around its
    check; the stop it sets off wakes that same thread) — a non-reentrant lock taken twice by
    one thread, and the chat hung with its answer streaming on. The handler only writes a byte
    to a pipe, which is safe anywhere."""

    def __init__(self, double_press: float = 1.0) -> None:
        self.event = threading.Event()
        self.pressed_at: float | None = None
        self.double_press = double_press
        self._previous: Any = None
        self._session = 0  # which answer a press belongs to (a late one must not stop the next)
        self._read, self._write = os.pipe()
        threading.Thread(target=self._presses, name="abstract-client-stop-key", daemon=True).start()

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        now = time.perf_counter()
        if self.pressed_at is not None and now - self.pressed_at < self.double_press:
            raise KeyboardInterrupt
        self.pressed_at = now
        os.write(self._write, bytes([self._session % 256]))

    def _presses(self) -> None:
        while data := os.read(self._read, 64):
            if data[-1] == self._session % 256:
                self.event.set()  # the stop, pressed from this thread: as a Stop button would

    def __enter__(self) -> StopKey:
        self._session += 1
        self.event.clear()
        self.pressed_at = None
        self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


def _stream_answer(
    llm: LLM, console: Any, key: StopKey, **kwargs: Any
) -> tuple[str, GenerateResult | None, GenerationCancelledError | None]:
    stream = llm.stream(cancel_event=key.event, **kwargs)
    try:
        with stream:
            for chunk in stream:
                console.print(chunk.delta, end="", markup=False)
        console.print()
        return stream.text, stream.result(), None
    except GenerationCancelledError as err:
        return err.partial_text, None, err


# -- chat -------------------------------------------------------------------------------------------


@dataclass
class ChatStats:
    answers: int = 0
    stopped: int = 0
    tokens: int = 0
    tok_s: list[float] = field(default_factory=list)
    stop_ms: list[float] = field(default_factory=list)


def cmd_chat(args: argparse.Namespace) -> int:
    console = _console()
    llm = _llm(args)
    history: list[Message] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    stats = ChatStats()
    console.print(
        f"[bold]abstract-client chat[/] — {llm.provider_name} {llm.model or ''}  "
        "(Ctrl-C stops an answer; Ctrl-C at the prompt exits; /help)"
    )
    current = [llm]  # /model replaces it
    try:
        with LineReader() if LineReader.supported() else contextlib.nullcontext() as reader:
            return _chat_loop(current, console, reader, history, stats, args)
    finally:
        current[0].close()


def _chat_loop(
    current: list[LLM],
    console: Any,
    reader: LineReader | None,
    history: list[Message],
    stats: ChatStats,
    args: argparse.Namespace,
) -> int:
    key = StopKey()
    try:
        while True:
            llm = current[0]
            try:
                if reader is not None:  # a Ctrl-C at the prompt is never lost (line_reader.py)
                    line = reader.input(console, "[bold green]you>[/] ")
                else:
                    line = console.input("[bold green]you>[/] ")
            except (KeyboardInterrupt, EOFError):
                console.print()
                return 0
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                done = _chat_command(text, llm, history, stats, console, args)
                if done == "quit":
                    return 0
                if isinstance(done, LLM):
                    current[0] = done
                continue
            history.append({"role": "user", "content": text})
            console.print("[bold blue]ai>[/] ", end="")
            started = time.perf_counter()
            try:
                with key:
                    partial, result, stopped = _stream_answer(
                        llm, console, key, messages=list(history), max_tokens=args.max_tokens
                    )
            except AbstractClientError as err:  # the backend failed this answer: say so, go on
                history.pop()  # the question got no answer: ask it again, or another
                console.print(f"\n[red]error:[/] {type(err).__name__}: {err}", markup=True)
                continue
            stats.answers += 1
            if stopped is not None:
                stats.stopped += 1
                if key.pressed_at is not None:
                    stats.stop_ms.append((time.perf_counter() - key.pressed_at) * 1000)
                stats.tokens += stopped.generated_tokens
                if stopped.generated_tokens:  # a stopped answer streamed too: its rate counts
                    stats.tok_s.append(stopped.generated_tokens / max(time.perf_counter() - started, 1e-3))
                told = "the engine stopped" if runs_in_process(args.provider) else "the server was told to stop"
                console.print(f"\n[bold red]\\[stopped][/] [dim]{stopped.generated_tokens} tokens kept; {told}[/]")
                history.append({"role": "assistant", "content": partial})
            elif result is not None:
                history.append({"role": "assistant", "content": result.content})
                if result.usage and result.usage.completion_tokens:
                    stats.tokens += result.usage.completion_tokens
                    if result.timings.total_ms:
                        stats.tok_s.append(result.usage.completion_tokens / (result.timings.total_ms / 1000))
    except KeyboardInterrupt:  # Ctrl-C twice while streaming
        console.print("\n[dim]bye[/]")
        return 0


def _chat_command(
    text: str, llm: LLM, history: list[Message], stats: ChatStats, console: Any, args: argparse.Namespace
) -> str | LLM | None:
    cmd, _, arg = text.partition(" ")
    if cmd in ("/quit", "/exit"):
        return "quit"
    if cmd == "/reset":
        history[:] = [m for m in history if m.get("role") == "system"]
        console.print("[dim]history cleared[/]")
    elif cmd == "/model":
        if not arg:
            console.print(f"[dim]model: {llm.model}[/]")
            return None
        llm.close()
        args.model = arg.strip()
        console.print(f"[dim]switched to {args.model}[/]")
        return _llm(args)
    elif cmd == "/unload":
        try:
            report = llm.unload_model()
            console.print(f"[dim]unloaded: {report.detail}[/]")
        except AbstractClientError as err:
            console.print(f"[yellow]{type(err).__name__}:[/] {err}")
    elif cmd == "/stats":
        tok_s, stop_ms = stats.tok_s, stats.stop_ms
        console.print(
            f"[dim]answers {stats.answers} (stopped {stats.stopped}), tokens {stats.tokens}, "
            f"tok/s {sum(tok_s) / len(tok_s) if tok_s else 0:.1f}, "
            f"Ctrl-C → stopped {sum(stop_ms) / len(stop_ms) if stop_ms else 0:.1f} ms[/]"
        )
    else:
        console.print("[dim]/reset  /model NAME  /unload  /stats  /quit[/]")
    return None


# -- one-shot commands -------------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    console = _console()
    err_console = _console(stderr=True)
    prompt = " ".join(args.prompt) if args.prompt else sys.stdin.read()
    key = StopKey(double_press=0.0)
    try:
        with _llm(args) as llm, key:
            if args.json:
                result = llm.generate(prompt, system=args.system, max_tokens=args.max_tokens, cancel_event=key.event)
                print(json.dumps(asdict(result), default=str, indent=2))
                return 0
            _, _, stopped = _stream_answer(
                llm, console, key, prompt=prompt, system=args.system, max_tokens=args.max_tokens
            )
            if stopped is not None:
                err_console.print(f"\n[stopped] {stopped.generated_tokens} tokens", markup=False)
                return EXIT_STOPPED
            return 0
    except GenerationCancelledError:
        return EXIT_STOPPED
    except AbstractClientError as err:
        err_console.print(f"error: {type(err).__name__}: {err}", markup=False)
        return 1


def cmd_models(args: argparse.Namespace) -> int:
    with _llm(args) as llm:
        for model in llm.list_models():
            loaded = "" if model.loaded is None else ("  loaded" if model.loaded else "  not loaded")
            print(f"{model.id}{loaded}")
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    with _llm(args) as llm:
        llm.load_model()
        print(f"loaded {llm.model}")
    return 0


def cmd_unload(args: argparse.Namespace) -> int:
    with _llm(args) as llm:
        report = llm.unload_model(drain_timeout=args.drain_timeout)
        print(report.detail or "unloaded")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo()


def cmd_prepare(args: argparse.Namespace) -> int:
    from .prepare import prepare

    print(prepare(args.what))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_lane_table

    return run_lane_table(args.lanes, n=args.n, as_json=args.json)


def cmd_bench_stop(args: argparse.Namespace) -> int:
    from .stop_bench.main import run

    return run(
        servers=args.servers,
        clients=args.clients,
        trials=args.n,
        out=args.out,
        as_json=args.json,
        cost=not args.no_cost,
        refresh=args.refresh,
    )


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except AbstractClientError as err:
            print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return EXIT_STOPPED

    return run


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        sys.stderr.write("error: serve needs the server extra: pip install 'abstract-client[server]'\n")
        return 2
    from ..gateway import ConfigError, serve

    try:
        config = _gateway_config(args)
    except ConfigError as err:  # one clear line, no traceback
        sys.stderr.write(f"error: {err}\n")
        return 2
    if config is None:
        sys.stderr.write("error: serve needs --provider or --config\n")
        return 2
    try:
        serve(config)
    except ConfigError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C during the graceful stop: no traceback
        return 130
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    from .usage_table import usage_command

    return usage_command(args)


def _gateway_config(args: argparse.Namespace) -> Any:
    from ..gateway import BackendConfig, GatewayConfig, key_from_env, load_config

    if args.config:
        config = load_config(args.config)
    elif args.provider:
        options = {}
        for item in args.option:
            key, _, value = item.partition("=")
            try:
                options[key] = json.loads(value)
            except ValueError:
                options[key] = value
        name = args.name or args.model or args.provider
        backend = BackendConfig(
            name=Path(name).name if runs_in_process(args.provider) and not args.name else name,
            provider=args.provider,
            model=args.model,
            base_url=args.base_url,
            options=options,
            max_concurrent=args.max_concurrent,
            queue_timeout=args.queue_timeout,
        )
        config = GatewayConfig(backends=[backend])
    else:
        return None
    if args.host:
        config.host = args.host
    if args.port:
        config.port = args.port
    if args.api_key_env:
        config.api_key = key_from_env(args.api_key_env)
    if args.admin_key_env:
        config.admin_key = key_from_env(args.admin_key_env)
    config.allowed_hosts += args.allowed_host
    config.allowed_origins += args.allowed_origin
    if args.max_body_mb is not None:
        config.max_body_bytes = int(args.max_body_mb * 2**20)
    if args.workers is not None:
        config.workers = args.workers
    if args.max_background is not None:
        config.max_background = args.max_background
    if args.background_retention is not None:
        config.background_retention = args.background_retention
    if args.background_max_mb is not None:
        config.background_max_bytes = int(args.background_max_mb * 2**20)
    if args.store is not None:
        config.store = args.store
    if args.ui:
        config.ui = True
    if args.strict_model_names:
        config.strict_model_names = True
    if args.health_interval is not None:
        config.health_interval = args.health_interval
    if args.access_log:
        config.access_log = True
    if args.data_dir is not None:
        config.data_dir = args.data_dir
    if args.no_usage:
        config.usage = False
    if args.usage_retention_days is not None:
        config.usage_retention_days = args.usage_retention_days
    config.log_level = args.log_level
    config.__post_init__()  # the command line's values are checked like the file's
    return config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="abstract-client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("chat", help="interactive chat; Ctrl-C stops the answer, not the chat")
    _add_backend(p)
    p.add_argument("--system", default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.set_defaults(fn=cmd_chat)

    p = sub.add_parser("generate", help="one answer to stdout (streamed); exit 130 when stopped by Ctrl-C")
    _add_backend(p)
    p.add_argument("prompt", nargs="*", help="the prompt (default: stdin)")
    p.add_argument("--system", default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.set_defaults(fn=_guard(cmd_generate))

    for name, fn, text in (
        ("models", cmd_models, "list the backend's models"),
        ("load", cmd_load, "load the model"),
        ("unload", cmd_unload, "unload the model (stops our in-flight calls first)"),
    ):
        p = sub.add_parser(name, help=text)
        _add_backend(p)
        if name == "unload":
            p.add_argument("--drain-timeout", type=float, default=30.0)
        p.set_defaults(fn=_guard(fn))

    p = sub.add_parser("serve", help="an OpenAI-compatible gateway; a client's disconnect stops the generation")
    p.add_argument("--provider", "-p", default=None, choices=available_providers())
    p.add_argument(
        "--model", "-m", default=None, help="model name (mlx, transformers: a directory; gguf: a .gguf file)"
    )
    p.add_argument("--base-url", "-u", default=None, help="the backend's URL (each provider has a default)")
    p.add_argument("--name", default=None, help="the model name clients use (default: --model, or the provider)")
    p.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a provider option (repeatable; VALUE is parsed as JSON when it can be)",
    )
    p.add_argument("--config", default=None, help="a TOML file serving several backends (see docs/gateway.md)")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name besides loopback and --host (repeatable; '*' allows any: see docs/gateway.md)",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="URL",
        help="a web origin, e.g. https://app.example, whose pages may call the gateway (repeatable)",
    )
    p.add_argument("--max-concurrent", type=int, default=4, help="generations at once per backend")
    p.add_argument("--queue-timeout", type=float, default=30.0, help="seconds a request may wait: then 503")
    p.add_argument(
        "--api-key-env", default=None, help="the name of an environment variable holding the bearer key (must be set)"
    )
    p.add_argument(
        "--admin-key-env", default=None, help="an environment variable holding the admin key (cancels any request)"
    )
    p.add_argument("--workers", type=int, default=None, help="processes sharing the port (HTTP lanes only)")
    p.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="redis://HOST:PORT/DB shared by several gateway hosts (background responses, stop records, cancels)",
    )
    p.add_argument("--ui", action="store_true", help="serve a chat page with a Stop button at /")
    p.add_argument(
        "--strict-model-names",
        action="store_true",
        help="a request's model must name a backend, even with one backend (default: any name reaches it)",
    )
    p.add_argument(
        "--health-interval",
        type=float,
        default=None,
        help="seconds between the background probes of each backend (default 5; /health and /ready read them)",
    )
    p.add_argument("--max-body-mb", type=float, default=None, help="largest request body in MiB (default 32): 413")
    p.add_argument(
        "--max-background", type=int, default=None, help="background responses held at once (default 64): then 429"
    )
    p.add_argument(
        "--background-retention", type=float, default=None, help="seconds a finished background response is kept (600)"
    )
    p.add_argument(
        "--background-max-mb", type=float, default=None, help="events one background response may hold, MiB (16)"
    )
    p.add_argument(
        "--data-dir", default=None, help="where usage.sqlite3 lives (default: ~/.local/share/abstract-client)"
    )
    p.add_argument("--no-usage", action="store_true", help="keep no usage records (limits still apply)")
    p.add_argument("--usage-retention-days", type=float, default=None, help="days usage records are kept (90)")
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--access-log", action="store_true", help="log a line per request (uvicorn's access log; off by default)"
    )
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("usage", help="requests and tokens per key, model and day (a gateway's usage records)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--data-dir", default=None, help="the gateway's data directory (its usage.sqlite3)")
    where.add_argument("--url", default=None, help="ask a running gateway (GET /v1/usage) instead")
    p.add_argument("--api-key-env", default=None, help="with --url: the variable holding your key (or the admin key)")
    p.add_argument("--start", default=None, metavar="YYYY-MM-DD")
    p.add_argument("--end", default=None, metavar="YYYY-MM-DD")
    p.add_argument("--key", default=None, help="one key's name")
    p.add_argument("--json", action="store_true", help="the rows as JSON")
    p.set_defaults(fn=cmd_usage)

    p = sub.add_parser("bench", help="benchmarks")
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("cancel", help="stop → raise latency and server evidence, per lane (docs/cancellation.md)")
    b.add_argument(
        "--lanes",
        default="fake,llamacpp,vllm,mlx,transformers,gguf",
        help="comma-separated: fake, llamacpp, vllm, mlx, transformers, gguf (unavailable lanes are listed as skipped)",
    )
    b.add_argument("-n", type=int, default=10, help="stops per case")
    b.add_argument("--json", action="store_true")
    b.set_defaults(fn=cmd_bench)
    b = bench.add_parser(
        "stop",
        help="what a Stop does with the clients people use, and with this library under them",
    )
    b.add_argument(
        "--servers",
        default="llamacpp,vllm,ollama,lmstudio,litellm-proxy,serve",
        help="llamacpp, vllm (real); ollama, lmstudio (fakes); litellm-proxy, serve (llama-server behind each)",
    )
    b.add_argument(
        "--clients",
        default="all",
        help="all, or some of: openai_python, anthropic_sdk, litellm_sdk, langchain, pydantic_ai, llamaindex, "
        "ollama_python, abstractcore, this_library",
    )
    b.add_argument("-n", type=int, default=3, help="stops per row (a client that cannot stop is measured once)")
    b.add_argument("--out", default=None, help="a directory for stop-bench.json, stop-bench.md and stop-bench.png")
    b.add_argument("--json", action="store_true", help="the rows as JSON on stdout")
    b.add_argument("--no-cost", action="store_true", help="leave out the cost side (chunks/s, p50 of a short call)")
    b.add_argument("--refresh", action="store_true", help="make the peers' venvs again, at the index's newest versions")
    b.set_defaults(fn=cmd_bench_stop)

    p = sub.add_parser("demo", help="the main job: SmolLM2 on MLX answers, then a long answer is stopped")
    p.set_defaults(fn=_guard(cmd_demo))

    p = sub.add_parser("prepare", help="build or fetch a real engine or model (progress bar; cached)")
    p.add_argument("what", choices=["smollm2", "smollm2-mlx", "smollm2-hf", "llama-server", "llama-cpp-python", "vllm"])
    p.set_defaults(fn=_guard(cmd_prepare))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("serve", "usage"):  # no UI needed: they run on servers
        return int(args.fn(args))
    try:
        import rich  # noqa: F401 - the command's UI
    except ImportError:
        sys.stderr.write("error: the abstract-client command needs its UI: pip install 'abstract-client[cli]'\n")
        return 2
    try:
        return int(args.fn(args))
    except Usage as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    except BrokenPipeError:  # `abstract-client generate --json | head`: the reader left, quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would raise again
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    raise SystemExit(main())
