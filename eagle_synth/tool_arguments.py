"""Tool-call arguments as JSON text, for the chat formats that read them so: DeepSeek-V3.1's
template concatenates them, and DeepSeek-V3.2/V4's encoders `json.loads` them (the OpenAI API
carries arguments as text)."""

from __future__ import annotations

import json


def with_text_arguments(messages: list[dict]) -> list[dict] | None:
    """The messages with every object tool-call argument set as JSON text; None if there is none."""

    def as_text(call):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("arguments"), dict)):
            return call
        return {**call, "function": {**function, "arguments": json.dumps(function["arguments"], ensure_ascii=False)}}

    out = [{**m, "tool_calls": [as_text(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]
    # A changed call's arguments are text where they were an object: the lists compare unequal.
    return None if out == messages else out
