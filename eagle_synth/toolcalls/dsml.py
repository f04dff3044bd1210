"""DeepSeek-V3.2 / V4: DSML, calls as XML-like elements whose tags start with the `｜DSML｜` token.

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

Written from the models' own encoders (encoding_dsv4.py; V3.2's encoding_dsv32.py names the
block `function_calls`): a parameter with string="true" is text as is, any other value JSON.
"""

from __future__ import annotations

import json
import re

from eagle_synth.errors import Malformed
from eagle_synth.toolcalls.answer import Cursor, ToolFormat, call_name
from eagle_synth.toolcalls.deepseek import END_OF_SENTENCE

DSML = "｜DSML｜"
# The block's name: V4 writes tool_calls, V3.2 function_calls.
BLOCK_NAMES = ("tool_calls", "function_calls")
INVOKE = f"<{DSML}invoke"
INVOKE_END = f"</{DSML}invoke>"
PARAMETER = f"<{DSML}parameter"
PARAMETER_END = f"</{DSML}parameter>"
# What follows `<｜DSML｜invoke` up to its `>`.
INVOKE_HEAD = re.compile(r'\s*name="(?P<name>[^"]*)"\s*')
# What follows `<｜DSML｜parameter` up to its `>`.
PARAMETER_HEAD = re.compile(r'\s*name="(?P<name>[^"]*)"\s+string="(?P<string>true|false)"\s*')


def parse_section(cursor: Cursor, schemas: dict[str, dict], calls: list[dict]) -> None:
    block = next((name for name in BLOCK_NAMES if cursor.take(f"<{DSML}{name}>")), None)
    if block is None:
        raise Malformed(f"expected a DSML tool_calls block, found {cursor.text[cursor.pos : cursor.pos + 40]!r}")
    while cursor.take(INVOKE):
        head, _ = cursor.until(">")
        if (match := INVOKE_HEAD.fullmatch(head)) is None:
            raise Malformed(f'expected invoke name="NAME", got {head[:60]!r}')
        name = call_name(match["name"])
        arguments: dict = {}
        while cursor.take(PARAMETER):
            head, _ = cursor.until(">")
            if (found := PARAMETER_HEAD.fullmatch(head)) is None:
                raise Malformed(f'expected parameter name="NAME" string="true|false", got {head[:60]!r}')
            value, _ = cursor.until(PARAMETER_END)
            if found["name"] in arguments:
                raise Malformed(f"parameter {found['name']!r} given twice in a call of {name}")
            arguments[found["name"]] = value if found["string"] == "true" else _json_value(found["name"], value)
        cursor.expect(INVOKE_END)
        calls.append({"name": name, "arguments": arguments})
    cursor.expect(f"</{DSML}{block}>")


def _json_value(name: str, text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Malformed(f'parameter {name!r} has string="false" but is not JSON: {exc}') from None


DSML_FORMAT = ToolFormat(name="dsml", start=f"<{DSML}", parse_section=parse_section, end_markers=(END_OF_SENTENCE,))
