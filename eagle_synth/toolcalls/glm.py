"""GLM-4.5 / 4.6 / 4.7 / 5: the name after `<tool_call>`, then key/value pairs.

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.5/4.6 put newlines between the parts; GLM-4.7 and 5 write them back to back. Strings are
raw, anything else JSON; a parameter the schema does not describe is read as JSON when it parses
(as SGLang's GLM parser does), else kept as text.
"""

from __future__ import annotations

from eagle_synth.errors import Malformed
from eagle_synth.toolcalls.answer import Cursor, ToolFormat, call_name
from eagle_synth.toolcalls.values import convert_value

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"
KEY_BEGIN = "<arg_key>"
KEY_END = "</arg_key>"
VALUE_BEGIN = "<arg_value>"
VALUE_END = "</arg_value>"


def parse_section(cursor: Cursor, schemas: dict[str, dict], calls: list[dict]) -> None:
    while cursor.take(CALL_BEGIN):
        name = call_name(cursor.upto("\n", KEY_BEGIN, CALL_END))
        parameters = schemas.get(name, {})
        arguments: dict = {}
        while not cursor.take(CALL_END):
            cursor.expect(KEY_BEGIN)
            key = cursor.until(KEY_END)[0].strip()
            cursor.expect(VALUE_BEGIN)
            value, _ = cursor.until(VALUE_END)
            if key in arguments:
                raise Malformed(f"argument {key!r} of {name} given twice")
            arguments[key] = convert_value(value, parameters.get(key), untyped="json")
        calls.append({"name": name, "arguments": arguments})


GLM45 = ToolFormat(
    name="glm45",
    start=CALL_BEGIN,
    parse_section=parse_section,
    end_markers=("<|user|>", "<|observation|>", "<|endoftext|>"),
)
