"""Multi-turn regeneration on the model's own answers (`enqueue --history own`): the contract.

A conversation is a row's system message, tools and user turns. Turn 0's prompt is the chat
template over the system message and the first user message, exactly as the producer renders
every prompt. Once turn k's record is committed, the model's answer becomes an assistant
message and turn k+1's prompt is the template over the history so far, that answer, and the
next user message:

    answer = {"role": "assistant", "content": C, "reasoning_content": R}

where, from turn k's output ids with a final stop token removed (EOS or the matched stop id):
if the think-end token (`</think>`) occurs, R = decode(ids before it).strip() and
C = decode(ids after it).strip(); otherwise R is absent and C = decode(ids).strip(). Decoding
drops special tokens. Turn k+1's prompt ids are
`apply_chat_template(messages, tools=tools, add_generation_prompt=True, **chat_template_kwargs)`,
so each template does with past reasoning what it does when serving (drop it or keep it).

Rows with tools (they offer tools, or their history calls them) are replayed: every
regeneration point is a turn (user messages and the ends of tool-result runs), and the answer
is parsed for tool calls in the campaign's format (eagle_synth.toolcalls). The output ids, a
final stop removed, are split at the think-end token; R = decode(ids before it).strip() as
above, and the ids after it are decoded with special tokens kept (the call markers are special
tokens) and parsed. An answer without calls gives C exactly as above; one with calls gives
C = the text before the first call, stripped, and

    answer = {"role": "assistant", "content": C, "reasoning_content": R,
              "tool_calls": [{"id"?, "type": "function", "function": {"name": ..., "arguments": {...}}}]}

followed by the dataset's tool results of that step, the model's i-th call answered by the
dataset's i-th result (eagle_synth.toolcalls.pairing). When the model departs from the
dataset's step (another function, another number of calls, a call that does not parse, a
call where the dataset answered in words) the conversation ends there with that reason; the
turn's record is kept. `reasoning_content` is absent when the output has no think-end token.

The producer and the workers both use this module, so turn 0 and every later turn are made
by the same code. Keys: a conversation's key is a hash of what defines it (its messages without
the dataset's answers, tools, tool steps, and the sample index); a turn's key is a hash of the conversation
key and the turn index, so each turn of a conversation can be claimed exactly once, whatever
happens to the records before it (docs/reliability.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from eagle_synth import reasons
from eagle_synth.payload import KEY_HEX_DIGITS
from eagle_synth.regeneration import regeneration_points
from eagle_synth.toolcalls import ParsedAnswer, parse_tool_calls
from eagle_synth.toolcalls.pairing import (
    TOOL_CALL_MISMATCH,
    TOOL_CALL_UNPARSED,
    TOOL_RESULTS_UNPAIRED,
    Mismatch,
    Replay,
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


@dataclass(slots=True)
class ConversationState:
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
    upcoming: list[list[dict]] = field(default_factory=list)
    tools: list[dict] | None = None
    template_kwargs: dict = field(default_factory=dict)
    cut: bool = False
    steps: list[dict] | None = None

    def to_dict(self) -> dict:
        """JSON- and msgpack-safe form carried by the payload and kept with failures."""
        return {
            "key": self.key,
            "messages": self.messages,
            "upcoming": self.upcoming,
            "tools": self.tools,
            "template_kwargs": self.template_kwargs,
            "cut": self.cut,
            "steps": self.steps,
        }

    @classmethod
    def from_dict(cls, data: dict) -> ConversationState:
        return cls(
            key=data["key"],
            messages=list(data["messages"]),
            upcoming=list(data.get("upcoming") or []),
            tools=data.get("tools"),
            template_kwargs=dict(data.get("template_kwargs") or {}),
            cut=bool(data.get("cut")),
            steps=data.get("steps"),
        )


def _digest(material: bytes) -> str:
    return hashlib.blake2b(material, digest_size=KEY_HEX_DIGITS // 2).hexdigest()


def conversation_key(
    *, turns: Sequence[Sequence[dict]], tools: list[dict] | None, sample: int, steps: list[dict] | None = None
) -> str:
    """Stable key of one conversation: its turns' messages (the dataset's answers left out),
    its tools, its tool steps (the dataset's calls and results, which its prompts carry) and
    the sample index. Rows that differ only in their old answers are one conversation, as
    their prompts would be."""
    fields: dict = {"turns": [list(t) for t in turns], "tools": tools or None, "sample": sample}
    if steps is not None:
        fields["steps"] = steps
    material = json.dumps(fields, sort_keys=True, ensure_ascii=False)
    return _digest(material.encode())


def turn_key(conversation: str, turn: int) -> str:
    """Prompt key of a conversation's turn `turn` (0-based)."""
    return _digest(f"{conversation}|turn|{turn}".encode())


def has_tools(messages: Iterable[dict], tools: list[dict] | None) -> bool:
    """Is this row replayed with tools: does it offer tools, or does its history use them?"""
    return bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


def split_turns(messages: Sequence[dict]) -> tuple[list[list[dict]], list[dict], list[int]]:
    """A row as turns: (new messages of each turn, the dataset's step after each turn's point,
    the points' indexes in `messages`).

    Every regeneration point is a turn (in a row without tools: every user message). A turn's
    new messages are those after the previous point up to its own, without assistant and tool
    messages: the model's answers replace the dataset's, and a step's results come back paired
    with the model's calls, so a turn that answers tool results has none. Messages after the
    last point belong to no turn.
    """
    points = regeneration_points(messages)
    turns, steps = [], []
    previous = -1
    for point in points:
        turns.append([dict(m) for m in messages[previous + 1 : point + 1] if m["role"] not in REPLACED_ROLES])
        step = dataset_step(list(messages), point)
        steps.append({"calls": step.calls, "results": step.results})
        previous = point
    return turns, steps, points


def strip_final_stop(
    output_ids: Sequence[int], *, eos_token_ids: Iterable[int], matched: int | str | None
) -> list[int]:
    """Output ids without a final EOS or matched stop id (what a chat client would keep)."""
    ids = list(output_ids)
    if ids and (ids[-1] in set(eos_token_ids) or (isinstance(matched, int) and ids[-1] == matched)):
        ids.pop()
    return ids


def answer_message(
    tokenizer,
    output_ids: Sequence[int],
    *,
    eos_token_ids: Iterable[int],
    matched: int | str | None,
    think_close_id: int | None,
) -> dict:
    """The assistant message a turn's output becomes in the next turn's history (see module doc)."""
    ids = strip_final_stop(output_ids, eos_token_ids=eos_token_ids, matched=matched)
    if think_close_id is not None and think_close_id in ids:
        cut = ids.index(think_close_id)
        reasoning = tokenizer.decode(ids[:cut], skip_special_tokens=True).strip()
        content = tokenizer.decode(ids[cut + 1 :], skip_special_tokens=True).strip()
        return {"role": "assistant", "content": content, "reasoning_content": reasoning}
    return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True).strip()}


