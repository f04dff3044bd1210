"""Argument values of the XML-style formats (Qwen3-Coder, GLM, MiniMax-M2), back to JSON values.

These formats write a string argument as its raw text and anything else as JSON (or, in
Qwen3.5's template, Python's `str()`), so the text alone cannot tell "42" from 42. Like the
serving engines' parsers, the tool's JSON schema decides: a parameter typed string stays text,
numbers/booleans/objects/arrays are converted, and a value that does not convert stays text.
A parameter the schema does not describe follows the family's rule (`untyped`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Literal

# Lower-cased spellings a model writes for a boolean (Qwen3.5's template renders Python's True).
TRUE_WORDS = frozenset({"true"})
FALSE_WORDS = frozenset({"false"})
# Spellings of null (Python's None through `str()`).
NULL_WORDS = frozenset({"null", "none"})


def schema_types(schema: object) -> set[str]:
    """The JSON types a parameter schema allows ("type", type lists, anyOf/oneOf/allOf, enum)."""
    if not isinstance(schema, Mapping):
        return set()
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared.lower())
    elif isinstance(declared, list):
        types.update(t.lower() for t in declared if isinstance(t, str))
    types.update(map(_json_type, schema.get("enum") or ()))
    for key in ("anyOf", "oneOf", "allOf"):
        for choice in schema.get(key) or ():
            types |= schema_types(choice)
    return types


def convert_value(raw: str, schema: object, *, untyped: Literal["string", "json"]) -> object:
    """The JSON value of one argument written as text, guided by its parameter schema."""
    types = schema_types(schema)
    if not types:
        return _json_or_text(raw) if untyped == "json" else raw
    text = raw.strip()
    if text.lower() in NULL_WORDS and types != {"string"}:
        return None
    for kind in ("integer", "number", "boolean", "object", "array"):
        if kind in types and (converted := _as(kind, text)) is not _NO:
            return converted
    return raw


_NO = object()


def _as(kind: str, text: str) -> object:
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            number = float(text)
            if not math.isfinite(number):
                return _NO
            exact_int = number.is_integer() and not any(c in text for c in ".eE")
            return int(number) if exact_int else number
    except ValueError:
        return _NO
    if kind == "boolean":
        lowered = text.lower()
        return True if lowered in TRUE_WORDS else False if lowered in FALSE_WORDS else _NO
    value = _json_or_text(text)
    return value if isinstance(value, dict if kind == "object" else list) else _NO


def _json_or_text(raw: str) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _json_type(value: object) -> str:
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (list, "array"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else "string"


def parameter_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """{function name: {parameter name: schema}} from OpenAI tool schemas (bare functions too)."""
    out: dict[str, dict] = {}
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function", tool)
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        out[function["name"]] = dict(properties) if isinstance(properties, Mapping) else {}
    return out
