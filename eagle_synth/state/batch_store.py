"""The campaign's copy of every published, unfinished batch, so a lost message is recoverable.

kombu's BRPOP and its `unacked` record are two steps: a death between them leaves the message
only in memory. So every publish (queue.send_payload) stores the payload here first and the
batch's end deletes it; what stays too long with no queue entry, no `unacked` and no lease is
published again by workers/reconciler.py. `enqueue --max-backlog` bounds both copies.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
import redis

from eagle_synth.state.keys import CampaignKeys
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.redis_client import text

# Entries read per HSCAN step.
SCAN_COUNT = 200

_FORGET_IF_FINISHED = LuaScript("forget_if_finished")


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One stored batch: its id, when it was last published (unix time), its raw payload."""

    batch: str
    published_at: float
    payload: dict

    @property
    def keys(self) -> list[str]:
        return [str(k) for k in self.payload.get("keys") or ()]


def remember(client: redis.Redis, payload: dict) -> None:
    """Store (or refresh) a batch's payload before it is published."""
    blob = msgpack.packb({"at": time.time(), "p": payload}, use_bin_type=True)
    client.hset(CampaignKeys(str(payload["campaign"])).batches, str(payload["batch"]), blob)


def forget_if_finished(client: redis.Redis, campaign: str, batch: str, keys: list[str]) -> bool:
    """Delete the batch's entry if every key of it is done or failed."""
    k = CampaignKeys(campaign)
    return bool(_FORGET_IF_FINISHED(client, (k.batches, k.done, k.failed), (batch, *keys)))


def stored_count(client: redis.Redis, campaign: str) -> int:
    return int(client.hlen(CampaignKeys(campaign).batches))


def stored_batches(client: redis.Redis, campaign: str) -> Iterator[StoredBatch]:
    """Every stored batch of a campaign, read in HSCAN steps (Redis is never blocked for long)."""
    for batch, blob in client.hscan_iter(CampaignKeys(campaign).batches, count=SCAN_COUNT):
        try:
            data = msgpack.unpackb(blob, raw=False)
            yield StoredBatch(batch=text(batch), published_at=float(data["at"]), payload=dict(data["p"]))
        except (ValueError, KeyError, TypeError, msgpack.UnpackException):
            continue  # not written by us: left alone


def forget(client: redis.Redis, campaign: str, batch: str) -> None:
    client.hdel(CampaignKeys(campaign).batches, batch)
