"""The reconciler: the campaign, not the broker, decides what still has to be generated.

Every published batch has a copy in its campaign (eagle_synth/state/batch_store.py) until its
keys end. A batch is lost when its copy is older than RECONCILE_AFTER, it is in no queue, no
`unacked` entry, under no live lease, and some keys are neither done, failed, nor claimed by a
live batch: the broker dropped it (Redis died between kombu's BRPOP and its `unacked` write).
It is published again (the worker skips what is done; claims keep copies from both generating).

The campaigns looked at are those stored batches name (their keys, by SCAN) as well as the
`campaigns` set, which an evicting Redis can drop (eagle_synth.state.campaign.campaigns_with_batches).

Cost: each round (one worker per RECONCILE_INTERVAL, by a Redis lock) compares O(campaigns)
counts: stored batches against queued plus unacked messages. Only when the stored ones are
more, two rounds running or after Redis restarted (its run id changed), does it read the queue
and `unacked` and look at each stored batch.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

import redis

from eagle_synth.queue import campaign_queues, queue_lists, queued_payloads, send_payload
from eagle_synth.settings import TIMINGS, broker_settings
from eagle_synth.state.batch_store import StoredBatch, forget, stored_batches, stored_count
from eagle_synth.state.campaign import Campaign, campaigns_with_batches
from eagle_synth.state.campaign_control import age_waiting
from eagle_synth.state.fence import live_claims
from eagle_synth.state.keys import RECONCILER_LOCK, RECONCILER_STATE
from eagle_synth.state.queue_upgrade import adopt_base_queue
from eagle_synth.state.redis_client import connect, pipelined, text
from eagle_synth.state.stranded import UNACKED_KEY, held_batches
from workers.reaper import SweepStep, won_round

log = logging.getLogger("eagle_synth.reconciler")

# Seconds between rounds (cluster-wide: the lock lives this long, so one worker looks per round).
RECONCILE_INTERVAL = TIMINGS.reconcile_interval
# Seconds a stored batch must be old before it can count as lost: longer than a publish takes
# (the copy is stored just before the message is sent) and than kombu's BRPOP-to-unacked step.
RECONCILE_AFTER = TIMINGS.reconcile_after
# Queue messages read per LRANGE step.
QUEUE_CHUNK = 200


@dataclass
class Reconciler:
    """Finds lost batches and publishes them again.

    Parameters:
        client, node, queue, interval: as the Reaper's (`queue`: the base queue name).
        send: publishes one encoded payload (eagle_synth.queue.send_payload bound to the app).
    """

    client: redis.Redis
    _: KW_ONLY
    node: str
    queue: str
    send: Callable[[dict], None]
    interval: float = RECONCILE_INTERVAL

    # the cheap look -----------------------------------------------------------------
    def _queues(self, names: list[str]) -> list[str]:
        """The queues of these campaigns (each its own and its host queues: eagle_synth/queue.py)."""
        return [queue for name in names for queue in campaign_queues(self.client, self.queue, name)]

    def needs_full_sweep(self) -> bool:
        """True when the stored batches outnumber what the broker holds (queued + unacked) in two
        rounds running, or in one right after Redis restarted."""
        names = campaigns_with_batches(self.client)
        stored = sum(stored_count(self.client, name) for name in names)
        lists = [name for queue in self._queues(names) for name in queue_lists(queue)]
        lengths = pipelined(self.client, *(("llen", name) for name in lists), ("hlen", UNACKED_KEY))
        held = sum(int(c) for c in lengths)
        run_id = str(self.client.info("server").get("run_id", ""))
        state = {text(k): text(v) for k, v in self.client.hgetall(RECONCILER_STATE).items()}
        restarted = state.get("run_id") not in (None, run_id)
        short = stored > held
        again = short and state.get("short") == "1"
        self.client.hset(RECONCILER_STATE, mapping={"run_id": run_id, "short": "1" if short else "0"})
        return short and (again or restarted)

    # the full look ------------------------------------------------------------------
    def _queued_batches(self) -> set[tuple[str, str]]:
        return {
            (str(payload["campaign"]), str(payload["batch"]))
            for queue in self._queues(campaigns_with_batches(self.client))
            for payload in queued_payloads(self.client, queue, step=QUEUE_CHUNK)
        }

    def sweep(self) -> int:
        """One round if this worker wins the round's lock; returns how many batches it republished.
        The round also raises campaigns that wait too long behind higher priorities (aging), and
        first moves batches an earlier version left in the single base queue to their campaigns'."""
        if not won_round(self.client, RECONCILER_LOCK, self.node, self.interval):
            return 0
        adopt_base_queue(self.client, self.queue)
        for name in age_waiting(self.client, base_queue=self.queue):
            log.info("campaign %s waited without progress: its queued batches rise a priority level", name)
        if not self.needs_full_sweep():
            return 0
        # The queue before `unacked`: a message moves from the first to the second, never back
        # unseen (a restore pushes it to the queue, where the next round sees it).
        live = self._queued_batches()
        live |= {(h.campaign, h.batch) for h in held_batches(self.client, fetched_before=time.time() + 3600)}
        republished = 0
        cutoff = time.time() - RECONCILE_AFTER
        for name in campaigns_with_batches(self.client):
            campaign = Campaign(self.client, name)
            if self.client.exists(campaign.keys.ended):
                # Closed: its done set is folded to disk, so every key would look open here.
                continue
            stale = [s for s in stored_batches(self.client, name) if s.published_at <= cutoff]
            republished += sum(self._republish_if_lost(campaign, s) for s in stale if (name, s.batch) not in live)
        return republished

    def _republish_if_lost(self, campaign: Campaign, stored: StoredBatch) -> bool:
        if self.client.exists(campaign.keys.lease(stored.batch)):
            return False  # a live batch thread holds it
        finished = campaign.finished_keys(stored.keys)
        open_keys = [k for k in stored.keys if k not in finished]
        if not open_keys:
            forget(self.client, campaign.name, stored.batch)
            return False
        if len(live_claims(self.client, campaign.keys.claims, open_keys)) == len(open_keys):
            return False  # other live batches hold every open key
        log.warning(
            "batch %s of campaign %s (%d open prompts) is in no queue, not held and not leased: "
            "the broker lost it; publishing it again",
            stored.batch,
            campaign.name,
            len(open_keys),
        )
        self.send(stored.payload)
        return True


class ReconcilerStep(SweepStep):
    label = "reconciler"

    def sweeper(self, c: Any) -> Reconciler:
        settings = broker_settings()
        send = functools.partial(send_payload, c.app, settings.queue)
        return Reconciler(connect(settings), node=c.hostname, queue=settings.queue, send=send)
