"""The "At a glance" section of docs/api.md, rendered from the code's own signatures.

``python scripts/api_glance.py --write`` rewrites the section; ``tests/test_docs_code.py`` fails
when the page and the code disagree (a signature changed, an option added)."""

from __future__ import annotations

import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api.md"
BEGIN, END = "<!-- glance: begin (scripts/api_glance.py) -->", "<!-- glance: end -->"


def _type(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    text = re.sub(r"\b(?:abstract_client|typing|threading)\.(?:\w+\.)*", "", text)
    return text.replace("NoneType", "None")


def _signature(fn: Any, name: str, *, skip_options: bool = False) -> str:
    sig = inspect.signature(fn)
    parts: list[str] = []
    star = False
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        if skip_options and p.kind is p.KEYWORD_ONLY:
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_KEYWORD:
            parts.append("**options" if skip_options else f"**{p.name}")
            continue
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    ret = "" if sig.return_annotation is sig.empty else f" -> {_type(sig.return_annotation)}"
    return f"`{name}({', '.join(parts)}){ret}`"


def render() -> str:
    import abstract_client as ac
    from abstract_client.llm import _DEFAULTS

    llm = ac.LLM
    rows = [
        ("create an LLM", _signature(ac.create_llm, "create_llm")),
        ("generate", _signature(llm.generate, "llm.generate", skip_options=True)),
        ("... async", _signature(llm.agenerate, "await llm.agenerate", skip_options=True)),
        ("stream", _signature(llm.stream, "llm.stream", skip_options=True)),
        ("... async", _signature(llm.astream, "llm.astream", skip_options=True)),
        ("embed", _signature(llm.embed, "llm.embed")),
        ("count tokens", _signature(llm.count_tokens, "llm.count_tokens")),
        ("stop one call", _signature(llm.cancel, "llm.cancel")),
        ("stop every call", _signature(llm.cancel_all, "llm.cancel_all")),
        ("models", _signature(llm.list_models, "llm.list_models")),
        ("load", _signature(llm.load_model, "llm.load_model")),
        ("eject", _signature(llm.unload_model, "llm.unload_model")),
        ("readiness", _signature(llm.wait_ready, "llm.wait_ready")),
        ("close", _signature(llm.close, "llm.close")),
        ("a stream's answer", _signature(ac.SyncGenerationStream.result, "stream.result")),
        ("stop a stream", _signature(ac.SyncGenerationStream.cancel, "stream.cancel")),
        ("a Stop button", _signature(ac.AbortController.abort, "AbortController().abort")),
        ("a deadline as a stop", _signature(ac.AbortSignal.timeout, "AbortSignal.timeout")),
    ]
    out = [BEGIN, "", "| what | call |", "|---|---|"]
    out += [f"| {what} | {call} |" for what, call in rows]
    out += [
        "",
        "`**options` of the four generation methods (`GenerateOptions`, keyword-only; any other",
        "keyword is a `TypeError` unless the lane declares it in `llm.provider.call_options`):",
        "",
        "| option | type | default |",
        "|---|---|---|",
    ]
    hints = typing.get_type_hints(ac.GenerateOptions)
    for name in ac.GenerateOptions.__annotations__:
        kind = _type(hints[name]).replace("|", "\\|")  # a table cell: GFM splits on a bare pipe
        out.append(f"| `{name}` | `{kind}` | `{_DEFAULTS.get(name)!r}` |")
    out += ["", END]
    return "\n".join(out)


def current() -> str:
    text = API.read_text()
    return text[text.index(BEGIN) : text.index(END) + len(END)]


if __name__ == "__main__":
    if "--write" in sys.argv:
        API.write_text(API.read_text().replace(current(), render()))
    else:
        sys.stdout.write(render() + "\n")
