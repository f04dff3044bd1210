"""Reasoning and answer text of one generated turn, split at the think-end marker.

Shared by the multi-turn engine (`--history own`): the model's previous turn goes back into
the next prompt as an assistant message with `reasoning_content` and `content`, which the chat
template then renders its own way (most drop the reasoning of earlier turns).
"""

from __future__ import annotations

from typing import NamedTuple

from eagle_synth.templating import THINK_CLOSE, THINK_OPEN


class SplitTurn(NamedTuple):
    """A generated turn's text in two parts, both stripped of surrounding whitespace."""

    reasoning: str
    content: str


def split_reasoning(text: str, think_end: str = THINK_CLOSE, *, think_start: str = THINK_OPEN) -> SplitTurn:
    """(reasoning, content): the text before the first `think_end` and the text after it.

    A `think_start` the model wrote itself (templates whose prompt does not open the block) is
    dropped from the reasoning. Text without `think_end` is all content: a turn that never
    closed its reasoning was cut short, and its caller decides what that means.
    """
    before, found, after = text.partition(think_end)
    if not found:
        return SplitTurn(reasoning="", content=text.strip())
    reasoning = before.strip()
    if think_start and reasoning.startswith(think_start):
        reasoning = reasoning[len(think_start) :].strip()
    return SplitTurn(reasoning=reasoning, content=after.strip())
