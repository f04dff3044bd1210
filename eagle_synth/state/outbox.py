"""A campaign's producer outbox: prompt chunks claimed (one Lua script with the claim) and not
yet all published, and the liveness keys of the enqueue runs owning them; a dead run's chunks are
published by another (producer/publisher.py). A chunk is the hash fields `<run id>:<serial>`
(items, msgpack), `...:new` (JSON indices of the new items) and `...:sent` (items published).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast

import msgspec
import redis

from eagle_synth.payload import PromptItem, pack_item, unpack_item
from eagle_synth.state.keys import CampaignKeys
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.redis_client import pipelined

# Seconds a producer's liveness key lasts; another run recovers its outbox only after that.
PRODUCER_TTL = 60
# Suffixes of a chunk's companion fields: indices of new items, items published so far.
_NEW = ":new"
_SENT = ":sent"

_CLAIM = LuaScript("outbox_claim")


def chunk_field(run_id: str, serial: int) -> str:
    return f"{run_id}:{serial}"  # run ids hold no ':'


def _pack_items(items: list[PromptItem]) -> bytes:
    return msgspec.msgpack.encode([pack_item(item) for item in items])


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One chunk: its `field`, claiming run, items `sent`, stored items, `new` indices (None: all)."""

    field: str
    run_id: str
    sent: int
    blob: bytes
    new: frozenset[int] | None

    def items(self) -> list[PromptItem]:
        """The items to publish (the newly claimed ones), in claim order."""
        items = [unpack_item(packed) for packed in msgspec.msgpack.decode(self.blob)]
        return items if self.new is None else [item for i, item in enumerate(items) if i in self.new]


class Outbox:
    """One campaign's producer outbox and its enqueue runs' liveness keys."""

    def __init__(self, client: redis.Redis, keys: CampaignKeys) -> None:
        self.client = client
        self.keys = keys

    def claim(self, field: str, items: list[PromptItem], *, count_as: str | None = None) -> list[bool]:
        """In one step, enqueue the items' keys seen nowhere yet and, if any, store the chunk under
        `field`, adding their number to counter `count_as`; returns per item whether it was new."""
        k = self.keys
        indices = _CLAIM(
            self.client,
            keys=[k.enqueued, k.outbox, k.counters, k.done],
            args=[field, _pack_items(items), count_as or "", *[item.key for item in items]],
        )
        new = {int(index) for index in indices}
        return [i in new for i in range(len(items))]

    def stash(self, field: str, items: list[PromptItem]) -> None:
        """Store a chunk of items already claimed (queued again)."""
        self.client.hset(self.keys.outbox, field, _pack_items(items))

    def note_sent(self, field: str, sent: int, *, run_id: str) -> None:
        """The chunk's first `sent` items are published and its run is alive (one round trip)."""
        alive = ("set", self.keys.producer(run_id), 1, PRODUCER_TTL)  # set(name, value, ex): expires in PRODUCER_TTL s
        pipelined(self.client, alive, ("hset", self.keys.outbox, field + _SENT, sent))

    def clear(self, field: str) -> None:
        """Every item of the chunk is published: forget it."""
        self.client.hdel(self.keys.outbox, field, field + _NEW, field + _SENT)

    def entries(self) -> list[OutboxEntry]:
        """Every chunk in the outbox, whatever run it belongs to."""
        # Our client returns bytes; redis-py types replies as bytes | str.
        fields = cast("dict[bytes, bytes]", self.client.hgetall(self.keys.outbox))
        entries = []
        for raw, blob in fields.items():
            name = raw.decode()
            if not name.endswith((_NEW, _SENT)):
                new = fields.get((name + _NEW).encode())
                sent = int(fields.get((name + _SENT).encode(), 0))
                new_set = None if new is None else frozenset(json.loads(new))
                entries.append(OutboxEntry(name, name.split(":", 1)[0], sent, blob, new_set))
        return entries

    def heartbeat(self, run_id: str) -> None:
        """Say this run is alive, so a concurrent enqueue does not republish its chunks."""
        self.client.set(self.keys.producer(run_id), 1, ex=PRODUCER_TTL)

    def end_run(self, run_id: str) -> None:
        """The run ended normally: its chunks are cleared and its liveness key can go."""
        self.client.delete(self.keys.producer(run_id))
