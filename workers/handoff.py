"""Host queues: the worker that commits a conversation's turn k is preferred for turn k+1.

Turn k+1 resends turn k's prompt and answer, which the server that generated turn k still holds
in its prefix cache; only the worker that sent turn k knows that server (workers/affinity.py).
So the follow-ups a worker publishes (workers/followups.py) go to its own host queue of the
campaign, `<campaign queue>@<node>` (eagle_synth/queue.py host_queue), which it consumes beside
the campaign's queue while its health gate takes the campaign. Nobody else consumes it:

* a message that waited HANDOFF_DELAY seconds in a live worker's host queue (its worker is
  saturated, or stopped taking batches) is handed to the campaign's queue, at the end taken next,
  by that worker's own Handoff;
* a dead worker's host queue (no heartbeat in WORKERS_INDEX) is handed over at once by every
  live worker's Handoff, and dropped from the registry (HOST_QUEUES) once empty.

A hand-off is one script (LREM from the host list, RPUSH to the campaign's list of the same
priority), so a message is in one list or taken, never both: exactly-once is the batches' own
(claims, leases, fenced commits), whatever list a copy came from. The moved message is addressed
to the campaign queue, so a later restore (a requeue, the reaper) returns it there.

Cost per worker and HANDOFF_INTERVAL: one HGETALL of the registry (a field per worker and
campaign with conversations) and one pipelined LLEN over its own host queues' priority lists.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import cast

import redis

from eagle_synth.queue import queue_lists, readdressed
from eagle_synth.settings import TIMINGS
from eagle_synth.state.keys import HOST_QUEUES, WORKERS_INDEX
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.redis_client import pipelined, text

log = logging.getLogger("eagle_synth.handoff")

# Seconds a next turn waits in a live worker's host queue before any worker may take it: far
# above the time an owner with free slots takes to fetch it (none of 224 next turns was seen
# waiting when the host queues were sampled every 0.02 s, benchmarks/affinity.py), short against
# a turn's generation on a GPU (seconds to minutes): a saturated owner delays a turn by at most this.
HANDOFF_DELAY = TIMINGS.handoff_delay
# Seconds between looks at the host queues.
HANDOFF_INTERVAL = 0.25
# Moves one message from a host queue to the campaign queue, unless a worker took it meanwhile.
_HAND_OFF = LuaScript("hand_off")
# Drops a host queue from the registry once every list of it is empty.
_FORGET_EMPTY_QUEUE = LuaScript("forget_empty_queue")


@dataclass
class Handoff:
    """Hands waiting next turns from host queues to their campaigns' queues (module docstring).

    Parameters:
        client: the broker's Redis.
        node: this worker's node name (its own host queues wait HANDOFF_DELAY, dead ones none).
        delay: HANDOFF_DELAY; interval: HANDOFF_INTERVAL.
    """

    client: redis.Redis
    node: str
    delay: float = HANDOFF_DELAY
    interval: float = HANDOFF_INTERVAL
    # (list, message) -> when this worker first saw it there (monotonic).
    _seen: dict[tuple[str, bytes], float] = field(default_factory=dict)
    handed: int = 0

    def sweep(self) -> int:
        """One look; returns how many messages were handed to their campaign's queue."""
        registry = {text(k): json.loads(text(v)) for k, v in self.client.hgetall(HOST_QUEUES).items()}
        if not registry:
            return 0
        live = {text(n) for n in cast("list[bytes]", self.client.zrangebyscore(WORKERS_INDEX, time.time(), "+inf"))}
        own = {queue: target for queue, (target, node) in registry.items() if node == self.node}
        dead = {queue: target for queue, (target, node) in registry.items() if node not in live and node != self.node}
        moved = self._hand_over(own, wait=self.delay) + self._hand_over(dead, wait=0.0)
        for queue in dead:
            lists = queue_lists(queue)
            _FORGET_EMPTY_QUEUE(self.client, (HOST_QUEUES, *lists), (queue,))
        self.handed += moved
        return moved

    def _hand_over(self, queues: dict[str, str], *, wait: float) -> int:
        # (host queue's list, campaign queue's list of the same priority, campaign queue)
        pairs = [
            (source, target, campaign_queue)
            for queue, campaign_queue in queues.items()
            for source, target in zip(queue_lists(queue), queue_lists(campaign_queue), strict=True)
        ]
        if not pairs:
            return 0
        lengths = pipelined(self.client, *(("llen", source) for source, _, _ in pairs))
        now = time.monotonic()
        seen: dict[tuple[str, bytes], float] = {}
        moved = 0
        for (source, target, campaign_queue), length in zip(pairs, lengths, strict=True):
            if not int(length):
                continue
            # Our client returns bytes (no decode_responses), which redis-py's types cannot know.
            for raw in cast("list[bytes]", self.client.lrange(source, 0, -1)):
                first = self._seen.get((source, raw), now)
                if now - first < wait:
                    seen[(source, raw)] = first
                    continue
                addressed = readdressed(raw, queue=campaign_queue)
                moved += int(_HAND_OFF(self.client, (source, target), (raw, addressed)))
        # What was not seen this time was taken or moved: forgotten.
        self._seen = {k: v for k, v in self._seen.items() if k[0] not in {s for s, _, _ in pairs}} | seen
        if moved:
            log.info("handed %d next turns from host queues to their campaigns' queues", moved)
        return moved
