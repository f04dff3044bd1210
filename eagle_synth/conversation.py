"""Multi-turn regeneration on the model's own answers (`enqueue --history own`), for producer and workers.

Once turn k's record is committed, the model's answer (reasoning split at the think-end token; in
rows with tools, tool calls parsed and paired with the dataset's results) becomes the history of
turn k+1's prompt; docs/records.md ("Conversations") states it id for id. A turn's key hashes the
conversation's key and the turn index, so each turn is claimed exactly once (docs/reliability.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from eagle_synth import reasons
from eagle_synth.payload import key_digest
from eagle_synth.regeneration import regeneration_points
from eagle_synth.toolcalls import ParsedAnswer, parse_tool_calls
from eagle_synth.toolcalls.pairing import (
    TOOL_CALL_MISMATCH,
    TOOL_CALL_UNPARSED,
    TOOL_RESULTS_UNPAIRED,
    Mismatch,
    ToolStep,
    dataset_step,
    pair_tool_results,
)

# Why a conversation stopped before or after its last user turn (the `status` / `failed` slugs).
END_COMPLETE = "complete"  # every user turn (up to --max-turns) was answered
END_MAX_TURNS = "max-turns"  # --max-turns was reached with user turns left
END_TRUNCATED = "truncated"  # a turn ended on max_new_tokens; its record is kept
END_PROMPT_TOO_LONG = reasons.PROMPT_TOO_LONG  # the next turn's prompt is over --max-prompt-tokens
END_TEMPLATE_ERROR = "template-error"  # the chat template rejected the next turn
# ... and, in rows with tools, the model departing from the dataset's step (pairing.py's slugs).
END_REASONS = (
    END_COMPLETE,
    END_MAX_TURNS,
    END_TRUNCATED,
    END_PROMPT_TOO_LONG,
    END_TEMPLATE_ERROR,
    TOOL_CALL_MISMATCH,
    TOOL_CALL_UNPARSED,
    TOOL_RESULTS_UNPAIRED,
)
# Roles the model's answers replace: the dataset's assistant turns and the tool results that
# answered the dataset's tool calls (the model's own calls are never executed).
REPLACED_ROLES = frozenset({"assistant", "tool"})


class ConversationState(msgspec.Struct):
    """Where a conversation stands when one of its turns is queued.

    Parameters:
        key: the conversation's stable key (conversation_key).
        messages: the messages this turn's prompt was rendered from (system, the history with
            the model's own earlier answers, and this turn's user message).
        upcoming: the new messages of each later turn, in order; each ends with a user message,
            or is empty for a turn that answers tool results (the results come from `steps`).
        tools: the row's tool schemas, or None.
        template_kwargs: the chat template arguments (campaign's, with the variant's on top).
        cut: the row had more turns than --max-turns; ending after the last of `upcoming`
            is `max-turns`, not `complete`.
        steps: in rows with tools, what the dataset did after this turn's point and after each
            upcoming one ({"calls": [...], "results": [...]}, pairing.ToolStep); None otherwise.
    """

    key: str
    messages: list[dict]
    upcoming: list[list[dict]] = msgspec.field(default_factory=list)
    tools: list[dict] | None = None
    template_kwargs: dict = msgspec.field(default_factory=dict)
    cut: bool = False
    steps: list[dict] | None = None

    def to_dict(self) -> dict:
        """JSON- and msgpack-safe form carried by the payload and kept with failures."""
        return msgspec.structs.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ConversationState:
        return msgspec.convert(data, cls)


def conversation_key(
    *, turns: Sequence[Sequence[dict]], tools: list[dict] | None, sample: int, steps: list[dict] | None = None
) -> str:
    """Stable key of one conversation: its turns' messages (the dataset's answers left out), its
    tools, its tool steps (which its prompts carry) and the sample index; rows that differ only
    in their old answers are one conversation, as their prompts would be."""
    fields: dict = {"turns": [list(t) for t in turns], "tools": tools or None, "sample": sample}
    if steps is not None:
        fields["steps"] = steps
    return key_digest(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode())


def turn_key(conversation: str, turn: int) -> str:
    """Prompt key of a conversation's turn `turn` (0-based)."""
    return key_digest(f"{conversation}|turn|{turn}".encode())


def has_tools(messages: Iterable[dict], tools: list[dict] | None) -> bool:
    """Is this row replayed with tools: does it offer tools, or does its history use them?"""
    return bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


def split_turns(messages: Sequence[dict]) -> tuple[list[list[dict]], list[dict], list[int]]:
    """A row as turns: (new messages of each turn, the dataset's step after each turn's point,
    the points' indexes in `messages`). Every regeneration point is a turn; its new messages are
    those after the previous point up to its own, less REPLACED_ROLES (a turn that answers tool
    results has none: they come back paired with the model's calls). Messages after the last
    point belong to no turn."""
    points = regeneration_points(messages)
    rows = list(messages)
    turns = [
        [dict(m) for m in rows[a + 1 : b + 1] if m["role"] not in REPLACED_ROLES] for a, b in zip([-1, *points], points)
    ]
    steps = [{"calls": step.calls, "results": step.results} for step in (dataset_step(rows, p) for p in points)]
    return turns, steps, points


