"""Claim prompt keys and publish their batches so that a killed enqueue loses nothing: keys are
claimed and stashed in the campaign's outbox (eagle_synth/state/outbox.py) in one Lua script,
and the outbox entry goes only once every batch of it is published; a later run publishes what
a killed one left there first."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from celery import Celery

from eagle_synth.payload import PromptItem, TaskPayload, batch_id
from eagle_synth.processes import holder_alive, holder_id
from eagle_synth.queue import campaign_queue, queue_lists, send_payload
from eagle_synth.reasons import RECORD_DAMAGED
from eagle_synth.sampling import ServerSampling
from eagle_synth.state.campaign import Campaign
from eagle_synth.state.outbox import chunk_field
from eagle_synth.state.redis_client import pipelined
from eagle_synth.state.replicas import ReplicaWait

log = logging.getLogger("eagle_synth.producer")

# Seconds between backlog checks while waiting for the queue to drain.
BACKLOG_POLL = 2.0
# Share of Redis's `maxmemory` (when set) the backlog may hold at most, whatever the flag says:
# the rest is the campaign's key sets and Celery's own bookkeeping.
MAXMEMORY_SHARE = 0.5
# Elements MEMORY USAGE samples per key: an estimate in constant time, whatever the queue length.
MEMORY_SAMPLES = 5


@dataclass(kw_only=True, eq=False)
class Publisher:
    """Turns prompt items into queued batches (of `batch_size`, with the servers' `sampling`)
    for one campaign, waiting while more than `max_backlog` prompts are pending or the backlog
    holds more than `max_backlog_bytes` in Redis (0 = no cap; see _byte_cap). `on_wait` is told
    the pending count (and `held_bytes`, `max_bytes`); newly claimed keys add to the campaign
    counter `count_new_as`."""

    campaign: Campaign
    app: Celery
    queue: str
    sampling: ServerSampling
    batch_size: int
    max_backlog: int = 0
    max_backlog_bytes: int = 0
    on_wait: Callable[..., None] | None = None
    count_new_as: str | None = None
    tasks: int = field(default=0, init=False)
    replayed: int = field(default=0, init=False)  # prompts re-enqueued because `repair` could not read them back
    _damaged_waiting: bool | None = field(default=None, init=False)
    _chunk_serial: int = field(default=0, init=False)
    _run_id: str = field(default_factory=lambda: holder_id(f"{time.time_ns():x}"), init=False)
    _maxmemory: int | None = field(default=None, init=False)

    def close(self) -> None:
        self.campaign.outbox.end_run(self._run_id)
        # What this run claimed and published is on a replica before `enqueue` says it is done,
        # so a failover right after cannot forget it (eagle_synth/state/replicas.py).
        ReplicaWait(self.campaign.client).confirm()

    def _next_field(self, stash: list[PromptItem] | None = None) -> str:
        """A new outbox field of this run (holding `stash`), after a heartbeat so a concurrent
        enqueue does not republish it."""
        self.campaign.outbox.heartbeat(self._run_id)
        self._chunk_serial += 1
        field = chunk_field(self._run_id, self._chunk_serial)
        if stash is not None:
            self.campaign.outbox.stash(field, stash)
        return field

    def claim(self, items: list[PromptItem]) -> list[bool]:
        """Claim and publish a chunk of items; returns, per item, whether it was new."""
        if not items:
            return []
        field = self._next_field()
        new = self.campaign.outbox.claim(field, items, count_as=self.count_new_as)
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
        reasons = self.campaign.failure_reasons([item.key for item in duplicates])
        damaged = [item for item, reason in zip(duplicates, reasons) if reason == RECORD_DAMAGED]
        if damaged:
            log.warning("re-enqueueing %d prompts whose records `repair` found damaged", len(damaged))
            self.replayed += self.retry(damaged)

    def return_done(self, items: list[PromptItem]) -> int:
        """Queue again done prompts whose records were damaged (`repair`); returns how many were
        done. Outbox, then out of `done`, then published: a kill at any step loses none."""
        if not items:
            return 0
        field = self._next_field(stash=items)
        removed = self.campaign.undo_done([item.key for item in items])
        self._publish_all(items, outbox_field=field)
        return removed

    def retry(self, items: list[PromptItem]) -> int:
        """Queue failed prompts again, those still failed when taken, each key once; returns how many.
        Outbox first: a kill between the two leaves the prompts failed *and* queued, which is safe
        (the worker marks them done and drops the failure); the other order could lose them."""
        if not items:
            return 0
        field = self._next_field(stash=items)
        taken = self.campaign.take_failures([item.key for item in items])
        once = []
        for item in items:
            if item.key in taken:  # each taken key once, however often the scan listed it
                taken.remove(item.key)
                once.append(item)
        self._publish_all(once, outbox_field=field)
        return len(once)

    def _publish_all(self, items: list[PromptItem], *, outbox_field: str, already_sent: int = 0) -> None:
        """Publish batch by batch, noting progress in the outbox so a kill resends one batch at most."""
        outbox = self.campaign.outbox
        for start in range(already_sent, len(items), self.batch_size):
            self._wait_for_backlog(unpublished=len(items) - start)
            batch = items[start : start + self.batch_size]
            payload = TaskPayload(
                campaign=self.campaign.name, batch=batch_id([i.key for i in batch]), sampling=self.sampling, items=batch
            )
            send_payload(self.app, self.queue, payload.encode())
            self.tasks += 1
            outbox.note_sent(outbox_field, min(start + self.batch_size, len(items)), run_id=self._run_id)
        outbox.clear(outbox_field)

    def _wait_for_backlog(self, *, unpublished: int) -> None:
        """Wait while the backlog is over a cap (`unpublished` claimed prompts are not pending yet)."""
        if not self.max_backlog and not self.max_backlog_bytes:
            return
        byte_cap = self._byte_cap() if self.max_backlog_bytes else 0
        while True:
            pending = self.campaign.progress().pending - unpublished if self.max_backlog else 0
            if self.max_backlog and pending > self.max_backlog:
                if self.on_wait:
                    self.on_wait(pending)
            else:
                held = self.backlog_bytes() if byte_cap else 0
                if held <= byte_cap:
                    return
                if self.on_wait:
                    self.on_wait(pending, held_bytes=held, max_bytes=byte_cap)
            self.campaign.outbox.heartbeat(self._run_id)
            time.sleep(BACKLOG_POLL)

    def backlog_bytes(self) -> int:
        """Bytes the campaign's queue (every priority list), failures and outbox hold in Redis
        (sampled estimates)."""
        keys = self.campaign.keys
        queued = queue_lists(campaign_queue(self.queue, self.campaign.name))
        reads = (("memory_usage", key, MEMORY_SAMPLES) for key in (*queued, keys.failed, keys.outbox))
        return sum(int(size or 0) for size in pipelined(self.campaign.client, *reads))

    def _byte_cap(self) -> int:
        """max_backlog_bytes, lowered to MAXMEMORY_SHARE of Redis's maxmemory when that is set
        (a Redis that refuses CONFIG GET, as some managed ones do, keeps the flag's cap)."""
        if self._maxmemory is None:
            try:
                self._maxmemory = int(self.campaign.client.config_get("maxmemory").get("maxmemory") or 0)
            except redis.ResponseError:
                self._maxmemory = 0
        share = int(self._maxmemory * MAXMEMORY_SHARE)
        return min(self.max_backlog_bytes, share) if share else self.max_backlog_bytes

    def recover(self) -> int:
        outbox = self.campaign.outbox
        total = 0
        for entry in outbox.entries():
            if holder_alive(outbox.client, entry.run_id, outbox.keys.producer(entry.run_id)):
                continue  # a live enqueue is publishing it right now
            items = entry.items()
            log.warning("republishing %d prompts a killed enqueue had claimed", len(items) - entry.sent)
            self._publish_all(items, outbox_field=entry.field, already_sent=entry.sent)
            total += len(items) - entry.sent
        return total
