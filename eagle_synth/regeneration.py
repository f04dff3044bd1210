"""Where in a conversation the model answers: the regeneration points, one walk shared by the
producer (which turns become prompts) and the workers (which dataset step follows a turn)."""

from __future__ import annotations

from collections.abc import Sequence


def regeneration_points(messages: Sequence[dict]) -> list[int]:
    """Indexes of the messages the model answers after, in order.

    Every user message is one; so is the last message of each run of tool results after the
    first user message (parallel calls give one run, hence one point). Tool results before any
    user turn are context, not a point. Messages are OpenAI-style dicts with a "role".
    """
    points = []
    seen_user = False
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "user":
            seen_user = True
            points.append(i)
        elif role == "tool" and seen_user and (i + 1 == len(messages) or messages[i + 1]["role"] != "tool"):
            points.append(i)
    return points
