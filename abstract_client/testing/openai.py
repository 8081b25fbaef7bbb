"""A fake OpenAI-compatible server (llama-server / vLLM flavoured ``/v1``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ._server import Conn, FakeServer, Handler, RequestRecord, decode_image, script_delta, script_finish, script_message


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class FakeOpenAIServer(FakeServer):
    """``POST /v1/chat/completions`` (streaming and not), ``GET /v1/models``, ``GET /health``.

    Streams ``data:`` frames: a role chunk, one chunk per token, a finish chunk, a usage chunk
    (with ``stream_options.include_usage``) and ``data: [DONE]``.
    """

    done_after_error = True  # vLLM sends [DONE] even after an error frame

    def route(self, method: str, path: str) -> Handler | None:
        routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): self.chat,
            ("POST", "/v1/responses"): self.responses,
            ("POST", "/v1/messages"): self.messages,
            ("POST", "/v1/messages/count_tokens"): self.count_message_tokens,
            ("POST", "/v1/embeddings"): self.embeddings,
            ("GET", "/v1/models"): self.models,
            ("GET", "/health"): self.health,
            ("GET", "/props"): self.props,
        }
        return routes.get((method, path))

    def props(self, conn: Conn, record: RequestRecord) -> None:
        """llama-server's ``/props`` (``--jinja``): whether the chat template does tool calls."""
        caps = {"supports_tools": self.behavior.template_tools, "supports_tool_calls": self.behavior.template_tools}
        modalities = {"vision": self.behavior.vision, "audio": False}
        conn.send_json(200, {"total_slots": 1, "chat_template_caps": caps, "modalities": modalities})

    def image_error(self, record: RequestRecord) -> tuple[int, str] | None:
        """``image_url`` parts: a data URL's bytes are recorded, an http(s) URL is taken as the
        server would fetch it; a model without vision answers as llama-server does (500)."""
        body = record.body if isinstance(record.body, dict) else {}
        for m in body.get("messages") or []:
            content = m.get("content") if isinstance(m, dict) else None
            for part in content if isinstance(content, list) else []:
                if not isinstance(part, dict) or part.get("type") != "image_url":
                    continue
                if not self.behavior.vision:
                    return (
                        500,
                        "image input is not supported - hint: if this is unexpected, "
                        "you may need to provide the mmproj",
                    )
                url = (part.get("image_url") or {}).get("url")
                if isinstance(url, str) and url.startswith(("http://", "https://")):
                    continue
                image = decode_image(url, data_url=True)
                if isinstance(image, str):
                    return 400, image
                record.images.append(image)
        return None

    @staticmethod
    def history_error(messages: Any) -> str | None:
        """What vLLM and OpenAI reject in a history: truncated tool-call arguments, and a tool
        answer to a call that was never made."""
        calls: set[str] = set()
        for m in messages if isinstance(messages, list) else []:
            for c in (m.get("tool_calls") or []) if isinstance(m, dict) else []:
                try:
                    json.loads(c["function"]["arguments"])
                except (ValueError, KeyError, TypeError):
                    return f"invalid tool call arguments in the history: {str(c)[:200]}"
                calls.add(str(c.get("id")))
            if isinstance(m, dict) and m.get("role") == "tool" and str(m.get("tool_call_id")) not in calls:
                return f"a tool message answers an unknown call {m.get('tool_call_id')!r}"
        return None

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def health(self, conn: Conn, record: RequestRecord) -> None:
        if self.behavior.fault == "loading_503":
            conn.send_json(503, self.error_body(503, "Loading model"))
        else:
            conn.send_json(200, {"status": "ok"})

    def models(self, conn: Conn, record: RequestRecord) -> None:
        data = [
            {"id": name, "object": "model", "owned_by": "fake"}
            for name, loaded in self.behavior.models.items()
            if loaded
        ]
        conn.send_json(200, {"object": "list", "data": data})

    def error_body(self, status: int, message: str) -> Any:
        kind = {400: "invalid_request_error", 404: "not_found_error", 503: "unavailable_error"}.get(
            status, "server_error"
        )
        return {"error": {"code": status, "message": message, "type": kind}}

    def embeddings(self, conn: Conn, record: RequestRecord) -> None:
        """``POST /v1/embeddings``: OpenAI's shape (``data[i].embedding`` with ``index``)."""
        request = self.embedding_request(
            conn, record, lambda model: self.error_body(404, f"The model `{model}` does not exist.")
        )
        if request is None:
            return
        model, inputs, dimensions = request
        vectors = self.embed_all(conn, inputs, dimensions)
        n = sum(len(t.split()) for t in inputs)
        conn.send_json(
            200,
            {
                "object": "list",
                "model": model,
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": n, "total_tokens": n},
            },
        )

    def _open(
        self, conn: Conn, record: RequestRecord, missing: Callable[[str], Any]
    ) -> tuple[dict[str, Any], str | None, str] | None:
        """A generation request's start, the same on every wire: its body, its fault (an early
        one answered here), its model (an unknown one answered 404 with ``missing(model)``).
        None: the request was answered."""
        body = record.body if isinstance(record.body, dict) else {}
        fault = self._next_fault()
        record.fault = fault
        if self.early_fault(conn, fault):
            return None
        model = body.get("model") or "fake-model"
        if model not in self.behavior.models and "fake-model" not in self.behavior.models:
            conn.send_json(404, missing(model))
            return None
        return body, fault, model

    def chat(self, conn: Conn, record: RequestRecord) -> None:
        begun = self._open(
            conn,
            record,
            lambda model: {
                "error": {
                    "message": f"The model `{model}` does not exist.",
                    "type": "NotFoundError",
                    "param": "model",
                    "code": 404,
                }
            },
        )
        if begun is None:
            return
        body, fault, model = begun
        problem = self.history_error(body.get("messages"))
        if problem:
            conn.send_json(400, self.error_body(400, problem))
            return
        refused = self.image_error(record)
        if refused:
            conn.send_json(refused[0], self.error_body(*refused))
            return
        tokens, finish = self.tokens(body.get("max_tokens"))
        script = self.behavior.script
        if script is not None:
            tokens, finish = list(script), script_finish(script)  # type: ignore[arg-type]
        rfield = self.behavior.reasoning_field
        cid = f"chatcmpl-{record.id}"
        base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        if not body.get("stream"):
            self.prefill(conn, record)
            self.decode_whole_answer(conn, record, tokens)
            if fault == "error_on_200":
                conn.send_json(200, self.error_body(500, "injected error under HTTP 200"))
                return
            if fault == "malformed_frame":
                conn.send_head(200, {"Content-Type": "application/json", "Content-Length": "9"})
                conn.send(b"{not json")
                return
            conn.send_json(
                200,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": script_message(script, rfield)
                            if script is not None
                            else {"role": "assistant", "content": "".join(tokens)},
                            "finish_reason": finish,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(self.prompt_text(record).split()),
                        "completion_tokens": len(tokens),
                        "total_tokens": len(self.prompt_text(record).split()) + len(tokens),
                    },
                },
            )
            return

        if self.behavior.headers_before_prefill:
            conn.start_chunked("text/event-stream")
            self.prefill(conn, record)
        else:
            self.prefill(conn, record)
            conn.start_chunked("text/event-stream")
        conn.chunk(
            sse(
                {
                    **base,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                }
            )
        )

        def frame(tok: Any) -> bytes:
            delta = script_delta(tok, rfield) if isinstance(tok, dict) else {"content": tok}
            return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})

        def fault_frame(name: str) -> None:
            if self.common_fault(conn, name):
                return
            if name == "error_on_200":
                conn.chunk(sse(self.error_body(500, "injected mid-stream error")))
                if self.done_after_error:
                    conn.chunk(b"data: [DONE]\n\n")
            elif name == "malformed_frame":
                conn.chunk(b"data: {not json\n\n")
            conn.end_chunked()

        if not self.stream_tokens(conn, tokens, frame, fault, fault_frame):
            return
        conn.chunk(sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            n_prompt = len(self.prompt_text(record).split())
            conn.chunk(
                sse(
                    {
                        **base,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": n_prompt,
                            "completion_tokens": len(tokens),
                            "total_tokens": n_prompt + len(tokens),
                        },
                    }
                )
            )
        conn.chunk(b"data: [DONE]\n\n")
        conn.end_chunked()

    def responses(self, conn: Conn, record: RequestRecord) -> None:
        """``POST /v1/responses`` in the foreground (OpenAI's typed events; no background mode:
        the real vLLM is where that is tested), streaming and not, with the same tokens, script
        and faults as chat."""
        begun = self._open(conn, record, lambda model: self.error_body(404, f"The model `{model}` does not exist."))
        if begun is None:
            return
        body, fault, model = begun
        words: list[str] = []
        given = body.get("input")
        for item in given if isinstance(given, list) else [given]:
            content = item.get("content") if isinstance(item, dict) else item
            if isinstance(content, str):
                words += content.split()
        tokens, finish = self.tokens(body.get("max_output_tokens"))
        script = self.behavior.script
        pieces: list[dict[str, Any]] = list(script) if script is not None else [{"content": t} for t in tokens]
        status = "incomplete" if finish == "length" and script is None else "completed"
        rid = f"resp_{record.id}"
        usage = {
            "input_tokens": len(words),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(pieces),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(words) + len(pieces),
        }
        message = script_message(pieces, "reasoning")
        output: list[dict[str, Any]] = []
        if message.get("reasoning"):
            output.append(
                {
                    "type": "reasoning",
                    "id": "rs_0",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": message["reasoning"]}],
                }
            )
        output.append(
            {
                "type": "message",
                "id": "msg_0",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
            }
        )
        for call in message.get("tool_calls", []):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{call['id']}",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                    "status": "completed",
                }
            )
        response = {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": status,
            "error": None,
            "output": output,
            "usage": usage,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        }
        if not body.get("stream"):
            self.prefill(conn, record)
            self.decode_whole_answer(conn, record, pieces)
            if fault == "error_on_200":
                conn.send_json(200, self.error_body(500, "injected error under HTTP 200"))
                return
            conn.send_json(200, response)
            return

        sequence = 0

        def event(obj: dict[str, Any]) -> bytes:
            nonlocal sequence
            obj["sequence_number"] = sequence
            sequence += 1
            return b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), json.dumps(obj).encode())

        self.prefill(conn, record)
        conn.start_chunked("text/event-stream")
        pending = {**response, "status": "in_progress", "output": [], "usage": None}
        conn.chunk(event({"type": "response.created", "response": pending}))
        calls: dict[int, int] = {}

        def frame(piece: dict[str, Any]) -> bytes:
            if "tool" in piece:
                out = b""
                if piece["tool"] not in calls:
                    calls[piece["tool"]] = 1 + piece["tool"]
                    item = {
                        "type": "function_call",
                        "call_id": piece.get("id"),
                        "name": piece.get("name"),
                        "arguments": "",
                        "status": "in_progress",
                    }
                    out = event(
                        {"type": "response.output_item.added", "output_index": calls[piece["tool"]], "item": item}
                    )
                return out + event(
                    {
                        "type": "response.function_call_arguments.delta",
                        "output_index": calls[piece["tool"]],
                        "delta": piece.get("arguments", ""),
                    }
                )
            if "reasoning" in piece:
                return event(
                    {
                        "type": "response.reasoning_text.delta",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": piece["reasoning"],
                    }
                )
            return event(
                {
                    "type": "response.output_text.delta",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": piece.get("content", ""),
                }
            )

        def fault_frame(name: str) -> None:
            if self.common_fault(conn, name):
                return
            if name == "error_on_200":
                conn.chunk(
                    event(
                        {"type": "error", "code": "server_error", "message": "injected mid-stream error", "param": None}
                    )
                )
            elif name == "malformed_frame":
                conn.chunk(b"data: {not json\n\n")
            conn.end_chunked()

        if not self.stream_tokens(conn, pieces, frame, fault, fault_frame):  # type: ignore[arg-type]
            return
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        conn.chunk(event({"type": kind, "response": response}))
        conn.end_chunked()

    def _message_words(self, body: dict[str, Any]) -> list[str]:
        words: list[str] = []
        system = body.get("system")
        for text in [system] if isinstance(system, str) else []:
            words += text.split()
        turns = body.get("messages")
        for message in turns if isinstance(turns, list) else []:
            content = message.get("content") if isinstance(message, dict) else None
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
            for block in blocks if isinstance(blocks, list) else []:
                if isinstance(block, dict) and isinstance(block.get("text"), str):
                    words += block["text"].split()
        return words

    def count_message_tokens(self, conn: Conn, record: RequestRecord) -> None:
        """``POST /v1/messages/count_tokens``: the words of the system prompt and the turns."""
        body = record.body if isinstance(record.body, dict) else {}
        conn.send_json(200, {"input_tokens": len(self._message_words(body))})

    def messages(self, conn: Conn, record: RequestRecord) -> None:
        """``POST /v1/messages`` (Anthropic's Messages wire, as llama-server, vLLM, Ollama and LM
        Studio serve it), streaming and not, with the same tokens, script and faults as chat."""
        begun = self._open(
            conn,
            record,
            lambda model: {"type": "error", "error": {"type": "not_found_error", "message": f"model: {model}"}},
        )
        if begun is None:
            return
        body, fault, model = begun
        tokens, finish = self.tokens(body.get("max_tokens"))
        script = self.behavior.script
        pieces: list[dict[str, Any]] = list(script) if script is not None else [{"content": t} for t in tokens]
        called = any("tool" in p for p in pieces)
        stop_reason = "tool_use" if called else ("max_tokens" if finish == "length" and script is None else "end_turn")
        n_prompt = len(self._message_words(body))
        message = script_message(pieces, "reasoning")
        blocks: list[dict[str, Any]] = []
        if message.get("reasoning"):
            blocks.append({"type": "thinking", "thinking": message["reasoning"], "signature": "fake"})
        if message["content"]:
            blocks.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls", []):
            arguments = call["function"]["arguments"]
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "input": _object_of(arguments),
                }
            )
        usage = {"input_tokens": n_prompt, "cache_read_input_tokens": 0, "output_tokens": len(pieces)}
        whole: dict[str, Any] = {
            "id": f"msg_{record.id}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            self.prefill(conn, record)
            self.decode_whole_answer(conn, record, pieces)
            conn.send_json(200, whole)
            return

        def event(obj: dict[str, Any]) -> bytes:
            return b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), json.dumps(obj).encode())

        self.prefill(conn, record)
        conn.start_chunked("text/event-stream")
        start = {**whole, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
        conn.chunk(event({"type": "message_start", "message": start}))
        opened: dict[str, int] = {}  # "text", "thinking", "tool<n>" -> the open block's index

        def frame(piece: dict[str, Any]) -> bytes:
            key = f"tool{piece['tool']}" if "tool" in piece else ("thinking" if "reasoning" in piece else "text")
            out = b""
            if key not in opened:
                index = opened[key] = len(opened)
                if "tool" in piece:
                    block: dict[str, Any] = {
                        "type": "tool_use",
                        "id": piece.get("id"),
                        "name": piece.get("name"),
                        "input": {},
                    }
                elif key == "thinking":
                    block = {"type": "thinking", "thinking": ""}
                else:
                    block = {"type": "text", "text": ""}
                out = event({"type": "content_block_start", "index": index, "content_block": block})
            if "tool" in piece:
                delta = {"type": "input_json_delta", "partial_json": piece.get("arguments", "")}
            elif key == "thinking":
                delta = {"type": "thinking_delta", "thinking": piece["reasoning"]}
            else:
                delta = {"type": "text_delta", "text": piece.get("content", "")}
            return out + event({"type": "content_block_delta", "index": opened[key], "delta": delta})

        def fault_frame(name: str) -> None:
            if self.common_fault(conn, name):
                return
            if name == "error_on_200":
                error = {"type": "overloaded_error", "message": "injected mid-stream error"}
                conn.chunk(event({"type": "error", "error": error}))
            elif name == "malformed_frame":
                conn.chunk(b"event: content_block_delta\ndata: {not json\n\n")
            conn.end_chunked()

        if not self.stream_tokens(conn, pieces, frame, fault, fault_frame):  # type: ignore[arg-type]
            return
        for index in opened.values():
            conn.chunk(event({"type": "content_block_stop", "index": index}))
        usage = {"output_tokens": len(pieces), "input_tokens": n_prompt}
        conn.chunk(
            event(
                {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": usage}
            )
        )
        conn.chunk(event({"type": "message_stop"}))
        conn.end_chunked()


def _object_of(arguments: str) -> Any:
    """A scripted call's arguments as the object a ``tool_use`` block holds (a script cut short
    on purpose holds no JSON yet: an empty object, as a server would never send it)."""
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return {}


__all__ = ["FakeOpenAIServer"]
