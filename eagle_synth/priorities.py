"""Campaign priorities on a shared fleet: the levels `enqueue --priority` and `eagle-synth
priority` take, where a campaign keeps its own (CampaignKeys.priority), and how one becomes a
broker message's priority (eagle_synth/queue.py). Light to import: the CLI reads it for its
flags' help; changing a running campaign's is eagle_synth/state/campaign_control.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eagle_synth.errors import BadPriority
from eagle_synth.state.keys import CampaignKeys

if TYPE_CHECKING:
    import redis

# `enqueue --priority`: higher is served first. Ten levels, kombu's whole message-priority
# range, each its own Redis list (benchmarks/routing.py measures what the lists cost a BRPOP).
PRIORITIES = range(10)
# What a campaign gets without --priority: the middle, so one can be put ahead or behind.
DEFAULT_PRIORITY = 5


def message_priority(priority: int) -> int:
    """kombu's priority of a message (0 is served first) for a campaign priority (9 is served first)."""
    return max(PRIORITIES) - priority


def check_priority(priority: int) -> int:
    if priority not in PRIORITIES:
        raise BadPriority(
            f"priority {priority} is not usable: use {min(PRIORITIES)} to {max(PRIORITIES)} (higher first)"
        )
    return priority


def campaign_priority(client: redis.Redis, campaign: str) -> int:
    """The campaign's priority (DEFAULT_PRIORITY when none was set)."""
    return _priority(client.get(CampaignKeys(campaign).priority))


def publish_facts(client: redis.Redis, campaign: str) -> tuple[int, bool]:
    """(priority, cancelled) of a campaign in one round trip: what every publish needs."""
    keys = CampaignKeys(campaign)
    raw_priority, marker = client.mget(keys.priority, keys.cancelled)
    return _priority(raw_priority), marker is not None


def _priority(raw: bytes | str | None) -> int:
    try:
        return check_priority(int(raw)) if raw is not None else DEFAULT_PRIORITY
    except (ValueError, BadPriority):
        return DEFAULT_PRIORITY
