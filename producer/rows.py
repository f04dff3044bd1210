"""Normalize one input row (the fields of docs/inputs.md) into the conversation(s) whose next
answer is regenerated. Tool calls of every accepted shape become OpenAI ``tool_calls`` whose
``function.arguments`` is an object, the shape chat templates iterate over. A row that does not
fit raises RowError with a stable ``reason`` slug and the path of the offending ``field``.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from eagle_synth.conversation import has_tools, split_turns
from eagle_synth.errors import RowError
from eagle_synth.regeneration import regeneration_points

if TYPE_CHECKING:
    from eagle_synth.variants import Variant

# Accepted role names (lower-cased before lookup) -> OpenAI role.
ROLE_ALIASES: Mapping[str, str] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "function_response": "tool",
}
# ShareGPT roles whose value is a tool call (JSON), not assistant text.
TOOL_CALL_ROLES = frozenset({"function_call"})

# RowError.reason slugs.  Stable: callers count and report by them.
NO_MESSAGES = "no-messages"
EMPTY_CONVERSATION = "empty-conversation"
NO_USER_TURN = "no-user-turn"
WRONG_TYPE = "wrong-type"
MISSING_FIELD = "missing-field"
EMPTY_CONTENT = "empty-content"
UNSUPPORTED_CONTENT = "unsupported-content"
UNKNOWN_ROLE = "unknown-role"
BAD_JSON = "bad-json"
BAD_TOOL_CALL = "bad-tool-call"
# With --history own: tool results that do not answer the dataset's calls one for one.
UNPAIRED_TOOL_RESULTS = "unpaired-tool-results"
# With --history own: a row with tools, and no tool-call format to parse the model's calls in.
NO_TOOL_FORMAT = "no-tool-format"
# A string that is not Unicode text (a lone surrogate such as "\ud800", which JSON can spell):
# no tokenizer or hash can take it.
BAD_TEXT = "bad-text"

# Keys of a message entry that normalisation rewrites (never copied as given).
_REWRITTEN_KEYS = frozenset({"role", "from", "content", "value", "tool_calls", "function_call"})
_T = TypeVar("_T")
_TYPE_NAMES = ((bool, "boolean"), (int, "number"), (float, "number"), (str, "string"), (list, "list"), (dict, "object"))


@dataclass(frozen=True, slots=True)
class Conversation:
    """A prompt to regenerate an answer for: fresh OpenAI-style message dicts (safe to mutate)
    ending with what the model answers (a user turn, or a tool-call step's results); ``turn`` is
    that point's 0-based index among the row's regeneration points. The planner adds the row's
    variant, its chat template arguments (None: the campaign's) and, with `--history own`, the
    row's turns (``own``; the prompt is turn 0)."""

    messages: list[dict]
    tools: list[dict] | None
    row_id: str
    turn: int
    template_kwargs: dict | None = None
    variant: Variant | None = None
    own: OwnConversation | None = None

    def template_input(self) -> tuple:
        """The (messages, tools, kwargs) triple the templating pool takes."""
        return self.messages, self.tools, self.template_kwargs


@dataclass(frozen=True, slots=True)
class OwnConversation:
    """A row to regenerate turn by turn on the model's own answers (`--history own`): ``turns``
    each turn's new system and user messages (the model's answers replace the dataset's),
    ``cut`` whether turns beyond ``max_turns`` were dropped, ``steps`` (rows with tools only)
    the dataset's calls and results after each point, which workers pair with the model's calls.
    """

    turns: list[list[dict]]
    tools: list[dict] | None
    row_id: str
    cut: bool = False
    steps: list[dict] | None = None


def conversations_from_row(
    data: dict, *, source: str, line: int, turns: Literal["last", "all"] = "last", default_system: str | None = None
) -> list[Conversation]:
    """The conversation(s) to regenerate of one row: ending at its last regeneration point (a
    user turn, or the end of a run of tool results), or with ``turns="all"`` one per point. A
    row without a system message gets its ``system`` field, else ``default_system``. Null-valued
    keys are dropped (Parquet rows carry null for every field another row has). Raises RowError.
    """
    if turns not in ("last", "all"):
        raise ValueError(f"turns must be 'last' or 'all', got {turns!r}")
    row_id, messages, fields, tools, positions = _normalized(data, source, line, default_system)
    chosen = list(enumerate(positions))[-1:] if turns == "last" else enumerate(positions)
    out = []
    for turn, position in chosen:
        _check_user_content(messages, fields, position)
        # Fresh dicts (tool calls copied deeply), so callers may mutate them freely.
        copied = [copy.deepcopy(m) if "tool_calls" in m else dict(m) for m in messages[: position + 1]]
        out.append(Conversation(copied, tools, row_id, turn))
    return out


def own_history_from_row(
    data: dict,
    *,
    source: str,
    line: int,
    default_system: str | None = None,
    max_turns: int | None = None,
    no_tool_format: str | None = None,
) -> OwnConversation:
    """One row's turns to answer in order; every user turn needs content, and in a row with
    tools each tool-result run must answer the step before it one for one. `no_tool_format`:
    why the campaign cannot parse tool calls, refusing rows with tools. Raises RowError."""
    row_id, messages, fields, tools, positions = _normalized(data, source, line, default_system)
    for position in positions:
        _check_user_content(messages, fields, position)
    turns, all_steps, points = split_turns(messages)
    steps = None
    if has_tools(messages, tools):
        if no_tool_format is not None:
            raise RowError(NO_TOOL_FORMAT, "tools" if tools else None, no_tool_format)
        _check_steps_replayable(messages, fields, all_steps, points)
        steps = all_steps
    cut = max_turns is not None and len(turns) > max_turns
    if cut:
        turns = turns[:max_turns]
        steps = steps[:max_turns] if steps is not None else None
    return OwnConversation(turns=turns, tools=tools, row_id=row_id, cut=cut, steps=steps)


def _check_user_content(messages: list[dict], fields: list[str], position: int) -> None:
    if messages[position]["role"] == "user" and not messages[position]["content"].strip():
        raise RowError(EMPTY_CONTENT, fields[position], "user turn to answer has empty content")


def _check_steps_replayable(messages: list[dict], fields: list[str], steps: list[dict], points: list[int]) -> None:
    """Every turn but the last is followed by what the next turn's prompt carries: a step with
    calls has one result per call, and tool results answer the calls right before them."""
    for point, step, following in zip(points, steps[:-1], points[1:]):
        calls = step["calls"]
        results = step["results"]
        if messages[following]["role"] == "tool" and (not calls or point + 1 + len(results) != following):
            raise RowError(
                UNPAIRED_TOOL_RESULTS,
                fields[following],
                "tool results that do not answer the assistant's tool calls right before them cannot be "
                "replayed on the model's own calls",
            )
        if calls and len(results) != len(calls):
            # The path of the message's tool calls, from the path of its content (ShareGPT: the value).
            content = fields[point + 1]
            raise RowError(
                UNPAIRED_TOOL_RESULTS,
                content.removesuffix(".content") + ".tool_calls" if content.endswith(".content") else content,
                f"{len(calls)} tool call(s) answered by {len(results)} tool result(s); replay pairs them one for one",
            )


def _normalized(
    data: object, source: str, line: int, default_system: str | None
) -> tuple[str, list[dict], list[str], list[dict] | None, list[int]]:
    """Row id, messages (system prompt added), their field paths, tools, regeneration points."""
    if not isinstance(data, dict):
        raise RowError(WRONG_TYPE, None, f"row must be an object, got {type(data).__name__}")
    _check_text(data, None)
    raw_id = data.get("id")
    if raw_id is None or raw_id == "":
        row_id = f"{os.path.basename(source)}:{line}"
    else:  # bool is an int
        row_id = str(_require(raw_id, (str, int, float), "id", "a string or number"))
    messages, fields = _messages(data)
    tools = _tools(data.get("tools"))
    system = _expect(data.get("system"), str, "system", "a string") or None
    if not any(m["role"] == "system" for m in messages) and (system or default_system):
        messages.insert(0, {"role": "system", "content": system or default_system})
        fields.insert(0, "system" if system else "default_system")
    positions = regeneration_points(messages)
    if not positions:
        # "messages[0].content" -> "messages"; "prompt" stays.
        raise RowError(NO_USER_TURN, fields[-1].split("[", 1)[0], "conversation has no user turn to answer")
    return row_id, messages, fields, tools, positions


def _check_text(value: object, field: str | None) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = value[exc.start : exc.end].encode("unicode_escape").decode()
            raise RowError(
                BAD_TEXT, field, f"not valid Unicode text: lone surrogate {bad} at character {exc.start}"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(item, f"{field}.{key}" if field else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_text(item, f"{field}[{index}]" if field else f"[{index}]")


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return next((name for kind, name in _TYPE_NAMES if isinstance(value, kind)), type(value).__name__)


def _expect(value: object, kind: type[_T], field: str, what: str) -> _T | None:
    """`value` if it is None or a `kind`, else RowError(WRONG_TYPE) naming `field`."""
    return None if value is None else _require(value, kind, field, what)


def _require(value: object, kind: type[_T] | tuple[type[_T], ...], field: str, what: str) -> _T:
    """`value` if it is a `kind`, else RowError(WRONG_TYPE) naming `field`."""
    if not isinstance(value, kind):
        raise RowError(WRONG_TYPE, field, f"expected {what}, got {_type_name(value)}")
    return value


def _loads(value: str, field: str, what: str) -> object:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise RowError(BAD_JSON, field, f"{what} not valid JSON: {exc}") from None


def _messages(data: dict) -> tuple[list[dict], list[str]]:
    for key in ("messages", "conversations"):
        entries = _expect(data.get(key), list, key, "a list of messages")
        if entries is None:
            continue
        if not entries:
            raise RowError(EMPTY_CONVERSATION, key, "conversation has no messages")
        messages = [_message(entry, f"{key}[{i}]") for i, entry in enumerate(entries)]
        return messages, [f"{key}[{i}].{_content_key(e)}" for i, e in enumerate(entries)]
    prompt = _expect(data.get("prompt"), str, "prompt", "a string")
    if prompt is not None:
        return [{"role": "user", "content": prompt}], ["prompt"]
    keys = ", ".join(sorted(map(str, data))[:12]) or "none"
    raise RowError(NO_MESSAGES, None, f"row has no 'messages', 'conversations' or 'prompt' (its keys: {keys})")


def _content_key(entry: dict) -> str:
    return "value" if entry.get("content") is None and entry.get("value") is not None else "content"


def _message(raw: object, field: str) -> dict:
    entry = _require(raw, dict, field, "a message object")
    role_key = "role" if entry.get("role") is not None else "from"
    raw_role = entry.get(role_key)
    if raw_role is None:
        raise RowError(MISSING_FIELD, f"{field}.role", "message has no 'role' (or ShareGPT 'from')")
    _expect(raw_role, str, f"{field}.{role_key}", "a string")
    role = ROLE_ALIASES.get(raw_role.lower())
    if role is None:
        raise RowError(
            UNKNOWN_ROLE, f"{field}.{role_key}", f"unknown role {raw_role!r}; known: {', '.join(ROLE_ALIASES)}"
        )
    content_field = f"{field}.{_content_key(entry)}"
    raw_content = entry.get(_content_key(entry))
    extra = {k: v for k, v in entry.items() if k not in _REWRITTEN_KEYS and v is not None}
    if raw_role.lower() in TOOL_CALL_ROLES:
        # ShareGPT function calling: the value is the call (or a list of parallel calls) as JSON.
        return {"role": "assistant", "content": "", "tool_calls": _sharegpt_calls(raw_content, content_field), **extra}
    if raw_content is not None:
        content = _content(raw_content, content_field)
    elif role == "assistant":
        content = ""  # OpenAI sends null content on assistant tool-call turns; "" renders the same in templates.
    else:
        raise RowError(MISSING_FIELD, content_field, f"{role} message has no content")
    message = {"role": role, "content": content, **extra}
    calls = _message_calls(entry, role, field)
    if calls:
        message["tool_calls"] = calls
    return message


def _message_calls(entry: dict, role: str, field: str) -> list[dict]:
    raw_calls = entry.get("tool_calls")
    legacy = entry.get("function_call")
    if raw_calls is None and legacy is None:
        return []
    if role != "assistant":
        key = "tool_calls" if raw_calls is not None else "function_call"
        raise RowError(BAD_TOOL_CALL, f"{field}.{key}", f"only assistant messages carry tool calls, not {role}")
    if raw_calls is None:  # the pre-tools OpenAI API: one {"name", "arguments"} object
        return [_call(legacy, f"{field}.function_call", None)]
    _expect(raw_calls, list, f"{field}.tool_calls", "a list of tool calls")
    return [_openai_call(call, f"{field}.tool_calls[{i}]") for i, call in enumerate(raw_calls)]


def _openai_call(raw: object, field: str) -> dict:
    value = _require(raw, dict, field, "a tool call object")
    function = value.get("function")
    call_id = _expect(value.get("id"), str, f"{field}.id", "a string")
    # Some exports flatten the call ({"name", "arguments"} beside "id"); templates accept both.
    return _call(value, field, call_id) if function is None else _call(function, f"{field}.function", call_id)


def _sharegpt_calls(value: object, field: str) -> list[dict]:
    if value is None:
        raise RowError(MISSING_FIELD, field, "function_call entry has no value (the call as JSON)")
    if isinstance(value, str):
        value = _loads(value, field, "function_call value is")
    if not isinstance(value, list):
        return [_call(value, field, None)]
    if not value:
        raise RowError(BAD_TOOL_CALL, field, "function_call value holds no call")
    return [_call(call, f"{field}[{i}]", None) for i, call in enumerate(value)]


def _call(raw: object, field: str, call_id: object) -> dict:
    """One call as the template expects it: {"type", "function": {"name", "arguments": {...}}} (+ "id")."""
    value = _require(raw, dict, field, "a function call object")
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        problem = "has no 'name'" if name is None else f"'name' must be a non-empty string, got {_type_name(name)}"
        raise RowError(BAD_TOOL_CALL, f"{field}.name", f"tool call {problem}")
    # "parameters" is what some ShareGPT exports (and Llama-style calls) name the arguments.
    key = "arguments" if "arguments" in value or "parameters" not in value else "parameters"
    arguments = value.get(key)
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):
        arguments = _loads(arguments, f"{field}.{key}", "arguments are")
    if not isinstance(arguments, dict):
        raise RowError(BAD_TOOL_CALL, f"{field}.{key}", f"arguments must be a JSON object, got {_type_name(arguments)}")
    head = {"id": call_id} if call_id else {}
    return {**head, "type": "function", "function": {"name": name, "arguments": arguments}}


def _content(value: object, field: str) -> str:
    if isinstance(value, str):
        return value
    texts = []
    for i, raw_part in enumerate(_require(value, list, field, "a string or a list of text parts")):
        part_field = f"{field}[{i}]"
        part = _require(raw_part, dict, part_field, "a content part object")
        kind = part.get("type")
        if kind is None:
            raise RowError(MISSING_FIELD, f"{part_field}.type", "content part has no 'type'")
        if kind != "text":
            raise RowError(UNSUPPORTED_CONTENT, f"{part_field}.type", f"only text parts are supported, got {kind!r}")
        texts.append(_require(part.get("text"), str, f"{part_field}.text", "a string"))
    return "".join(texts)


def _tools(value: object) -> list[dict] | None:
    if isinstance(value, str):
        value = _loads(value, "tools", "string is") if value.strip() else None
    schemas = _expect(value, list, "tools", "a list of function schemas")
    for i, tool in enumerate(schemas or []):
        _require(tool, dict, f"tools[{i}]", "a function schema object")
    return schemas or None
