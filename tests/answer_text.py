"""Split a rendered or decoded answer's text at `</think>`: how these tests read answers as text.

Production splits output ids at the think-end id (eagle_synth.conversation.parse_answer); tests
that work on template-rendered text (no ids) use this equivalent on text.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, content), both stripped; no `</think>`: all content. A `<think>` the model
    wrote itself is dropped from the reasoning."""
    before, found, after = text.partition(THINK_CLOSE)
    if not found:
        return "", text.strip()
    reasoning = before.strip()
    if reasoning.startswith(THINK_OPEN):
        reasoning = reasoning[len(THINK_OPEN) :].strip()
    return reasoning, after.strip()
