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

The producer and the workers both use this module, so turn 0 and every later turn are made
by the same code. Keys: a conversation's key is a hash of what defines it (its messages without
the dataset's answers, tools, and the sample index); a turn's key is a hash of the conversation
key and the turn index, so each turn of a conversation can be claimed exactly once, whatever
happens to the records before it (docs/reliability.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from eagle_synth.payload import KEY_HEX_DIGITS

# Why a conversation stopped before or after its last user turn (the `status` / `failed` slugs).
END_COMPLETE = "complete"  # every user turn (up to --max-turns) was answered
END_MAX_TURNS = "max-turns"  # --max-turns was reached with user turns left
END_TRUNCATED = "truncated"  # a turn ended on max_new_tokens; its record is kept
END_PROMPT_TOO_LONG = "prompt-too-long"  # the next turn's prompt is over --max-prompt-tokens
END_TEMPLATE_ERROR = "template-error"  # the chat template rejected the next turn
END_REASONS = (END_COMPLETE, END_MAX_TURNS, END_TRUNCATED, END_PROMPT_TOO_LONG, END_TEMPLATE_ERROR)
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
        upcoming: the new messages of each later turn, in order; each ends with a user message.
        tools: the row's tool schemas, or None.
        template_kwargs: the chat template arguments (campaign's, with the variant's on top).
        cut: the row had more user turns than --max-turns; ending after the last of `upcoming`
            is `max-turns`, not `complete`.
    """

    key: str
    messages: list[dict]
    upcoming: list[list[dict]] = field(default_factory=list)
    tools: list[dict] | None = None
    template_kwargs: dict = field(default_factory=dict)
    cut: bool = False

    def to_dict(self) -> dict:
        """JSON- and msgpack-safe form carried by the payload and kept with failures."""
        return {
            "key": self.key,
            "messages": self.messages,
            "upcoming": self.upcoming,
            "tools": self.tools,
            "template_kwargs": self.template_kwargs,
            "cut": self.cut,
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
        )


def _digest(material: bytes) -> str:
    return hashlib.blake2b(material, digest_size=KEY_HEX_DIGITS // 2).hexdigest()


def conversation_key(*, turns: Sequence[Sequence[dict]], tools: list[dict] | None, sample: int) -> str:
    """Stable key of one conversation: its turns' messages (the dataset's answers left out),
    its tools and the sample index. Rows that differ only in their old answers are one
    conversation, as their prompts would be."""
    material = json.dumps(
        {"turns": [list(t) for t in turns], "tools": tools or None, "sample": sample},
        sort_keys=True,
        ensure_ascii=False,
    )
    return _digest(material.encode())


def turn_key(conversation: str, turn: int) -> str:
    """Prompt key of a conversation's turn `turn` (0-based)."""
    return _digest(f"{conversation}|turn|{turn}".encode())


def split_turns(messages: Iterable[dict]) -> tuple[list[list[dict]], list[dict]]:
    """The new messages of each turn, and the messages after the last user turn.

    Assistant and tool messages are dropped (the model's answers replace them); every other
    message (system, user) stays in order, and a turn closes with each user message.
    """
    turns: list[list[dict]] = []
    current: list[dict] = []
    for message in messages:
        if message["role"] in REPLACED_ROLES:
            continue
        current.append(message)
        if message["role"] == "user":
            turns.append(current)
            current = []
    return turns, current


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
) -> NextTurn:
    """Render the turn after a committed one, or say why the conversation ends (see module doc)."""
    from eagle_synth.templating import TemplateError, render_prompt_ids

    end = end_before_render(state, finish_reason=finish_reason)
    if end is not None:
        return NextTurn(end=end)
    answer = answer_message(
        tokenizer, output_ids, eos_token_ids=eos_token_ids, matched=matched, think_close_id=think_close_id
    )
    messages = [*state.messages, answer, *state.upcoming[0]]
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
    )
    return NextTurn(ids=ids, state=following)
