"""MiniMax-M1 (JSON lines in `<tool_calls>`) and MiniMax-M2 (`<invoke>` XML).

M1, as its template's tool instructions describe it:

    <tool_calls>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_calls>

M2 (also M2.1 / M2.5 / M2.7):

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

M2 writes strings raw and anything else as JSON; a parameter the schema does not describe stays
text, as SGLang's minimax_m2 parser keeps it.
"""

from __future__ import annotations

import json

from eagle_synth.errors import Malformed
from eagle_synth.toolcalls.answer import Cursor, ToolFormat, call_name, json_call
from eagle_synth.toolcalls.values import convert_value

M1_BEGIN = "<tool_calls>"
M1_END = "</tool_calls>"
M2_BEGIN = "<minimax:tool_call>"
M2_END = "</minimax:tool_call>"
INVOKE_BEGIN = '<invoke name="'
INVOKE_END = "</invoke>"
PARAMETER_BEGIN = '<parameter name="'
PARAMETER_END = "</parameter>"
# Where a name inside an opening tag ends.
TAG_CLOSE = '">'

_decoder = json.JSONDecoder()


def parse_m1(cursor: Cursor, schemas: dict[str, dict], calls: list[dict]) -> None:
    cursor.expect(M1_BEGIN)
    body, _ = cursor.until(M1_END)
    position = 0
    while body[position:].strip():
        position += len(body[position:]) - len(body[position:].lstrip())
        try:
            _, end = _decoder.raw_decode(body, position)
        except ValueError as exc:
            raise Malformed(f"tool call is not valid JSON: {exc}") from None
        calls.append(json_call(body[position:end]))
        position = end


def parse_m2(cursor: Cursor, schemas: dict[str, dict], calls: list[dict]) -> None:
    while cursor.take(M2_BEGIN):
        while not cursor.take(M2_END):
            cursor.expect(INVOKE_BEGIN)
            name = call_name(cursor.until(TAG_CLOSE)[0])
            parameters = schemas.get(name, {})
            arguments: dict = {}
            while not cursor.take(INVOKE_END):
                cursor.expect(PARAMETER_BEGIN)
                key = cursor.until(TAG_CLOSE)[0].strip()
                value, _ = cursor.until(PARAMETER_END)
                if key in arguments:
                    raise Malformed(f"parameter {key!r} of {name} given twice")
                arguments[key] = convert_value(value, parameters.get(key), untyped="string")
            calls.append({"name": name, "arguments": arguments})


MINIMAX_M1 = ToolFormat(name="minimax_m1", start=M1_BEGIN, parse_section=parse_m1, end_markers=("<end_of_sentence>",))
MINIMAX_M2 = ToolFormat(name="minimax_m2", start=M2_BEGIN, parse_section=parse_m2, end_markers=("[e~[",))
