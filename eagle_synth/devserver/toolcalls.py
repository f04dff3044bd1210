"""Tool calls the emulated model writes when its prompt offers tools, in its template's format.

The rules (which tools, which arguments, when) are in docs/devserver.md, "Tool calls". The
formats written are the Qwen family's (`qwen3_coder`, Qwen3.5's; `hermes`, Qwen2.5/3's),
DeepSeek-V3.2/V4's DSML (`dsml`, from the folder's Python encoder) and Kimi-K2's (`kimi_k2`),
told from the tokenizer's chat template; with any other template the model never calls tools.
Everything is a pure function of the prompt ids (and the rng the caller seeds from them).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from eagle_synth.toolcalls.detect import detect_tool_format


@dataclass(frozen=True, slots=True)
class PromptShape:
    """Where a family's prompt shows what the model answers with tools (as decoded text).

    Parameters:
        tools_begin, tools_end: around the offered tools' schemas (one JSON per line, or a JSON list).
        user_turn: opens a user turn; the model calls tools on the last one's own words.
        tool_response: marks tool results; after the last user turn (anywhere, or at its very
            start when `results_open_turn`) it means the model answers in words.
        call_token: a special token every prompt offering tools holds (found in the ids, so a
            prompt without it is never decoded).
    """

    tools_begin: str
    tools_end: str
    user_turn: str
    tool_response: str
    call_token: str
    results_open_turn: bool = True


# The Qwen templates' tools section and turn markers.
QWEN_SHAPE = PromptShape(
    tools_begin="<tools>\n",
    tools_end="\n</tools>",
    user_turn="<|im_start|>user\n",
    tool_response="<tool_response>",
    call_token="<tool_call>",
)
# The prompt shape of each format the emulated model can write.
SHAPES = {
    "qwen3_coder": QWEN_SHAPE,
    "hermes": QWEN_SHAPE,
    # DeepSeek-V3.2 / V4's encoders: schemas one per line, tool results merged into a user turn.
    "dsml": PromptShape(
        tools_begin="### Available Tool Schemas\n\n",
        tools_end="\n\nYou MUST strictly follow",
        user_turn="<｜User｜>",
        tool_response="<tool_result>",
        call_token="｜DSML｜",
    ),
    # Kimi-K2.5: the schemas as one JSON list in a tool_declare block, results in their own turns.
    "kimi_k2": PromptShape(
        tools_begin="<|im_system|>tool_declare<|im_middle|>",
        tools_end="<|im_end|>",
        user_turn="<|im_user|>user<|im_middle|>",
        tool_response="<|im_system|>tool<|im_middle|>",
        # tool_declare is plain text: the system turn's token is what every such prompt holds.
        call_token="<|im_system|>",
        results_open_turn=False,
    ),
}
# Formats the emulated model can write.
WRITABLE_FORMATS = tuple(SHAPES)
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
        self.shape = SHAPES[family]
        self.call_token_id = call_token_id
        self._decode = decode

    @classmethod
    def for_tokenizer(cls, tokenizer) -> ToolCaller | None:
        family = detect_tool_format(getattr(tokenizer, "chat_template", None))
        if family not in WRITABLE_FORMATS:
            return None
        ids = tokenizer.encode(SHAPES[family].call_token, add_special_tokens=False)
        if len(ids) != 1:  # not a single token: this is not the family's tokenizer after all
            return None
        return cls(family=family, call_token_id=ids[0], decode=partial(tokenizer.decode, skip_special_tokens=False))

    def call_text(self, prompt_ids: Sequence[int], rng: random.Random) -> str | None:
        """The tool-call text the model answers with; None: it answers in words."""
        if self.call_token_id not in prompt_ids:
            return None
        prompt = self._decode(prompt_ids)
        tools = offered_tools(prompt, self.shape)
        user_text = last_user_text(prompt, self.shape)
        if not tools or user_text is None:
            return None
        chosen = chosen_tools(tools, user_text)
        return render_calls([{"name": n, "arguments": fill_arguments(a, rng)} for n, a in chosen], family=self.family)


def offered_tools(prompt: str, shape: PromptShape = QWEN_SHAPE) -> list[dict]:
    """The function schemas of the prompt's tools section."""
    start = prompt.find(shape.tools_begin)
    end = prompt.find(shape.tools_end, start + 1)
    if start < 0 or end < 0:
        return []
    tools = []
    for line in prompt[start + len(shape.tools_begin) : end].splitlines():
        try:
            found = json.loads(line)
        except ValueError:
            continue
        for tool in found if isinstance(found, list) else [found]:
            function = tool.get("function", tool) if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                tools.append(function)
    return tools


def last_user_text(prompt: str, shape: PromptShape = QWEN_SHAPE) -> str | None:
    """The last user turn's text, or None when tool responses follow it (or open it)."""
    at = prompt.rfind(shape.user_turn)
    if at < 0:
        return None
    text = prompt[at + len(shape.user_turn) :]
    if shape.results_open_turn:
        return None if text.lstrip().startswith(shape.tool_response) else text
    return None if shape.tool_response in text else text


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
    if family == "dsml":
        return render_dsml(calls)
    if family == "kimi_k2":
        return render_kimi(calls)
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


def render_dsml(calls: list[dict]) -> str:
    """DeepSeek-V4's DSML block, as its encoder renders an assistant's calls (strings as they
    are, other values as JSON)."""
    dsml = "｜DSML｜"
    invokes = []
    for call in calls:
        parameters = [
            f'<{dsml}parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
            f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}</{dsml}parameter>"
            for key, value in call["arguments"].items()
        ]
        invokes.append(f'<{dsml}invoke name="{call["name"]}">\n' + "\n".join(parameters) + f"\n</{dsml}invoke>")
    return f"<{dsml}tool_calls>\n" + "\n".join(invokes) + f"\n</{dsml}tool_calls>"


def render_kimi(calls: list[dict]) -> str:
    """Kimi-K2's section: each call's id `functions.NAME:INDEX`, then its arguments as JSON."""
    body = "".join(
        f"<|tool_call_begin|>functions.{call['name']}:{index}<|tool_call_argument_begin|>"
        f"{json.dumps(call['arguments'], ensure_ascii=False)}<|tool_call_end|>"
        for index, call in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"
