"""Tools and structured output under the contract: what is sent, and what a complete answer is.

* ``prepare`` runs inside the call's first step, after admission (a stop already set has sent
  nothing and prepared nothing). A forced tool call (``"required"`` or a named tool) on a backend
  without native tool calling is rewritten into schema-constrained output of the call itself, so
  tool calls work on any model; ``"auto"`` there raises ``NotSupportedError`` (tools are never
  silently ignored).
* Images: a call with image parts on a backend or model that takes none
  (``Provider.images_refused``) is a ``NotSupportedError`` here, before the generation is sent.
* ``finish_output`` runs only once the answer was judged complete (rule 7): parsing and schema
  validation never happen after a stop, and a stop is never reported as a validation error.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import NotSupportedError, OutputValidationError
from ..images import has_images
from ..output.fallback import ToolFallback
from ..output.structured import call_schema, check_tool_call, forced_tools, parse_output
from ..types import ResponseFormat
from .call import Call
from .lifecycle import Event, Phase
from .translate import attach

__all__ = ["finish_output", "prepare"]


async def prepare(call: Call) -> None:
    """Decide, once per call, what the provider is sent (see the module docstring); the call
    enters PREPARED once it is decided — a refused image or tool choice leaves it ADMITTED."""
    if call.phase is not Phase.ADMITTED:  # prepared once (a retry keeps it)
        return
    await _fix_the_request(call)
    call.handle(Event.PREPARE)


async def _fix_the_request(call: Call) -> None:
    request = call.spec.request
    if has_images(request.messages):
        refused = await call.provider.images_refused(request)
        if refused:
            raise NotSupportedError(refused, provider=call.provider.name, model=request.model)
    if not request.tools:
        return
    if await call.provider.native_tools(request):
        return
    if request.tool_choice == "none":
        call.sent_request = replace(request, tools=None, tool_choice=None)
        return
    forced = forced_tools(request.tools, request.tool_choice)
    if not forced:
        raise NotSupportedError(
            f"{call.provider.name}: this model has no native tool calling, so tool_choice="
            f"{request.tool_choice or 'auto'!r} cannot be honoured; pass tool_choice='required' or a named tool "
            "(carried as schema-constrained output of the call), or tools=None",
            provider=call.provider.name,
            model=request.model,
        )
    schema, wrapped = call_schema(forced)
    call.sent_request = replace(
        request, tools=None, tool_choice=None, response_format=ResponseFormat(schema=schema, name="tool_call")
    )
    call.progress.fallback = ToolFallback(forced, wrapped)


def finish_output(call: Call) -> None:
    """Parse and validate a complete answer into ``progress.tool_calls`` / ``progress.parsed``;
    ``OutputValidationError`` (with everything produced attached) when it does not match."""
    p = call.progress
    try:
        if p.fallback is not None and p.fallback.wrapped and not p.tools:
            raw = p.fallback.raw_text()
            raise OutputValidationError(
                "the forced tool call is not a {name, arguments} object of a given tool", raw_text=raw, errors=[raw]
            )
        bad = p.tools.unparsed()
        if bad:
            raise OutputValidationError(
                f"the arguments of tool call {bad[0].name or bad[0].index!r} are not a JSON object",
                raw_text=bad[0].arguments_fragment,
                errors=[f"call #{b.index} ({b.name}): {b.arguments_fragment[:200]!r}" for b in bad],
            )
        calls = p.tools.complete(finished=True)
        for tool_call in calls:
            check_tool_call(tool_call, call.spec.request.tools)
        p.tool_calls = calls
        if calls and p.finish_reason == "stop":
            p.finish_reason = "tool_calls"
        fmt = call.spec.request.response_format
        if fmt is not None and not calls:
            p.parsed = parse_output(fmt, p.text)
    except OutputValidationError as err:
        if p.finish_reason == "length":
            err.message += " (the answer was cut at max_tokens: finish_reason='length')"
            err.args = (err.message,)
        err.tool_calls = p.tools.complete(finished=False) if not p.tool_calls else p.tool_calls
        raise attach(call, err) from None
