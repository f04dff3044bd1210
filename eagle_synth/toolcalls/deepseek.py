"""DeepSeek-V3 / R1 and DeepSeek-V3.1 / V3.2-Exp: calls between full-width-bar markers.

V3 (and R1) write the type, the name and a fenced JSON block:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1 drop the type and the fence:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Parallel calls follow each other inside the section (V3's template puts a newline between).
"""

from __future__ import annotations

import re
from functools import partial

from eagle_synth.errors import Malformed
from eagle_synth.toolcalls.answer import Cursor, ToolFormat, call_name, json_arguments

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEPARATOR = "<｜tool▁sep｜>"
# The end of sentence a decoded answer may still carry.
END_OF_SENTENCE = "<｜end▁of▁sentence｜>"
# V3's call body after the separator: the name, then the arguments fenced as JSON.
V3_BODY = re.compile(r"(?P<name>[^\n]*)\n```json\n(?P<arguments>.*)\n```\s*", re.DOTALL)


def _parse(cursor: Cursor, schemas: dict[str, dict], calls: list[dict], *, fenced: bool) -> None:
    cursor.expect(CALLS_BEGIN)
    while cursor.take(CALL_BEGIN):
        head, _ = cursor.until(SEPARATOR)
        body, _ = cursor.until(CALL_END)
        if fenced:
            if head.strip() != "function":
                raise Malformed(f"expected the call type 'function' before the separator, got {head[:40]!r}")
            if (match := V3_BODY.fullmatch(body)) is None:
                raise Malformed(f"expected NAME, then a ```json block, got {body[:60]!r}")
            calls.append({"name": call_name(match["name"]), "arguments": json_arguments(match["arguments"])})
        else:
            calls.append({"name": call_name(head), "arguments": json_arguments(body)})
    cursor.expect(CALLS_END)


DEEPSEEK_V3 = ToolFormat(
    name="deepseek_v3", start=CALLS_BEGIN, parse_section=partial(_parse, fenced=True), end_markers=(END_OF_SENTENCE,)
)
DEEPSEEK_V31 = ToolFormat(
    name="deepseek_v31", start=CALLS_BEGIN, parse_section=partial(_parse, fenced=False), end_markers=(END_OF_SENTENCE,)
)
