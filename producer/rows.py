"""Normalize one input row into the conversation(s) whose next answer is regenerated.

A row is a dict as yielded by ``producer.sources`` and comes in one of three
shapes (checked in this order, first non-null wins):

* ``messages``: OpenAI-style ``[{"role", "content", ...}]``;
* ``conversations``: ShareGPT ``[{"from", "value"}]`` (or ``role``/``content``
  entries);
* ``prompt``: a plain string, which becomes one user message.

Optional row fields: ``id`` (any scalar), ``system`` (string) and ``tools``
(a list of OpenAI function schemas or a JSON string of one).  Tool calls come
as OpenAI ``tool_calls`` (or the legacy ``function_call``) on assistant
messages, or as ShareGPT ``function_call`` entries; they are normalised to
OpenAI ``tool_calls`` whose ``function.arguments`` is an object, the shape
chat templates iterate over.  Anything that does not fit raises RowError with
a stable ``reason`` slug and the path of the offending ``field``.  The role
mapping and every slug are documented in docs/inputs.md.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from eagle_synth.errors import EagleSynthError
from eagle_synth.regeneration import regeneration_points

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

_SHAPE_KEYS = ("messages", "conversations")
_ENTRY_KEYS = frozenset({"role", "from", "content", "value"})
# Message keys rewritten by tool-call normalisation (never copied as given).
_CALL_KEYS = frozenset({"tool_calls", "function_call"})


@dataclass(frozen=True, slots=True)
class Conversation:
    """A prompt to regenerate an answer for: fresh OpenAI-style message dicts (safe to mutate)
    ending with what the model answers (a user turn, or a tool-call step's results); ``turn`` is
    that point's 0-based index among the row's regeneration points."""

    messages: list[dict]
    tools: list[dict] | None
    row_id: str
    turn: int


class RowError(EagleSynthError):
    """A row that cannot become a conversation: ``reason`` a stable slug, ``field`` the path of
    the offending value (``"messages[2].content"``), None when the whole row is at fault."""

    def __init__(self, reason: str, field: str | None, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.reason = reason
        self.field = field


def conversations_from_row(
    data: dict,
    *,
    source: str,
    line: int,
    turns: Literal["last", "all"] = "last",
    default_system: str | None = None,
) -> list[Conversation]:
    """The conversation(s) to regenerate of one row.

    A regeneration point is a user turn, or the last of a run of tool results after the first
    user turn: the model answers after either. ``turns="last"``: one Conversation ending at the
    last point (later assistant messages are the old answer); ``"all"``: one per point, on the
    dataset's history. A row without a system message gets its ``system`` field, else
    ``default_system`` (empty counts as absent). Contents are kept exactly; text-part lists are
    joined with no separator; null-valued keys are dropped (Parquet/Arrow rows carry null for
    every field another row has). Raises RowError; ValueError for a bad ``turns``.
    """
    if turns not in ("last", "all"):
        raise ValueError(f"turns must be 'last' or 'all', got {turns!r}")
    row_id, messages, fields, tools, positions = _normalized(
        data, source=source, line=line, default_system=default_system
    )
    chosen = list(enumerate(positions))
    if turns == "last":
        chosen = chosen[-1:]

    out = []
    for turn, position in chosen:
        if messages[position]["role"] == "user" and not messages[position]["content"].strip():
            raise RowError(EMPTY_CONTENT, fields[position], "user turn to answer has empty content")
        out.append(Conversation(_copy_messages(messages[: position + 1]), tools, row_id, turn))
    return out


@dataclass(frozen=True, slots=True)
class OwnConversation:
    """A row to regenerate turn by turn on the model's own answers (`--history own`).

    ``turns`` holds each turn's new messages (system messages, then the user message that
    closes the turn); the dataset's assistant and tool messages are left out, since the
    model's answers replace them. ``cut`` says turns beyond ``max_turns`` were dropped.
    In a row with tools every regeneration point is a turn (a turn answering tool results
    has no new messages) and ``steps`` holds the dataset's calls and results after each
    point, which the workers pair with the model's own calls; None in other rows.
    """

    turns: list[list[dict]]
    tools: list[dict] | None
    row_id: str
    cut: bool = False
    steps: list[dict] | None = None


def own_history_from_row(
    data: dict,
    *,
    source: str,
    line: int,
    default_system: str | None = None,
    max_turns: int | None = None,
    no_tool_format: str | None = None,
) -> OwnConversation:
    """Turn one row into the turns to answer in order (see OwnConversation).

    The same normalization as conversations_from_row (shapes, roles, system prompt); every
    user turn must have content. In a row with tools, every tool-result run must answer the
    dataset's calls of the step before it, one result per call. `no_tool_format` is why the
    campaign cannot parse tool calls (None when it can): rows with tools are then refused with
    it. Raises RowError.
    """
    from eagle_synth.conversation import has_tools, split_turns

    row_id, messages, fields, tools, positions = _normalized(
        data, source=source, line=line, default_system=default_system
    )
    for position in positions:
        if messages[position]["role"] == "user" and not messages[position]["content"].strip():
            raise RowError(EMPTY_CONTENT, fields[position], "user turn to answer has empty content")
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


def _check_steps_replayable(messages: list[dict], fields: list[str], steps: list[dict], points: list[int]) -> None:
    """Every turn but the last is followed by what the next turn's prompt carries: a step with
    calls has one result per call, and tool results answer the calls right before them."""
    for index, (point, step) in enumerate(zip(points[:-1], steps[:-1])):
        following = points[index + 1]
        calls, results = step["calls"], step["results"]
        if messages[following]["role"] == "tool" and (not calls or point + 1 + len(results) != following):
            raise RowError(
                UNPAIRED_TOOL_RESULTS,
                fields[following],
                "tool results that do not answer the assistant's tool calls right before them cannot be "
                "replayed on the model's own calls",
            )
        if calls and len(results) != len(calls):
            raise RowError(
                UNPAIRED_TOOL_RESULTS,
                _calls_field(fields[point + 1]),
                f"{len(calls)} tool call(s) answered by {len(results)} tool result(s); replay pairs them one for one",
            )


def _normalized(
    data: object, *, source: str, line: int, default_system: str | None
) -> tuple[str, list[dict], list[str], list[dict] | None, list[int]]:
    """Row id, messages (system prompt added), their field paths, tools, regeneration points
    (user turns and the ends of tool-result runs)."""
    if not isinstance(data, dict):
        raise RowError(WRONG_TYPE, None, f"row must be an object, got {type(data).__name__}")
    _check_text(data, field=None)
    row_id = _row_id(data.get("id"), source=source, line=line)
    messages, fields = _messages(data)
    tools = _tools(data.get("tools"))
    system = _optional_string(data.get("system"), field="system")

    if not any(m["role"] == "system" for m in messages):
        prompt_system = system or default_system
        if prompt_system:
            messages.insert(0, {"role": "system", "content": prompt_system})
            fields.insert(0, "system" if system else "default_system")

    positions = regeneration_points(messages)
    if not positions:
        raise RowError(NO_USER_TURN, _shape_field(fields), "conversation has no user turn to answer")
    return row_id, messages, fields, tools, positions


def _check_text(value: object, *, field: str | None) -> None:
    """RowError(BAD_TEXT) naming the field of the first string that is not valid Unicode."""
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
            _check_text(item, field=f"{field}.{key}" if field else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_text(item, field=f"{field}[{index}]" if field else f"[{index}]")


def _calls_field(content_field: str) -> str:
    """The path of a message's tool calls, from the path of its content (ShareGPT: the value)."""
    return content_field[: -len(".content")] + ".tool_calls" if content_field.endswith(".content") else content_field


