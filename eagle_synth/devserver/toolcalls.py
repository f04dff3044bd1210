"""Tool calls the emulated model writes when its prompt offers tools, in its template's format.

The rules (which tools, which arguments, when) are in docs/devserver.md, "Tool calls". The
formats written are the Qwen family's (`qwen3_coder`, Qwen3.5's; `hermes`, Qwen2.5/3's), told
from the tokenizer's chat template; with any other template the model never calls tools.
Everything is a pure function of the prompt ids (and the rng the caller seeds from them).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from functools import partial

from eagle_synth.toolcalls.detect import detect_tool_format

# Formats the emulated model can write.
WRITABLE_FORMATS = ("qwen3_coder", "hermes")
# The Qwen templates' tools section and turn markers (as decoded text).
TOOLS_BEGIN = "<tools>\n"
TOOLS_END = "\n</tools>"
USER_TURN = "<|im_start|>user\n"
TOOL_RESPONSE = "<tool_response>"
# The special token every Qwen tools prompt contains (its format instructions show it); prompts
# without it are never decoded, so the check costs one scan of the ids.
CALL_TOKEN = "<tool_call>"
# Words string arguments are made of.
ARGUMENT_WORDS = ("Oslo", "Paris", "Köln", "東京", "river", "report", "weekly", "summary", "north", "2024")
# Words per string argument, drawn uniformly.
WORDS_PER_STRING = (1, 3)


class ToolCaller:
    """Writes tool calls in `family`'s format for prompts that hold `call_token_id` and offer
    tools; `decode` maps ids to text with special tokens kept."""

    def __init__(self, *, family: str, call_token_id: int, decode) -> None:
        if family not in WRITABLE_FORMATS:
            raise ValueError(f"cannot write tool calls in format {family!r}; only {', '.join(WRITABLE_FORMATS)}")
        self.family = family
        self.call_token_id = call_token_id
        self._decode = decode

    @classmethod
    def for_tokenizer(cls, tokenizer) -> ToolCaller | None:
        family = detect_tool_format(getattr(tokenizer, "chat_template", None))
        if family not in WRITABLE_FORMATS:
            return None
        ids = tokenizer.encode(CALL_TOKEN, add_special_tokens=False)
        if len(ids) != 1:  # not a single token: this is not a Qwen tokenizer after all
            return None
        return cls(family=family, call_token_id=ids[0], decode=partial(tokenizer.decode, skip_special_tokens=False))

    def call_text(self, prompt_ids: Sequence[int], rng: random.Random) -> str | None:
        """The tool-call text the model answers with; None: it answers in words."""
        if self.call_token_id not in prompt_ids:
            return None
        prompt = self._decode(prompt_ids)
        tools = offered_tools(prompt)
        user_text = last_user_text(prompt)
        if not tools or user_text is None:
            return None
        chosen = chosen_tools(tools, user_text)
        return render_calls([{"name": n, "arguments": fill_arguments(a, rng)} for n, a in chosen], family=self.family)


def offered_tools(prompt: str) -> list[dict]:
    """The function schemas of the prompt's tools section."""
    start = prompt.find(TOOLS_BEGIN)
    end = prompt.find(TOOLS_END, start + 1)
    if start < 0 or end < 0:
        return []
    tools = []
    for line in prompt[start + len(TOOLS_BEGIN) : end].splitlines():
        try:
            tool = json.loads(line)
        except ValueError:
            continue
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            tools.append(function)
    return tools


def last_user_text(prompt: str) -> str | None:
    """The last user turn's text, or None when that turn carries tool responses."""
    at = prompt.rfind(USER_TURN)
    if at < 0:
        return None
    text = prompt[at + len(USER_TURN) :]
    return None if text.lstrip().startswith(TOOL_RESPONSE) else text


def chosen_tools(tools: list[dict], user_text: str) -> list[tuple[str, dict]]:
    """(name, parameters schema) of each tool to call, in order of mention (else the first tool)."""
    found = [(re.search(rf"(?<![\w.]){re.escape(tool['name'])}(?![\w.])", user_text), tool) for tool in tools]
    mentioned = sorted(((match.start(), tool) for match, tool in found if match), key=lambda m: m[0])
    picked = [tool for _, tool in mentioned] or tools[:1]
    return [(tool["name"], tool.get("parameters") or {}) for tool in picked]


def fill_arguments(schema: dict, rng: random.Random) -> dict:
    """Values for the schema's required properties (all when none is)."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return {}
    required = [name for name in schema.get("required") or () if name in properties]
    return {name: _value(properties[name], rng) for name in (required or list(properties))}


def _value(schema: object, rng: random.Random) -> object:
    schema = schema if isinstance(schema, dict) else {}
    if schema.get("enum"):
        return rng.choice(list(schema["enum"]))
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "integer":
        return rng.randint(1, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_value(schema.get("items") or {"type": "string"}, rng) for _ in range(rng.randint(1, 2))]
    if kind == "object":
        return fill_arguments(schema, rng)
    return " ".join(rng.choice(ARGUMENT_WORDS) for _ in range(rng.randint(*WORDS_PER_STRING)))


def render_calls(calls: list[dict], *, family: str) -> str:
    if family == "hermes":
        bodies = [json.dumps({"name": c["name"], "arguments": c["arguments"]}, ensure_ascii=False) for c in calls]
    else:
        # Qwen3.5's template: objects and lists as JSON, anything else through str().
        bodies = [
            f"<function={call['name']}>\n"
            + "".join(
                f"<parameter={key}>\n{json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v}\n</parameter>\n"
                for key, v in call["arguments"].items()
            )
            + "</function>"
            for call in calls
        ]
    return "\n".join(f"<tool_call>\n{body}\n</tool_call>" for body in bodies)
