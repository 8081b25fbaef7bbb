"""A fake Ollama server: native NDJSON ``/api/*`` plus the OpenAI-compatible ``/v1`` routes.

Models load and unload like Ollama's scheduler: an empty ``messages``/``prompt`` loads;
with ``keep_alive: 0`` it answers ``done_reason: "unload"`` at once but only unloads after the
requests in flight finish. ``finish_prompt_before_disconnect=True`` mimics Ollama before v0.30
(its Go runner finishes prompt evaluation before it notices a disconnect).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from ._server import Conn, Handler, RequestRecord, decode_image, script_calls
from .openai import FakeOpenAIServer

VERSION = "0.33.0"


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class FakeOllamaServer(FakeOpenAIServer):
    def __init__(self, **kw: Any) -> None:
        kw.setdefault("models", {"fake-model": True})
        super().__init__(**kw)
        self._busy: dict[str, int] = {}
        self._expiring: set[str] = set()
        self._model_lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return self.url

    def route(self, method: str, path: str) -> Handler | None:
        routes: dict[tuple[str, str], Handler] = {
            ("GET", "/"): self.root,
            ("HEAD", "/"): self.root,
            ("GET", "/api/version"): lambda c, r: c.send_json(200, {"version": VERSION}),
            ("GET", "/api/tags"): self.tags,
            ("GET", "/api/ps"): self.ps,
            ("POST", "/api/show"): self.show,
            ("POST", "/api/chat"): self.native,
            ("POST", "/api/generate"): self.native,
            ("POST", "/api/embed"): self.native_embed,
            ("POST", "/v1/chat/completions"): self.chat,
            ("POST", "/v1/responses"): self.responses,
            ("POST", "/v1/messages"): self.messages,  # Ollama 0.14+: over its native chat
            ("POST", "/v1/embeddings"): self.embeddings,
            ("GET", "/v1/models"): self.models,
        }
        return routes.get((method, path))

    def not_found(self, conn: Conn, method: str, path: str) -> None:
        conn.send_head(404, {"Content-Type": "text/plain", "Content-Length": "18"})
        conn.send(b"404 page not found")

    def error_body(self, status: int, message: str) -> Any:
        return {"error": message}

    def root(self, conn: Conn, record: RequestRecord) -> None:
        body = b"Ollama is running"
        conn.send_head(200, {"Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(body))})
        if record.method == "GET":
            conn.send(body)

    def tags(self, conn: Conn, record: RequestRecord) -> None:
        conn.send_json(200, {"models": [self._model_entry(m) for m in self.behavior.models]})

    def ps(self, conn: Conn, record: RequestRecord) -> None:
        loaded = [m for m, is_loaded in self.behavior.models.items() if is_loaded]
        conn.send_json(
            200,
            {
                "models": [
                    {
                        **self._model_entry(m),
                        "size_vram": 0,
                        "context_length": 4096,
                        "expires_at": "2099-01-01T00:00:00Z",
                    }
                    for m in loaded
                ]
            },
        )

    def show(self, conn: Conn, record: RequestRecord) -> None:
        name = (record.body or {}).get("model") if isinstance(record.body, dict) else None
        if name not in self.behavior.models:
            conn.send_json(404, {"error": f"model '{name}' not found"})
            return
        conn.send_json(
            200,
            {
                "modelfile": f"FROM {name}",
                "parameters": "",
                "template": "{{ .Prompt }}",
                "details": self._model_entry(str(name))["details"],
                "capabilities": ["completion"],
            },
        )

    def _model_entry(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "model": name,
            "modified_at": "2026-01-01T00:00:00Z",
            "size": 1,
            "digest": "0" * 64,
            "details": {"format": "gguf", "family": "llama", "parameter_size": "135M", "quantization_level": "Q4_1"},
        }

    def _acquire(self, model: str) -> None:
        with self._model_lock:
            self._busy[model] = self._busy.get(model, 0) + 1
            self.behavior.models[model] = True

    def _release(self, model: str) -> None:
        with self._model_lock:
            self._busy[model] -= 1
            if self._busy[model] == 0 and model in self._expiring:
                self._expiring.discard(model)
                self.behavior.models[model] = False

    def native(self, conn: Conn, record: RequestRecord) -> None:
        body = record.body if isinstance(record.body, dict) else {}
        chat = record.path.startswith("/api/chat")
        model = str(body.get("model") or "")
        if model not in self.behavior.models:
            conn.send_json(404, {"error": f"model '{model}' not found"})
            return
        empty = (chat and not body.get("messages")) or (not chat and not body.get("prompt"))
        if empty:
            self._load_or_unload(conn, model, body, chat)
            return
        fault = self._next_fault()
        record.fault = fault
        if self.early_fault(conn, fault):
            return
        for m in (body.get("messages") or []) if chat else [body]:
            for value in (m.get("images") or []) if isinstance(m, dict) else []:
                image = decode_image(value, data_url=False)  # Ollama takes bare base64
                if isinstance(image, str):
                    conn.send_json(400, {"error": image})
                    return
                record.images.append(image)
        options = body.get("options") or {}
        tokens, finish = self.tokens(options.get("num_predict"))
        self._acquire(model)
        try:
            self._answer(conn, record, model, chat, body, tokens, finish, fault)
        finally:
            self._release(model)

    def native_embed(self, conn: Conn, record: RequestRecord) -> None:
        """``POST /api/embed``: all inputs or nothing, as Ollama does (one wait for every input)."""
        request = self.embedding_request(
            conn, record, lambda model: {"error": f'model "{model}" not found, try pulling it first'}
        )
        if request is None:
            return
        model, inputs, dimensions = request
        t0 = time.perf_counter()
        vectors = self.embed_all(conn, inputs, dimensions)
        conn.send_json(
            200,
            {
                "model": model,
                "embeddings": vectors,
                "total_duration": _ns(time.perf_counter() - t0),
                "load_duration": 0,
                "prompt_eval_count": sum(len(t.split()) for t in inputs),
            },
        )

    def _load_or_unload(self, conn: Conn, model: str, body: dict[str, Any], chat: bool) -> None:
        keep_alive = body.get("keep_alive")
        unload = keep_alive in (0, "0", "0s", "0m")
        with self._model_lock:
            if unload:
                if self._busy.get(model, 0):
                    self._expiring.add(model)  # Ollama waits for in-flight requests
                else:
                    self.behavior.models[model] = False
            else:
                self.behavior.models[model] = True
        final: dict[str, Any] = {
            "model": model,
            "created_at": _now(),
            "done": True,
            "done_reason": "unload" if unload else "load",
        }
        final["message" if chat else "response"] = {"role": "assistant", "content": ""} if chat else ""
        conn.send_json(200, final)

    def _answer(
        self,
        conn: Conn,
        record: RequestRecord,
        model: str,
        chat: bool,
        body: dict[str, Any],
        tokens: Sequence[str],
        finish: str,
        fault: str | None,
    ) -> None:
        t_start = time.perf_counter()
        n_prompt = len(self.prompt_text(record).split())

        script = self.behavior.script if chat else None
        if script is not None:
            tokens, finish = list(script), "stop"  # type: ignore[arg-type]  # Ollama says stop after calls

        def piece(tok: Any, done: bool = False) -> dict[str, Any]:
            out: dict[str, Any] = {"model": model, "created_at": _now(), "done": done}
            if isinstance(tok, dict):
                out["message"] = _native_message([tok], script or [], whole=tok)
            elif chat:
                out["message"] = {"role": "assistant", "content": tok}
            else:
                out["response"] = tok
            return out

        def final(t_prefill: float) -> dict[str, Any]:
            now = time.perf_counter()
            out = piece("", True)
            out.update(
                done_reason=finish,
                total_duration=_ns(now - t_start),
                load_duration=_ns(0.001),
                prompt_eval_count=n_prompt,
                prompt_eval_duration=_ns(t_prefill - t_start),
                eval_count=len(tokens),
                eval_duration=_ns(now - t_prefill),
            )
            if not chat:
                out["context"] = [1, 2, 3]
            return out

        stream = body.get("stream", True) is not False  # Ollama streams unless told not to
        self.prefill(conn, record)
        t_prefill = time.perf_counter()
        if not stream:
            self.decode_whole_answer(conn, record, tokens)
            if fault == "error_on_200":
                conn.send_json(200, {"error": "injected error under HTTP 200"})
                return
            if fault == "malformed_frame":
                conn.send_head(200, {"Content-Type": "application/json", "Content-Length": "9"})
                conn.send(b"{not json")
                return
            out = final(t_prefill)
            if script is not None:
                out["message"] = _native_message(script, script, whole=None)
            elif chat:
                out["message"]["content"] = "".join(tokens)
            else:
                out["response"] = "".join(tokens)
            conn.send_json(200, out)
            return
        conn.start_chunked("application/x-ndjson")

        def frame(tok: str) -> bytes:
            return json.dumps(piece(tok)).encode() + b"\n"

        def fault_frame(name: str) -> None:
            if self.common_fault(conn, name):
                return
            if name == "error_on_200":
                conn.chunk(b'{"error":"an error was encountered while running the model"}\n')
            elif name == "malformed_frame":
                conn.chunk(b'{"model": "x", "message": {\n')
            conn.end_chunked()

        if not self.stream_tokens(conn, tokens, frame, fault, fault_frame):
            return
        conn.chunk(json.dumps(final(t_prefill)).encode() + b"\n")
        conn.end_chunked()


def _native_message(pieces: list[dict[str, Any]], script: list[dict[str, Any]], whole: Any) -> dict[str, Any]:
    """Scripted pieces in Ollama's shape: ``thinking``, and tool calls only whole (a call is sent
    at its last piece, arguments as an object: so a stop mid-call yields no call)."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(p.get("content", "") for p in pieces),
    }
    thinking = "".join(p.get("reasoning", "") for p in pieces)
    if thinking:
        message["thinking"] = thinking
    calls = script_calls(script)
    if whole is not None:  # streaming: the call whose last piece this is
        last = {p["tool"]: i for i, p in enumerate(script) if "tool" in p}
        index = whole.get("tool")
        calls = [calls[index]] if index is not None and last.get(index) == script.index(whole) else []
    if calls:
        message["tool_calls"] = [
            {"function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"] or "{}")}}
            for c in calls
        ]
    return message


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