def _copy_messages(messages: list[dict]) -> list[dict]:
    """Fresh message dicts (tool calls copied deeply), so callers may mutate them freely."""
    return [copy.deepcopy(m) if "tool_calls" in m else dict(m) for m in messages]


def _row_id(value: object, *, source: str, line: int) -> str:
    if value is None or value == "":
        return f"{os.path.basename(source)}:{line}"
    if isinstance(value, (str, int, float)):  # bool is an int
        return str(value)
    raise RowError(WRONG_TYPE, "id", f"expected a string or number, got {_type_name(value)}")


def _messages(data: dict) -> tuple[list[dict], list[str]]:
    """Normalized messages and, in parallel, each one's field path in the row."""
    for key in _SHAPE_KEYS:
        entries = data.get(key)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise RowError(WRONG_TYPE, key, f"expected a list of messages, got {_type_name(entries)}")
        if not entries:
            raise RowError(EMPTY_CONVERSATION, key, "conversation has no messages")
        messages = [_message(entry, field=f"{key}[{i}]") for i, entry in enumerate(entries)]
        return messages, [f"{key}[{i}].{_content_key(e)}" for i, e in enumerate(entries)]
    prompt = data.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise RowError(WRONG_TYPE, "prompt", f"expected a string, got {_type_name(prompt)}")
        return [{"role": "user", "content": prompt}], ["prompt"]
    keys = ", ".join(sorted(map(str, data))[:12]) or "none"
    raise RowError(NO_MESSAGES, None, f"row has no 'messages', 'conversations' or 'prompt' (its keys: {keys})")