def parse_answer(
    tokenizer,
    output_ids: Sequence[int],
    *,
    eos_token_ids: Iterable[int],
    matched: int | str | None,
    think_close_id: int | None,
    tool_format: str,
    tools: list[dict] | None,
) -> tuple[ParsedAnswer, str | None]:
    """A turn's answer in a row with tools: its content and tool calls, and its reasoning (None
    when the output has no think-end token). See the module docstring."""
    ids = strip_final_stop(output_ids, eos_token_ids=eos_token_ids, matched=matched)
    reasoning = None
    if think_close_id is not None and think_close_id in ids:
        cut = ids.index(think_close_id)
        reasoning = tokenizer.decode(ids[:cut], skip_special_tokens=True).strip()
        ids = ids[cut + 1 :]
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    parsed = parse_tool_calls(text, family=tool_format, tools=tools)
    if not parsed.tool_calls and not parsed.unparsed:  # words only: the same content as without tools
        parsed = ParsedAnswer(content=tokenizer.decode(ids, skip_special_tokens=True).strip())
    return parsed, reasoning


def replay_step(
    tokenizer,
    state: ConversationState,
    output_ids: Sequence[int],
    *,
    matched: int | str | None,
    eos_token_ids: Iterable[int],
    think_close_id: int | None,
    tool_format: str,
) -> Replay | Mismatch:
    """The model's answer and the dataset's paired tool results, or how the model departed."""
    if not state.steps:
        raise ValueError("replay_step needs a conversation state with tool steps")
    parsed, reasoning = parse_answer(
        tokenizer,
        output_ids,
        eos_token_ids=eos_token_ids,
        matched=matched,
        think_close_id=think_close_id,
        tool_format=tool_format,
        tools=state.tools,
    )
    step = state.steps[0]
    replay = pair_tool_results(
        parsed, ToolStep(calls=step["calls"], results=step["results"]), reasoning=reasoning or ""
    )
    if isinstance(replay, Replay) and reasoning is None:
        replay.assistant.pop("reasoning_content", None)
    return replay


@dataclass(frozen=True, slots=True)
class NextTurn:
    """What comes after a committed turn: a prompt to queue, or why the conversation ends.

    Parameters:
        ids: the next turn's prompt ids (None when the conversation ends).
        state: the next turn's conversation state (None when it ends).
        end: an END_* reason when the conversation ends here.
        message: details for the end (the template's error, the prompt length).
    """

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
    """Render the turn after a committed one, or say why the conversation ends (see module doc).

    `tool_format` (the campaign's) is needed for rows with tools (ValueError without it)."""
    from eagle_synth.templating import TemplateError, render_prompt_ids

    end = end_before_render(state, finish_reason=finish_reason)
    if end is not None:
        return NextTurn(end=end)
    if state.steps is None:
        answer = [
            answer_message(
                tokenizer, output_ids, eos_token_ids=eos_token_ids, matched=matched, think_close_id=think_close_id
            )
        ]
    else:
        if tool_format is None:
            raise ValueError("this conversation has tools but the campaign has no tool-call format")
        replay = replay_step(
            tokenizer,
            state,
            output_ids,
            matched=matched,
            eos_token_ids=eos_token_ids,
            think_close_id=think_close_id,
            tool_format=tool_format,
        )
        if isinstance(replay, Mismatch):
            return NextTurn(end=replay.reason, message=replay.detail)
        answer = [replay.assistant, *replay.tool_messages]
    messages = [*state.messages, *answer, *state.upcoming[0]]
    try:
        ids = render_prompt_ids(tokenizer, messages, tools=state.tools, template_kwargs=state.template_kwargs)
    except TemplateError as exc:
        return NextTurn(end=END_TEMPLATE_ERROR, message=str(exc))
    if max_prompt_tokens and len(ids) > max_prompt_tokens:
        return NextTurn(end=END_PROMPT_TOO_LONG, message=f"{len(ids)} tokens > --max-prompt-tokens {max_prompt_tokens}")
    following = ConversationState(
        key=state.key,
        messages=messages,
        upcoming=state.upcoming[1:],
        tools=state.tools,
        template_kwargs=state.template_kwargs,
        cut=state.cut,
        steps=state.steps[1:] if state.steps is not None else None,
    )
    return NextTurn(ids=ids, state=following)
