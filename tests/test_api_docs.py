"""The public API is documented where a user reads it: every exported callable, every public
method and property of the objects it returns, and the generation methods' parameters,
returns and raises."""

from __future__ import annotations

import inspect

import abstract_client
from abstract_client import LLM, AbortController, AbortSignal, GenerationStream, SyncGenerationStream


def test_every_export_has_a_docstring() -> None:
    missing = [n for n in abstract_client.__all__ if callable(getattr(abstract_client, n))]
    missing = [n for n in missing if not inspect.getdoc(getattr(abstract_client, n))]
    assert missing == []


def test_every_public_method_and_property_has_a_docstring() -> None:
    missing = []
    for cls in (LLM, SyncGenerationStream, GenerationStream, AbortController, AbortSignal):
        for name, member in vars(cls).items():
            if name.startswith("_") or not (callable(member) or isinstance(member, (property, staticmethod))):
                continue
            if not inspect.getdoc(member):
                missing.append(f"{cls.__name__}.{name}")
    assert missing == []


def test_the_sync_generation_methods_document_args_returns_and_raises() -> None:
    for method in (LLM.generate, LLM.stream, LLM.embed, LLM.count_tokens, LLM.unload_model):
        doc = inspect.getdoc(method) or ""
        for section in ("Returns:", "Raises:"):
            assert section in doc, (method.__name__, section)
    for key in abstract_client.GenerateOptions.__annotations__:
        assert key in (inspect.getdoc(abstract_client.GenerateOptions) or ""), key