def answer_message(
    tokenizer, output_ids: Sequence[int], *, eos_token_ids: Iterable[int], matched: int | str | None, think_close_id
) -> dict:
    """The assistant message a turn's output becomes in the next turn's history (no tools)."""
    answer, reasoning = parse_answer(
        tokenizer, output_ids, eos_token_ids=eos_token_ids, matched=matched, think_close_id=think_close_id
    )
    message = {"role": "assistant", "content": answer.content}
    return message if reasoning is None else {**message, "reasoning_content": reasoning}


def parse_answer(
    tokenizer,
    output_ids: Sequence[int],
    *,
    eos_token_ids: Iterable[int],
    matched: int | str | None,
    think_close_id: int | None,
    tool_format: str | None = None,
    tools: list[dict] | None = None,
) -> tuple[ParsedAnswer, str | None]:
    """A turn's answer, without a final EOS or matched stop id: its content and (in a row with
    tools, given its `tool_format`) tool calls, and the decoded reasoning before the think-end
    token (None when the output has none)."""
    ids = list(output_ids)
    if ids and (ids[-1] in set(eos_token_ids) or (isinstance(matched, int) and ids[-1] == matched)):
        ids.pop()
    reasoning = None
    if think_close_id is not None and think_close_id in ids:
        cut = ids.index(think_close_id)
        reasoning = tokenizer.decode(ids[:cut], skip_special_tokens=True).strip()
        ids = ids[cut + 1 :]
    if tool_format is not None:
        text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        parsed = parse_tool_calls(text, family=tool_format, tools=tools)
        if parsed.tool_calls or parsed.unparsed:
            return parsed, reasoning
    # Words only: the same content as without tools.
    return ParsedAnswer(content=tokenizer.decode(ids, skip_special_tokens=True).strip()), reasoning


class NextTurn(msgspec.Struct, frozen=True):
    """What comes after a committed turn: the next prompt's `ids` and `state`, or (both None) the
    END_* reason the conversation ends for (`end`) and its details (`message`)."""

    ids: list[int] | None = None
    state: ConversationState | None = None
    end: str | None = None
    message: str = ""


def end_before_render(state: ConversationState, *, finish_reason: str) -> str | None:
    """The end reason known from the committed turn alone, or None if a next turn follows."""
    if finish_reason == "length":
        return END_TRUNCATED
    if not state.upcoming:
        return END_MAX_TURNS if state.cut else END_COMPLETE
    return None


def next_turn(
    tokenizer,
    state: ConversationState,
    output_ids: Sequence[int],
    *,
    finish_reason: str,
    matched: int | str | None,
    eos_token_ids: Iterable[int],
    think_close_id: int | None,
    max_prompt_tokens: int | None = None,
    tool_format: str | None = None,
) -> NextTurn:
    """Render the turn after a committed one, or say why the conversation ends; rows with tools
    need the campaign's `tool_format` (ValueError without it)."""
    from eagle_synth.errors import TemplateError
    from eagle_synth.templating import render_prompt_ids

    end = end_before_render(state, finish_reason=finish_reason)
    if end is not None:
        return NextTurn(end=end)
    stops: dict[str, Any] = {"eos_token_ids": eos_token_ids, "matched": matched, "think_close_id": think_close_id}
    if state.steps is None:
        answer = [answer_message(tokenizer, output_ids, **stops)]
    else:
        if tool_format is None or not state.steps:
            raise ValueError("this conversation has tools but no tool steps, or the campaign no tool-call format")
        parsed, reasoning = parse_answer(tokenizer, output_ids, **stops, tool_format=tool_format, tools=state.tools)
        replay = pair_tool_results(parsed, ToolStep(**state.steps[0]), reasoning=reasoning or "")
        if isinstance(replay, Mismatch):
            return NextTurn(end=replay.reason, message=replay.detail)
        if reasoning is None:
            replay.assistant.pop("reasoning_content", None)
        answer = [replay.assistant, *replay.tool_messages]
    messages = [*state.messages, *answer, *state.upcoming[0]]
    try:
        ids = render_prompt_ids(tokenizer, messages, tools=state.tools, template_kwargs=state.template_kwargs)
    except TemplateError as exc:
        return NextTurn(end=END_TEMPLATE_ERROR, message=str(exc))
    if max_prompt_tokens and len(ids) > max_prompt_tokens:
        return NextTurn(end=END_PROMPT_TOO_LONG, message=f"{len(ids)} tokens > --max-prompt-tokens {max_prompt_tokens}")
    steps = state.steps[1:] if state.steps is not None else None
    return NextTurn(
        ids=ids, state=msgspec.structs.replace(state, messages=messages, upcoming=state.upcoming[1:], steps=steps)
    )
