"""Batches left in the single queue of versions before the shared fleet move to their campaign's queue.

Before every campaign had a queue of its own (eagle_synth/queue.py), all batches went to one
queue, the base name itself (`eagle-synth`). After an upgrade mid-campaign no worker consumes
that queue any more: the batches it still holds (queued when the old workers stopped, or put
back there later by kombu's restore of an old worker's `unacked` entry) would wait forever, and
the reconciler would publish a second copy of each once it counted them lost.

`adopt_base_queue` moves each of our messages found there to its campaign's queue, at the
campaign's priority, one Lua step each (the message leaves the old list and enters the new one
together, or not at all if a worker took it meanwhile), so none is doubled or lost. A message
that is not ours stays where it is. The reconciler runs it every round; when the old lists are
empty it costs one round trip.
"""

from __future__ import annotations

import logging

import redis

from eagle_synth.priorities import campaign_priority, message_priority
from eagle_synth.queue import PRIORITY_STEPS, campaign_queue, payload_of_entry, queue_lists, readdressed
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.redis_client import pipelined

log = logging.getLogger("eagle_synth.queue_upgrade")

# Takes one message off a list and pushes its new form onto another, unless a worker took it.
_MOVE_MESSAGE = LuaScript("move_message")


def adopt_base_queue(client: redis.Redis, base_queue: str) -> dict[str, int]:
    """Move our messages out of the base queue's lists into their campaigns' queues;
    returns how many moved, per campaign."""
    lists = queue_lists(base_queue)
    lengths = pipelined(client, *(("llen", name) for name in lists))
    moved: dict[str, int] = {}
    for source, length in zip(lists, lengths, strict=True):
        if not int(length):
            continue
        # Oldest first (kombu pushes left and pops right), so the moved keep their order.
        for raw in reversed(client.lrange(source, 0, -1)):
            payload = payload_of_entry(raw)
            if payload is None:
                continue  # not one of ours: left as it is
            campaign = str(payload["campaign"])
            queue = campaign_queue(base_queue, campaign)
            priority = message_priority(campaign_priority(client, campaign))
            target = queue_lists(queue)[PRIORITY_STEPS.index(priority)]
            message = readdressed(raw, queue=queue, priority=priority)
            if _MOVE_MESSAGE(client, (source, target), (raw, message)):
                moved[campaign] = moved.get(campaign, 0) + 1
    for campaign, count in moved.items():
        log.warning(
            "%d batches of campaign %s were in the queue %s of an earlier version: moved to %s",
            count,
            campaign,
            base_queue,
            campaign_queue(base_queue, campaign),
        )
    return moved
