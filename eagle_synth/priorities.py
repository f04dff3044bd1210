"""Campaign priorities on a shared fleet: the levels `enqueue --priority` and `eagle-synth
priority` take, and how one becomes a broker message's priority (eagle_synth/queue.py).
Light to import: the CLI reads it for its flags' help.
"""

from __future__ import annotations

# `enqueue --priority`: higher is served first. Ten levels, kombu's whole message-priority
# range, each its own Redis list (benchmarks/routing.py measures what the lists cost a BRPOP).
PRIORITIES = range(10)
# What a campaign gets without --priority: the middle, so one can be put ahead or behind.
DEFAULT_PRIORITY = 5


def message_priority(priority: int) -> int:
    """kombu's priority of a message (0 is served first) for a campaign priority (9 is served first)."""
    return max(PRIORITIES) - priority
