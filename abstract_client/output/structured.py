"""What ``tools=``, ``tool_choice=`` and ``response_format=`` accept, normalised, and the
validation of what comes back. Pure functions: no I/O, no engine.

* ``tools``: OpenAI function specs, the bare ``{"name", "parameters"}`` form, or a plain Python
  function with type hints (its schema derived from the signature, its description from the
  docstring).
* ``response_format``: a JSON-schema dict, OpenAI's ``{"type": "json_schema", ...}`` or
  ``{"type": "json_object"}`` forms, or a pydantic model class (pydantic is never imported here:
  the class is recognised by its ``model_json_schema``/``model_validate`` methods).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import types
import typing
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import OutputValidationError
from ..types import ResponseFormat, ToolCall

__all__ = [
    "ToolChoice",
    "call_schema",
    "check_tool_call",
    "forced_tools",
    "function_tool",
    "normalize_tool_choice",
    "normalize_tools",
    "parse_output",
    "response_format_from",
    "schema_errors",
    "type_schema",
]

ToolChoice = str | dict[str, Any] | None
_CHOICES = ("auto", "none", "required")


# -- tools ------------------------------------------------------------------------------------------


def normalize_tools(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """Tools as OpenAI function definitions, each checked (name, JSON schema parameters)."""
    if tools is None:
        return None
    if isinstance(tools, (dict, str)) or callable(tools):
        raise TypeError("tools= takes a list of tool specs or functions")
    specs = [_tool_spec(t) for t in tools]
    names = Counter(spec["function"]["name"] for spec in specs)  # linear: count() per name was quadratic
    duplicated = sorted(n for n, k in names.items() if k > 1)
    if duplicated:
        raise ValueError(f"tool names must be unique: {duplicated}")
    return specs


def _tool_spec(tool: Any) -> dict[str, Any]:
    if isinstance(tool, dict):
        if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
            fn = tool["function"]
        elif "name" in tool:
            fn = tool
        else:
            raise ValueError(f"not a function tool spec: {str(tool)[:200]}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"a tool needs a name: {str(tool)[:200]}")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise TypeError(f"tool {fn['name']!r}: description must be a string")
        parameters = fn.get("parameters")
        if parameters is None:  # absent or null: a tool that takes nothing (false is not a schema here)
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise TypeError(f"tool {fn['name']!r}: parameters must be a JSON-schema object")
        _check_schema(parameters, f"tool {fn['name']!r}'s parameters")
        spec = {"name": fn["name"], "parameters": parameters}
        if fn.get("description"):
            spec["description"] = fn["description"]
        return {"type": "function", "function": spec}
    if callable(tool):
        return function_tool(tool)
    raise TypeError(f"a tool is a spec dict or a function, not {type(tool).__name__}")


def function_tool(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool spec of a Python function: parameters from its type hints (a parameter
    without a default is required), description from the docstring's first paragraph.

    With pydantic installed (the ``dev`` extra has it; most users do) the parameters' schema is
    pydantic's own (``create_model`` over the signature): tuples, TypedDicts, dataclasses,
    nested models, Literal, Optional and Annotated constraints come out as pydantic users expect,
    with ``$defs``. Without it, :func:`type_schema` covers the common hints."""
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, tuple[Any, Any]] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (hints.get(name, Any), default)
    parameters = _pydantic_parameters(fn.__name__, fields)
    if parameters is None:
        defs: dict[str, Any] = {}
        parameters = {
            "type": "object",
            "properties": {name: type_schema(tp, defs) for name, (tp, _) in fields.items()},
            "required": [name for name, (_, default) in fields.items() if default is ...],
        }
        if defs:
            parameters["$defs"] = defs
    parameters["additionalProperties"] = False  # strict: a call may not invent arguments
    spec: dict[str, Any] = {"name": fn.__name__, "parameters": parameters}
    doc = inspect.getdoc(fn)
    if doc:
        spec["description"] = doc.split("\n\n")[0].strip()
    return {"type": "function", "function": spec}


