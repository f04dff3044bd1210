"""Claim prompt keys and publish their batches, so that a killed enqueue loses nothing.

Claiming keys and recording what was claimed (the outbox) happen in one Lua script; the
outbox entry is deleted only after every batch made from it is published. A run that finds
outbox entries (its predecessor was killed in between) publishes them first.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import cast

import msgpack
from celery import Celery

from eagle_synth.campaign import Campaign
from eagle_synth.payload import PromptItem, TaskPayload, batch_id, pack_item, unpack_item
from eagle_synth.processes import holder_dead, holder_id
from eagle_synth.queue import send_payload
from eagle_synth.tools.repair import RECORD_DAMAGED

log = logging.getLogger("eagle_synth.producer")

# Seconds between backlog checks while waiting for the queue to drain.
BACKLOG_POLL = 2.0
# Seconds a producer's liveness key lasts; another run recovers its outbox only after that.
PRODUCER_TTL = 60

# KEYS: enqueued set, outbox hash, counters hash. ARGV: outbox field, chunk blob, counter
# name ('' for none), then prompt keys. Returns the 0-based indices of keys that were new;
# records them with the chunk, and adds their number to the counter (e.g. conversations
# started: counted in the same step as the claim, so a killed run counts each exactly once).
_CLAIM_SCRIPT = """
local new = {}
for i = 4, #ARGV do
  if redis.call('SADD', KEYS[1], ARGV[i]) == 1 then new[#new + 1] = i - 4 end
end
if #new > 0 then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[1] .. ':new', cjson.encode(new))
  if ARGV[3] ~= '' then redis.call('HINCRBY', KEYS[3], ARGV[3], #new) end
end
return new
"""


# KEYS: done set, counters hash. ARGV: prompt keys. Returns how many were done.
# Takes keys whose records were lost back out of `done`, keeping the records counter true.
_UNMARK_DONE = """
local removed = 0
for i = 1, #ARGV do removed = removed + redis.call('SREM', KEYS[1], ARGV[i]) end
if removed > 0 then
  redis.call('HINCRBY', KEYS[2], 'records', -removed)
  redis.call('HINCRBY', KEYS[2], 'records-damaged', removed)
end
return removed
"""


def _pack_items(items: list[PromptItem]) -> bytes:
    return msgpack.packb([pack_item(item) for item in items], use_bin_type=True)


def _unpack_items(blob: bytes) -> list[PromptItem]:
    return [unpack_item(packed) for packed in msgpack.unpackb(blob, raw=False)]


class Publisher:
    """Turns prompt items into queued batches for one campaign.

    Parameters:
        campaign: the campaign's state.
        app: the Celery app to publish with.
        queue: queue name.
        sampling: SGLang sampling_params for every batch.
        batch_size: prompts per task.
        max_backlog: wait while more prompts than this are pending (0 = never wait).
        on_wait: called with the pending count while waiting (for the progress display).
        count_new_as: a campaign counter that newly claimed keys add to (e.g. "conversations").
    """

    def __init__(
        self,
        *,
        campaign: Campaign,
        app: Celery,
        queue: str,
        sampling: dict,
        batch_size: int,
        max_backlog: int = 0,
        on_wait: Callable[[int], None] | None = None,
        count_new_as: str | None = None,
    ) -> None:
        self.campaign = campaign
        self.app = app
        self.queue = queue
        self.sampling = sampling
        self.batch_size = batch_size
        self.max_backlog = max_backlog
        self.on_wait = on_wait
        self.count_new_as = count_new_as or ""
        self.tasks = 0
        self.replayed = 0  # prompts re-enqueued because `repair` could not read them back
        self._damaged_waiting: bool | None = None
        self._claim = campaign.client.register_script(_CLAIM_SCRIPT)
        self._chunk_serial = 0
        self._run_id = holder_id(f"{time.time_ns():x}")
        self._buffer: list[PromptItem] = []

    def heartbeat(self) -> None:
        """Say this run is alive, so a concurrent enqueue does not republish its outbox."""
        self.campaign.client.set(self.campaign.keys.producer(self._run_id), 1, ex=PRODUCER_TTL)

    def close(self) -> None:
        """The run ended normally: its outbox is empty and its liveness key can go."""
        self.campaign.client.delete(self.campaign.keys.producer(self._run_id))

    def claim(self, items: list[PromptItem]) -> list[bool]:
        """Claim a chunk of items; returns, per item, whether it was new. New items are
        buffered and published in batches of batch_size."""
        if not items:
            return []
        self.heartbeat()
        self._chunk_serial += 1
        field = f"{self._run_id}:{self._chunk_serial}"
        keys = self.campaign.keys
        new_indices = self._claim(
            keys=[keys.enqueued, keys.outbox, keys.counters],
            args=[field, _pack_items(items), self.count_new_as, *[item.key for item in items]],
        )
        new = [False] * len(items)
        for index in new_indices:
            new[int(index)] = True
        fresh = [item for item, is_new in zip(items, new) if is_new]
        if fresh:
            self._publish_all(fresh, outbox_field=field)
        self._replay_damaged([item for item, is_new in zip(items, new) if not is_new])
        return new

    def _replay_damaged(self, duplicates: list[PromptItem]) -> None:
        """Re-enqueue duplicates that `repair` recorded as `record-damaged`: their record file
        was unreadable and their prompt unknown until this rerun templated it again."""
        if not duplicates:
            return
        if self._damaged_waiting is None:
            self._damaged_waiting = self.campaign.failure_counts().get(RECORD_DAMAGED, 0) > 0
        if not self._damaged_waiting:
            return
        raw = self.campaign.client.hmget(self.campaign.keys.failed, [item.key for item in duplicates])
        damaged = [
            item
            for item, failure in zip(duplicates, raw)
            if failure is not None and json.loads(failure).get("reason") == RECORD_DAMAGED
        ]
        if damaged:
            log.warning("re-enqueueing %d prompts whose records `repair` found damaged", len(damaged))
            self.republish(damaged)
            self.replayed += len(damaged)

    def return_done(self, items: list[PromptItem]) -> int:
        """Queue again prompts marked done whose records were damaged (`eagle-synth repair`).

        Outbox first, then out of `done`, then published: a kill after the first step leaves
        them done (a rerun of repair finds them again); after the second, in the outbox, which
        the next repair or enqueue publishes. Returns how many were done.
        """
        if not items:
            return 0
        self.heartbeat()
        self._chunk_serial += 1
        field = f"{self._run_id}:{self._chunk_serial}"
        keys = self.campaign.keys
        self.campaign.client.hset(keys.outbox, field, _pack_items(items))
        removed = int(
            self.campaign.client.eval(_UNMARK_DONE, 2, keys.done, keys.counters, *[item.key for item in items])
        )
        self._publish_all(items, outbox_field=field)
        return removed

    def republish(self, items: list[PromptItem]) -> None:
        """Queue failed prompts again: they leave `failed` and enter the outbox atomically."""
        if not items:
            return
        self.heartbeat()
        self._chunk_serial += 1
        field = f"{self._run_id}:{self._chunk_serial}"
        keys = self.campaign.keys
        # Outbox first: a kill between the two leaves the prompts failed *and* queued, which is
        # safe (the worker marks them done and drops the failure); the other order could lose them.
        self.campaign.client.hset(keys.outbox, field, _pack_items(items))
        self.campaign.drop_failures([item.key for item in items])
        self._publish_all(items, outbox_field=field)

    def _publish_all(self, items: list[PromptItem], *, outbox_field: str, already_sent: int = 0) -> None:
        """Publish items batch by batch, noting progress in the outbox after each batch so a
        killed run republishes at most the one batch it was sending."""
        outbox = self.campaign.keys.outbox
        for start in range(already_sent, len(items), self.batch_size):
            self._wait_for_backlog(unpublished=len(items) - start)
            self._publish(items[start : start + self.batch_size])
            # Progress and liveness in one round trip: this runs once per published batch.
            pipe = self.campaign.client.pipeline(transaction=False)
            pipe.set(self.campaign.keys.producer(self._run_id), 1, ex=PRODUCER_TTL)
            pipe.hset(outbox, f"{outbox_field}:sent", min(start + self.batch_size, len(items)))
            pipe.execute()
        self.campaign.client.hdel(outbox, outbox_field, f"{outbox_field}:new", f"{outbox_field}:sent")

    def _publish(self, items: list[PromptItem]) -> None:
        payload = TaskPayload(
            campaign=self.campaign.name,
            batch=batch_id([i.key for i in items]),
            sampling=self.sampling,
            items=items,
        )
        send_payload(self.app, self.queue, payload.encode())
        self.tasks += 1

    def _wait_for_backlog(self, *, unpublished: int) -> None:
        """Wait while more than max_backlog prompts are queued or running (claimed prompts this
        run has not published yet are not in the queue, so they do not count)."""
        if not self.max_backlog:
            return
        while True:
            pending = self.campaign.progress().pending - unpublished
            if pending <= self.max_backlog:
                return
            if self.on_wait:
                self.on_wait(pending)
            self.heartbeat()
            time.sleep(BACKLOG_POLL)

    def recover(self) -> int:
        """Publish what a killed run claimed but did not publish; returns prompts published."""
        # Our client returns bytes; redis-py types replies as bytes | str.
        outbox = cast("dict[bytes, bytes]", self.campaign.client.hgetall(self.campaign.keys.outbox))
        total = 0
        for field, blob in outbox.items():
            name = field.decode()
            if name.endswith((":new", ":sent")):
                continue
            run_id = name.split(":", 1)[0]
            if self.campaign.client.exists(self.campaign.keys.producer(run_id)) and not holder_dead(run_id):
                continue  # a live enqueue is publishing it right now
            items = _unpack_items(blob)
            new_raw = outbox.get(f"{name}:new".encode())
            if new_raw is not None:
                indices = set(json.loads(new_raw))
                items = [item for i, item in enumerate(items) if i in indices]
            sent = int(outbox.get(f"{name}:sent".encode(), 0))
            log.warning("republishing %d prompts a killed enqueue had claimed", len(items) - sent)
            self._publish_all(items, outbox_field=name, already_sent=sent)
            total += len(items) - sent
        return total
