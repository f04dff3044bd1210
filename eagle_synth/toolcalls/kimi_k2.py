"""Kimi-K2 / K2-Thinking / K2.5: a section of calls, each with an id that names the function.

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

The id (`functions.NAME:IDX`) is what Kimi's template renders back for an assistant call and
names in the tool result ("## Return of ID"), so it is kept as the call's "id".
"""

from __future__ import annotations

import re

from eagle_synth.errors import Malformed
from eagle_synth.toolcalls.answer import Cursor, ToolFormat, json_arguments

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
# "functions.NAME:IDX" (some checkpoints drop the "functions." prefix).
CALL_ID = re.compile(r"(?:functions\.)?(?P<name>[^\s:]+):(?P<index>\d+)")


def parse_section(cursor: Cursor, schemas: dict[str, dict], calls: list[dict]) -> None:
    cursor.expect(SECTION_BEGIN)
    while cursor.take(CALL_BEGIN):
        call_id = cursor.until(ARGUMENT_BEGIN)[0].strip()
        if (match := CALL_ID.fullmatch(call_id)) is None:
            raise Malformed(f"tool call id {call_id[:60]!r} is not functions.NAME:INDEX")
        arguments = json_arguments(cursor.until(CALL_END)[0])
        calls.append({"id": call_id, "name": match["name"], "arguments": arguments})
    cursor.expect(SECTION_END)


KIMI_K2 = ToolFormat(name="kimi_k2", start=SECTION_BEGIN, parse_section=parse_section, end_markers=("<|im_end|>",))
