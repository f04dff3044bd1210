"""Hermes / Qwen2.5 / Qwen3 / QwQ: one JSON object per `<tool_call>` block.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Parallel calls are consecutive blocks, separated by whitespace (Qwen's templates put a newline
inside each block and between blocks).
"""

from __future__ import annotations

from eagle_synth.toolcalls.answer import Cursor, ToolFormat, json_call

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"


def parse_section(cursor: Cursor, schemas: dict[str, dict], calls: list[dict]) -> None:
    while cursor.take(CALL_BEGIN):
        body, _ = cursor.until(CALL_END)
        calls.append(json_call(body))


HERMES = ToolFormat(
    name="hermes", start=CALL_BEGIN, parse_section=parse_section, end_markers=("<|im_end|>", "<|endoftext|>")
)