def _content_key(entry: dict) -> str:
    if entry.get("content") is None and entry.get("value") is not None:
        return "value"
    return "content"


def _message(entry: object, *, field: str) -> dict:
    if not isinstance(entry, dict):
        raise RowError(WRONG_TYPE, field, f"expected a message object, got {_type_name(entry)}")
    role_key = "role" if entry.get("role") is not None else "from"
    raw_role = entry.get(role_key)
    if raw_role is None:
        raise RowError(MISSING_FIELD, f"{field}.role", "message has no 'role' (or ShareGPT 'from')")
    if not isinstance(raw_role, str):
        raise RowError(WRONG_TYPE, f"{field}.{role_key}", f"expected a string, got {_type_name(raw_role)}")
    role = ROLE_ALIASES.get(raw_role.lower())
    if role is None:
        raise RowError(
            UNKNOWN_ROLE, f"{field}.{role_key}", f"unknown role {raw_role!r}; known: {', '.join(ROLE_ALIASES)}"
        )

    content_key = _content_key(entry)
    raw_content = entry.get(content_key)
    if raw_role.lower() in TOOL_CALL_ROLES:
        # ShareGPT function calling: the value is the call (or a list of parallel calls) as JSON.
        calls = _sharegpt_calls(raw_content, field=f"{field}.{content_key}")
        message = {"role": "assistant", "content": "", "tool_calls": calls}
        message.update(
            (k, v) for k, v in entry.items() if k not in _ENTRY_KEYS and k not in _CALL_KEYS and v is not None
        )
        return message
    if raw_content is None:
        # OpenAI sends null content on assistant tool-call turns; "" renders the same in templates.
        if role != "assistant":
            raise RowError(MISSING_FIELD, f"{field}.{content_key}", f"{role} message has no content")
        content = ""
    else:
        content = _content(raw_content, field=f"{field}.{content_key}")

    message = {"role": role, "content": content}
    message.update((k, v) for k, v in entry.items() if k not in _ENTRY_KEYS and k not in _CALL_KEYS and v is not None)
    calls = _message_calls(entry, role=role, field=field)
    if calls:
        message["tool_calls"] = calls
    return message


def _message_calls(entry: dict, *, role: str, field: str) -> list[dict]:
    """An OpenAI message's tool calls, normalised; [] when it has none."""
    raw_calls = entry.get("tool_calls")
    legacy = entry.get("function_call")
    if raw_calls is None and legacy is None:
        return []
    if role != "assistant":
        key = "tool_calls" if raw_calls is not None else "function_call"
        raise RowError(BAD_TOOL_CALL, f"{field}.{key}", f"only assistant messages carry tool calls, not {role}")
    if raw_calls is not None:
        if not isinstance(raw_calls, list):
            raise RowError(
                WRONG_TYPE, f"{field}.tool_calls", f"expected a list of tool calls, got {_type_name(raw_calls)}"
            )
        return [_openai_call(call, field=f"{field}.tool_calls[{i}]") for i, call in enumerate(raw_calls)]
    # The pre-tools OpenAI API: one {"name", "arguments"} object.
    return [_call(legacy, field=f"{field}.function_call", call_id=None)]