def _pydantic_parameters(name: str, fields: dict[str, tuple[Any, Any]]) -> dict[str, Any] | None:
    """pydantic's JSON schema of the arguments, or None without pydantic."""
    try:
        import warnings

        import pydantic
        from pydantic.json_schema import PydanticJsonSchemaWarning
    except ImportError:
        return None
    try:
        model = pydantic.create_model(f"{name}_arguments", **fields)  # type: ignore[call-overload]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PydanticJsonSchemaWarning)  # a default JSON cannot hold is left out
            schema: dict[str, Any] = model.model_json_schema()
    except pydantic.PydanticUserError as exc:
        if exc.code == "typed-dict-version":  # typing.TypedDict on Python < 3.12: ours can read it
            return None
        raise TypeError(f"no JSON schema for the parameters of {name}(): {exc}") from exc
    except pydantic.PydanticSchemaGenerationError as exc:
        raise TypeError(f"no JSON schema for the parameters of {name}(): {exc}") from exc
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)  # "City" for city: noise in every prompt
    schema.setdefault("required", [])
    return schema


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def type_schema(tp: Any, defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """JSON schema of a type hint without pydantic: str/int/float/bool/None, list/set, tuples
    (fixed and ``tuple[X, ...]``), dict, Literal, Optional and unions, Enum subclasses, TypedDicts
    and dataclasses (their fields), pydantic models; anything else accepts any value.

    A pydantic model's ``$defs`` are moved into ``defs`` (its ``$ref``s point at the root of the
    document the schema ends up in: pass the same dict for every part, and put it at the root)."""
    defs = {} if defs is None else defs
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if tp is Any:
        return {}
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if inspect.isclass(tp) and hasattr(tp, "model_json_schema"):
        schema: dict[str, Any] = tp.model_json_schema()
        defs.update(schema.pop("$defs", {}))
        return schema
    if typing.is_typeddict(tp) or dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return {
            "type": "object",
            "properties": {k: type_schema(v, defs) for k, v in hints.items()},
            "required": _required_fields(tp, hints),
        }
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_schema(args[0], defs)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [type_schema(a, defs) for a in args]}
    if origin is tuple and args and args[-1] is not Ellipsis:
        n = len(args)
        return {"type": "array", "prefixItems": [type_schema(a, defs) for a in args], "minItems": n, "maxItems": n}
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set):
        return {"type": "array", "items": type_schema(args[0], defs)} if args else {"type": "array"}
    if origin is dict or tp is dict:
        if len(args) == 2:
            return {"type": "object", "additionalProperties": type_schema(args[1], defs)}
        return {"type": "object"}
    return {}


