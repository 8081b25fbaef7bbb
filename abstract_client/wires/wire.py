"""A wire as a value: one dialect of a generation route, and the registry of them.

A :class:`Wire` holds all a lane needs to speak a dialect: where it is (its path), how a
request becomes its body (``encode``), how its streamed bytes become chunks (a fresh sans-io
:class:`~abstract_client.http.chunk_decoder.ChunkDecoder` per answer, driven by the one read
loop ``http.wire.read_chunks``), how a
whole body becomes a ``Completion``, and what the dialect can do (resume, cancel by id, count
tokens). A lane declares the *families* of wires its server serves (``"v1"``: anything under
``/v1``) and one quirks hook, ``adjust(wire, body, request)``; adding a dialect is one module
and one :func:`register` call, no lane touched (``tests/test_fifth_wire.py`` adds one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..http.chunk_decoder import ChunkDecoder
from ..provider import Completion, EmbeddingBatch
from ..types import GenerationRequest
from .folds import Carry

__all__ = ["V1", "WIRES", "Embeddings", "Wire", "register", "response_format"]


V1 = frozenset({"v1"})


@dataclass(frozen=True, slots=True)
class Embeddings:
    """A dialect's embeddings route: its path from the server's root, its body for ``texts``
    (with the lane's ``extra_body``), and the batch its JSON answer is."""

    path: str
    encode: Callable[[list[str], str | None, int | None, dict[str, Any]], dict[str, Any]]
    batch: Callable[[Any], EmbeddingBatch]


def response_format(body: dict[str, Any], schema: Any) -> None:
    """OpenAI's ``response_format`` (chat, and ``/v1/completions`` on the servers that take it)."""
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@dataclass(frozen=True, slots=True)
class Wire:
    """One dialect (see the module docstring). ``path`` is under the server's ``/v1`` for a wire
    of the ``"v1"`` family, else from its root; ``route`` picks a path by request where the
    dialect has more than one (Ollama's raw ``/api/generate``)."""

    name: str
    path: str
    encode: Callable[[GenerationRequest, bool], dict[str, Any]]  # (request, stream) -> body
    decoder: Callable[[], ChunkDecoder]  # a fresh one per streamed answer
    completion: Callable[[Any], Completion]  # a whole JSON body -> the answer
    families: frozenset[str] = V1
    route: Callable[[GenerationRequest], str] | None = None
    resumes: bool = False  # a background answer the server keeps past a drop, stopped by its id
    # the body of ``{path}/count_tokens``, where the dialect counts a request's input tokens
    # (answered ``{"input_tokens": n}``)
    count_tokens: Callable[[GenerationRequest], dict[str, Any]] | None = None
    # how a plain call rides the dialect's stream and is folded back into its plain body
    # (``folds.py``), for the SDKs' transports: a stop then ends it at the next token
    carry: Carry | None = None
    # where the dialect carries a JSON schema the answer must follow: (body, schema) -> None, in
    # place (a lane's ``json_schema=`` option puts it there)
    schema_field: Callable[[dict[str, Any], Any], None] = response_format
    image_urls: bool = True  # the dialect takes an image by URL (False: as data only)
    # the dialect's own embeddings route, if it has one; None: the server's ``/v1/embeddings``
    embeddings: Embeddings | None = None

    def path_for(self, request: GenerationRequest) -> str:
        return self.path if self.route is None else self.route(request)


WIRES: dict[str, Wire] = {}


def register(wire: Wire) -> Wire:
    """Make ``wire`` one a lane may be asked for by name (``create_llm(..., wire=name)``)."""
    WIRES[wire.name] = wire
    return wire
