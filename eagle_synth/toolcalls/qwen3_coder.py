"""Qwen3-Coder / Qwen3.5 / Qwen3.6: XML-style parameters inside `<tool_call>`.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

The template puts a newline after `<parameter=NAME>` and before `</parameter>`; exactly those
two are removed from the value. Strings are written raw, objects and lists as JSON, other values
through Python's `str()`, so the tool schema decides the type (see values.py); a parameter the
schema does not describe stays text, as SGLang's qwen3_coder parser keeps it.
"""

from __future__ import annotations

from eagle_synth.errors import Malformed
from eagle_synth.toolcalls.answer import Cursor, ToolFormat, call_name
from eagle_synth.toolcalls.values import convert_value

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"
FUNCTION_BEGIN = "<function="
FUNCTION_END = "</function>"
PARAMETER_BEGIN = "<parameter="
PARAMETER_END = "</parameter>"


def parse_section(cursor: Cursor, schemas: dict[str, dict], calls: list[dict]) -> None:
    while cursor.take(CALL_BEGIN):
        cursor.expect(FUNCTION_BEGIN)
        name = call_name(cursor.until(">")[0])
        parameters = schemas.get(name, {})
        arguments: dict = {}
        while not cursor.take(FUNCTION_END):
            cursor.expect(PARAMETER_BEGIN)
            key = call_name(cursor.until(">")[0])
            value, _ = cursor.until(PARAMETER_END)
            value = value.removeprefix("\n").removesuffix("\n")
            if key in arguments:
                raise Malformed(f"parameter {key!r} of {name} given twice")
            arguments[key] = convert_value(value, parameters.get(key), untyped="string")
        cursor.expect(CALL_END)
        calls.append({"name": name, "arguments": arguments})


QWEN3_CODER = ToolFormat(
    name="qwen3_coder", start=CALL_BEGIN, parse_section=parse_section, end_markers=("<|im_end|>", "<|endoftext|>")
)
