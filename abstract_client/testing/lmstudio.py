"""A fake LM Studio server: ``/v1`` (OpenAI-compatible) and the native ``/api/v1`` REST API.

Faithful to LM Studio's quirks: unknown routes answer HTTP 200 with an ``error`` body; "no
models loaded" is a string ``error``; an unknown model is an object error with
``code: model_not_found``; loading a loaded model makes a second instance; unloading a model
mid-generation ends that stream with a "Model unloaded" error. By default it finishes prompt
processing before it notices a disconnect, as LM Studio does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from ._server import Conn, Handler, RequestRecord, decode_image
from .openai import FakeOpenAIServer, sse


def named(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class FakeLMStudioServer(FakeOpenAIServer):
    done_after_error = False

    def __init__(self, *, jit: bool = True, **kw: Any) -> None:
        kw.setdefault("finish_prompt_before_disconnect", True)
        super().__init__(**kw)
        self.jit = jit  # LM Studio loads a requested model just in time (on by default)
        self.instances: dict[str, list[str]] = {m: [m] for m, loaded in self.behavior.models.items() if loaded}
        self._lock2 = threading.Lock()
        self.load_calls = 0

    @property
    def base_url(self) -> str:
        return self.url

    def route(self, method: str, path: str) -> Handler | None:
        routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): self.lms_chat,
            ("POST", "/v1/responses"): self.responses,
            ("POST", "/v1/messages"): self.messages,  # LM Studio 0.4+
            ("POST", "/v1/embeddings"): self.lms_embeddings,
            ("GET", "/v1/models"): self.models,
            ("POST", "/api/v1/chat"): self.native_chat,
            ("GET", "/api/v1/models"): self.native_models,
            ("POST", "/api/v1/models/load"): self.load,
            ("POST", "/api/v1/models/unload"): self.unload,
        }
        return routes.get((method, path))

    def not_found(self, conn: Conn, method: str, path: str) -> None:
        conn.send_json(200, {"error": f"Unexpected endpoint or method. ({method} {path})"})

    def error_body(self, status: int, message: str) -> Any:
        return {"error": {"message": message, "type": "internal_error"}}

    def is_loaded(self, model: str) -> bool:
        with self._lock2:
            return bool(self.instances.get(model))

    def models(self, conn: Conn, record: RequestRecord) -> None:
        data = [{"id": m, "object": "model", "owned_by": "organization_owner"} for m in self.behavior.models]
        conn.send_json(200, {"object": "list", "data": data})

    def native_models(self, conn: Conn, record: RequestRecord) -> None:
        with self._lock2:
            models = [
                {
                    "type": "llm",
                    "key": m,
                    "display_name": m,
                    "format": "gguf",
                    "loaded_instances": [
                        {"id": i, "config": {"context_length": 4096}} for i in self.instances.get(m, [])
                    ],
                }
                for m in self.behavior.models
            ]
        conn.send_json(200, {"models": models})

    def load(self, conn: Conn, record: RequestRecord) -> None:
        model = str((record.body or {}).get("model", "")) if isinstance(record.body, dict) else ""
        if model not in self.behavior.models:
            conn.send_json(404, {"error": {"type": "model_not_found", "message": f"Model {model} not found"}})
            return
        with self._lock2:
            self.load_calls += 1
            instances = self.instances.setdefault(model, [])
            instance_id = model if not instances else f"{model}:{len(instances) + 1}"  # a 2nd load = 2nd instance
            instances.append(instance_id)
            self.behavior.models[model] = True
        conn.send_json(200, {"type": "llm", "instance_id": instance_id, "load_time_seconds": 0.05, "status": "loaded"})

    def unload(self, conn: Conn, record: RequestRecord) -> None:
        instance_id = (record.body or {}).get("instance_id") if isinstance(record.body, dict) else None
        with self._lock2:
            for model, ids in self.instances.items():
                if instance_id in ids:
                    ids.remove(instance_id)
                    if not ids:
                        self.behavior.models[model] = False
                    break
            else:
                conn.send_json(
                    404, {"error": {"type": "invalid_request", "message": f"No model instance {instance_id!r}"}}
                )
                return
        conn.send_json(200, {"instance_id": instance_id})

    def _check_model(self, conn: Conn, model: str) -> bool:
        if self.jit and model in self.behavior.models and not self.is_loaded(model):
            with self._lock2:
                self.instances.setdefault(model, []).append(model)
                self.behavior.models[model] = True
        if not any(self.instances.values()):
            conn.send_json(
                400,
                {"error": "No models loaded. Please load a model in the developer page or use the 'lms load' command."},
            )
            return False
        if model not in self.behavior.models:
            conn.send_json(
                400,
                {
                    "error": {
                        "message": f'Invalid model identifier "{model}". Please specify a valid downloaded model.',
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
            )
            return False
        return True

    def lms_embeddings(self, conn: Conn, record: RequestRecord) -> None:
        body = record.body if isinstance(record.body, dict) else {}
        if not self._check_model(conn, str(body.get("model"))):
            return
        self.embeddings(conn, record)

    def lms_chat(self, conn: Conn, record: RequestRecord) -> None:
        body = record.body if isinstance(record.body, dict) else {}
        model = str(body.get("model") or "")
        if not self._check_model(conn, model):
            return
        conn.lms_model = model  # type: ignore[attr-defined]
        self.chat(conn, record)

    def stream_tokens(self, conn: Conn, tokens: Sequence[str], frame: Any, fault: str | None, fault_frame: Any) -> bool:
        # Before every token, check the model is still loaded (an unload ends in-flight streams).
        model = getattr(conn, "lms_model", None)

        def guarded(tok: str) -> bytes:
            if model is not None and not self.is_loaded(model):
                raise _Unloaded
            return bytes(frame(tok))

        try:
            return super().stream_tokens(conn, tokens, guarded, fault, fault_frame)
        except _Unloaded:
            conn.chunk(sse({"error": {"message": "Model unloaded.", "type": "internal_error"}}))
            conn.end_chunked()
            return False

    def native_chat(self, conn: Conn, record: RequestRecord) -> None:
        body = record.body if isinstance(record.body, dict) else {}
        model = str(body.get("model") or "")
        if not self._check_model(conn, model):
            return
        given = body.get("input")
        for item in given if isinstance(given, list) else []:
            kind = item.get("type") if isinstance(item, dict) else None
            image = decode_image(item.get("data_url"), data_url=True) if kind == "image" else None
            if kind not in ("message", "image") or isinstance(image, str):
                conn.send_json(
                    400, self.error_body(400, image if isinstance(image, str) else f"bad input item {str(item)[:60]}")
                )
                return
            if image is not None:
                record.images.append(image)
        tokens, _ = self.tokens(body.get("max_output_tokens"))
        reasoning = ["Let ", "me ", "think. "] if body.get("reasoning") not in (None, "off") else []
        t0 = time.perf_counter()
        if not body.get("stream"):
            self.prefill(conn, record)
            self.decode_whole_answer(conn, record, tokens)
            conn.send_json(200, self._result(model, tokens, reasoning, t0))
            return
        conn.start_chunked("text/event-stream")
        conn.chunk(named("chat.start", {"type": "chat.start", "model_instance_id": model}))
        conn.chunk(named("prompt_processing.start", {"type": "prompt_processing.start"}))
        self.prefill(conn, record)
        conn.chunk(named("prompt_processing.end", {"type": "prompt_processing.end"}))
        if reasoning:
            conn.chunk(named("reasoning.start", {"type": "reasoning.start"}))
            for r in reasoning:
                conn.chunk(named("reasoning.delta", {"type": "reasoning.delta", "content": r}))
            conn.chunk(named("reasoning.end", {"type": "reasoning.end"}))
        conn.chunk(named("message.start", {"type": "message.start"}))
        conn.lms_model = model  # type: ignore[attr-defined]

        def frame(tok: str) -> bytes:
            return named("message.delta", {"type": "message.delta", "content": tok})

        def fault_frame(name: str) -> None:
            if self.common_fault(conn, name):
                return
            conn.chunk(named("error", {"type": "error", "error": {"type": "unknown", "message": "injected error"}}))
            conn.chunk(named("chat.end", {"type": "chat.end", "result": self._result(model, [], reasoning, t0)}))
            conn.end_chunked()

        if not self.stream_tokens(conn, tokens, frame, self._next_fault(), fault_frame):
            return
        conn.chunk(named("message.end", {"type": "message.end"}))
        conn.chunk(named("chat.end", {"type": "chat.end", "result": self._result(model, tokens, reasoning, t0)}))
        conn.end_chunked()

    def _result(self, model: str, tokens: Sequence[str], reasoning: list[str], t0: float) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if reasoning:
            output.append({"type": "reasoning", "content": "".join(reasoning)})
        output.append({"type": "message", "content": "".join(tokens)})
        elapsed = max(time.perf_counter() - t0, 1e-6)
        return {
            "model_instance_id": model,
            "output": output,
            "response_id": "resp_1",
            "stats": {
                "input_tokens": 5,
                "total_output_tokens": len(tokens),
                "reasoning_output_tokens": len(reasoning),
                "tokens_per_second": len(tokens) / elapsed,
                "time_to_first_token_seconds": 0.01,
            },
        }


class _Unloaded(Exception):
    pass