def _openai_call(value: object, *, field: str) -> dict:
    if not isinstance(value, dict):
        raise RowError(WRONG_TYPE, field, f"expected a tool call object, got {_type_name(value)}")
    function = value.get("function")
    # Some exports flatten the call ({"name", "arguments"} beside "id"); templates accept both.
    function_field = f"{field}.function" if function is not None else field
    call_id = value.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise RowError(WRONG_TYPE, f"{field}.id", f"expected a string, got {_type_name(call_id)}")
    return _call(function if function is not None else value, field=function_field, call_id=call_id)


def _sharegpt_calls(value: object, *, field: str) -> list[dict]:
    if value is None:
        raise RowError(MISSING_FIELD, field, "function_call entry has no value (the call as JSON)")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(BAD_JSON, field, f"function_call value is not valid JSON: {exc}") from None
    calls = value if isinstance(value, list) else [value]
    if not calls:
        raise RowError(BAD_TOOL_CALL, field, "function_call value holds no call")
    return [
        _call(call, field=field if len(calls) == 1 and not isinstance(value, list) else f"{field}[{i}]", call_id=None)
        for i, call in enumerate(calls)
    ]


def _call(value: object, *, field: str, call_id: str | None) -> dict:
    """One call as the template expects it: {"type", "function": {"name", "arguments": {...}}} (+ "id")."""
    if not isinstance(value, dict):
        raise RowError(WRONG_TYPE, field, f"expected a function call object, got {_type_name(value)}")
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        problem = "has no 'name'" if name is None else f"'name' must be a non-empty string, got {_type_name(name)}"
        raise RowError(BAD_TOOL_CALL, f"{field}.name", f"tool call {problem}")
    call: dict = {"id": call_id} if call_id else {}
    call["type"] = "function"
    call["function"] = {"name": name, "arguments": _arguments(value, field=field)}
    return call


def _arguments(call: dict, *, field: str) -> dict:
    # "parameters" is what some ShareGPT exports (and Llama-style calls) name the arguments.
    key = "arguments" if "arguments" in call or "parameters" not in call else "parameters"
    value = call.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(BAD_JSON, f"{field}.{key}", f"arguments are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RowError(BAD_TOOL_CALL, f"{field}.{key}", f"arguments must be a JSON object, got {_type_name(value)}")
    return value


def _content(value: object, *, field: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RowError(WRONG_TYPE, field, f"expected a string or a list of text parts, got {_type_name(value)}")
    texts = []
    for i, part in enumerate(value):
        part_field = f"{field}[{i}]"
        if not isinstance(part, dict):
            raise RowError(WRONG_TYPE, part_field, f"expected a content part object, got {_type_name(part)}")
        kind = part.get("type")
        if kind is None:
            raise RowError(MISSING_FIELD, f"{part_field}.type", "content part has no 'type'")
        if kind != "text":
            raise RowError(UNSUPPORTED_CONTENT, f"{part_field}.type", f"only text parts are supported, got {kind!r}")
        text = part.get("text")
        if not isinstance(text, str):
            raise RowError(WRONG_TYPE, f"{part_field}.text", f"expected a string, got {_type_name(text)}")
        texts.append(text)
    return "".join(texts)


def _tools(value: object) -> list[dict] | None:
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(BAD_JSON, "tools", f"string is not valid JSON: {exc}") from None
    if value is None:
        return None
    if not isinstance(value, list):
        raise RowError(WRONG_TYPE, "tools", f"expected a list of function schemas, got {_type_name(value)}")
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise RowError(WRONG_TYPE, f"tools[{i}]", f"expected a function schema object, got {_type_name(tool)}")
    return value or None


def _optional_string(value: object, *, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise RowError(WRONG_TYPE, field, f"expected a string, got {_type_name(value)}")


def _shape_field(fields: list[str]) -> str:
    # "messages[0].content" -> "messages"; "prompt" stays.
    return fields[-1].split("[", 1)[0]


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