def _required_fields(tp: Any, hints: dict[str, Any]) -> list[str]:
    if dataclasses.is_dataclass(tp):
        return [
            f.name
            for f in dataclasses.fields(tp)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
    return sorted(getattr(tp, "__required_keys__", hints))


def normalize_tool_choice(choice: ToolChoice, tools: list[dict[str, Any]] | None) -> ToolChoice:
    """``tool_choice`` as ``none``/``auto``/``required`` or a named function, checked against the
    tools."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in _CHOICES:
            raise ValueError(f"tool_choice must be one of {_CHOICES} or a named function, not {choice!r}")
        if choice == "required" and not tools:
            raise ValueError('tool_choice="required" needs tools=')
        return choice
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise ValueError(
                f"a named tool_choice is {{'type': 'function', 'function': {{'name': ...}}}}, not {choice!r}"
            )
        if not any(t["function"]["name"] == name for t in tools or []):
            raise ValueError(f"tool_choice names {name!r}, which is not in tools=")
        return {"type": "function", "function": {"name": name}}
    raise TypeError(f"tool_choice must be a string or a dict, not {type(choice).__name__}")


def forced_tools(tools: list[dict[str, Any]] | None, choice: ToolChoice) -> list[dict[str, Any]]:
    """The tools a call must use: the named one, all of them for ``"required"``, else none."""
    if not tools:
        return []
    if choice == "required":
        return tools
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        return [t for t in tools if t["function"]["name"] == name]
    return []


def call_schema(tools: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The JSON schema of a forced call, for backends without native tool calling, and whether
    it is wrapped. One tool: its parameters (the output IS the arguments); several: one of
    ``{"name": <const>, "arguments": <parameters>}``."""
    if len(tools) == 1:
        return tools[0]["function"]["parameters"], False
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": t["function"]["name"]}, "arguments": t["function"]["parameters"]},
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    return {"anyOf": options}, True


# -- structured output ------------------------------------------------------------------------------


def response_format_from(value: Any) -> ResponseFormat | None:
    """``response_format`` (a JSON schema, a pydantic model, ``json_object``) as the wire's dict,
    checked."""
    if value is None:
        return None
    if isinstance(value, ResponseFormat):
        return value
    if inspect.isclass(value) and hasattr(value, "model_json_schema") and hasattr(value, "model_validate"):
        return ResponseFormat(schema=value.model_json_schema(), name=value.__name__, model=value)
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "text" and len(value) == 1:  # OpenAI's "plain text": no format at all
            return None
        if kind == "json_object":
            schema = value.get("schema") if isinstance(value.get("schema"), dict) else None
            if schema is not None:
                _check_schema(schema)
            return ResponseFormat(schema=schema)
        if kind == "json_schema" and isinstance(value.get("json_schema"), dict):
            inner = value["json_schema"]
            if not isinstance(inner.get("schema"), dict):
                raise ValueError("response_format json_schema needs a schema")
            _check_schema(inner["schema"])
            return ResponseFormat(schema=inner["schema"], name=str(inner.get("name") or "answer"))
        _check_schema(value)
        return ResponseFormat(schema=value)
    raise TypeError(f"response_format takes a JSON-schema dict or a pydantic model class, not {type(value).__name__}")


def _check_schema(schema: dict[str, Any], what: str = "response_format") -> None:
    """A usable JSON schema, or a ``ValueError`` before anything is sent: valid against its
    metaschema, and every ``$ref`` local and resolvable (a broken one would otherwise surface as
    a raw jsonschema error after the whole generation ran)."""
    from jsonschema.validators import validator_for  # type: ignore[import-untyped]

    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except RecursionError:
        raise ValueError(f"{what} nests too deep to be a usable JSON schema") from None
    except Exception as exc:  # jsonschema's SchemaError: a clear ValueError before anything is sent
        raise ValueError(f"{what} is not a valid JSON schema: {getattr(exc, 'message', exc)}") from None
    nodes = [item for item in _walk(schema) if isinstance(item, dict)]  # every subschema, walked once
    for node in nodes:
        ref = node.get("$ref")
        if not isinstance(ref, str):
            continue
        if not ref.startswith("#"):
            raise ValueError(f"{what}: only local $refs are supported, not {ref!r}")
        _resolve(schema, ref, what)
    _refuse_ref_loops(schema, nodes, what)


def _resolve(schema: dict[str, Any], ref: str, what: str) -> Any:
    node: Any = schema
    for part in [p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/") if p]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ValueError(f"{what}: $ref {ref!r} points nowhere in the schema")
    return node


# Keywords that apply their subschemas to the SAME instance: a $ref cycle through only these never
# descends into the value, so validating anything against it recurses forever (``{"$ref": "#"}``
# made a RecursionError — after the whole generation had run). Recursion through properties or
# items is fine: it consumes the value.
_SAME_INSTANCE_LISTS = ("allOf", "anyOf", "oneOf")
_SAME_INSTANCE_ONE = ("not", "if", "then", "else")
_MAX_SCHEMA_NODES = 20_000


def _refuse_ref_loops(schema: dict[str, Any], nodes: list[dict[str, Any]], what: str) -> None:
    done: set[int] = set()
    if len(nodes) > _MAX_SCHEMA_NODES:
        raise ValueError(f"{what} has more than {_MAX_SCHEMA_NODES} subschemas")
    for start in nodes:
        if id(start) in done:
            continue
        # depth-first along same-instance edges, iteratively: (node, its edges left)
        on_path: set[int] = {id(start)}
        stack: list[tuple[dict[str, Any], list[Any]]] = [(start, _same_instance(schema, start, what))]
        while stack:
            node, edges = stack[-1]
            if not edges:
                stack.pop()
                on_path.discard(id(node))
                done.add(id(node))
                continue
            nxt = edges.pop()
            if not isinstance(nxt, dict) or id(nxt) in done:
                continue
            if id(nxt) in on_path:
                raise ValueError(
                    f"{what}: its $refs loop back without descending into the value (validation would never end)"
                )
            on_path.add(id(nxt))
            stack.append((nxt, _same_instance(schema, nxt, what)))


def _same_instance(schema: dict[str, Any], node: dict[str, Any], what: str) -> list[Any]:
    edges: list[Any] = []
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        edges.append(_resolve(schema, ref, what))
    for key in _SAME_INSTANCE_LISTS:
        if isinstance(node.get(key), list):
            edges.extend(node[key])
    edges.extend(node.get(key) for key in _SAME_INSTANCE_ONE)
    return edges


def _walk(node: Any) -> list[Any]:
    out: list[Any] = []
    stack = [node]
    while stack:
        item = stack.pop()
        out.append(item)
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return out


def schema_errors(schema: dict[str, Any] | None, value: Any) -> list[str]:
    """Why ``value`` does not match ``schema`` (empty: it does)."""
    if schema is None:
        return []
    from jsonschema.validators import validator_for  # type: ignore[import-untyped]

    validator = validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(value)]


def parse_output(fmt: ResponseFormat, text: str) -> Any:
    """The validated answer: the pydantic model's instance, or the JSON value. Raises
    ``OutputValidationError`` (with the raw text) when it is not JSON or does not match."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise OutputValidationError(
            f"the answer is not JSON: {exc}", raw_text=text, errors=[str(exc)], partial_text=text
        ) from None
    if fmt.model is not None:
        try:
            return fmt.model.model_validate(value)
        except Exception as exc:  # pydantic's ValidationError
            errors_of = getattr(exc, "errors", None)
            listed = errors_of() if callable(errors_of) else [exc]
            errors = [str(e) for e in listed]
            raise OutputValidationError(
                f"the answer does not match {fmt.name}", raw_text=text, errors=errors, partial_text=text
            ) from None
    if fmt.schema is None and not isinstance(value, dict):
        raise OutputValidationError(
            "the answer is not a JSON object", raw_text=text, errors=["not an object"], partial_text=text
        )
    errors = schema_errors(fmt.schema, value)
    if errors:
        raise OutputValidationError(
            f"the answer does not match the {fmt.name} schema", raw_text=text, errors=errors, partial_text=text
        )
    return value


def check_tool_call(call: ToolCall, tools: list[dict[str, Any]] | None) -> None:
    """A complete call must name a given tool and carry arguments of its parameters' schema."""
    if tools is None:
        return
    spec = next((t["function"] for t in tools if t["function"]["name"] == call.name), None)
    if spec is None:
        raise OutputValidationError(
            f"the model called an unknown tool {call.name!r}", raw_text=call.arguments_json, errors=["unknown tool"]
        )
    errors = schema_errors(spec.get("parameters"), call.arguments)
    if errors:
        raise OutputValidationError(
            f"the arguments of {call.name} do not match its parameters", raw_text=call.arguments_json, errors=errors
        )
