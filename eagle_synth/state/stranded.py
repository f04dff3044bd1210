"""Batches stranded by a dead worker: fetched from the queue, held by no one alive.

kombu keeps fetched, unacked messages in `unacked` (tag -> JSON [message, exchange, routing key])
and `unacked_index` (tag by fetch time) until the 6 h visibility timeout. A running batch renews
its lease, which lapses LEASE_TTL after its holder dies: so a message fetched over REAP_AFTER s
ago with no lease is stranded, and is put back as kombu would (same queue and priority list,
marked redelivered), in one Lua script so never twice. workers/reaper.py runs this.

`status` counts a batch as stranded sooner, as soon as its holder's death is knowable
(`stranded_prompts`): its lease names a process of this host and boot that is gone, or a host where no
worker's heartbeat lives; and a fetched message without a lease while no worker is alive at all.
"""

from __future__ import annotations

import json
import time
from bisect import bisect
from contextlib import suppress
from dataclasses import dataclass
from typing import cast

import redis
from kombu.transport.redis import Channel

from eagle_synth.processes import holder_gone_here, holder_host
from eagle_synth.queue import PRIORITY_SEPARATOR, PRIORITY_STEPS, payload_of_entry
from eagle_synth.settings import TIMINGS
from eagle_synth.state.keys import CampaignKeys
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.node_state import all_nodes, live_hosts
from eagle_synth.state.redis_client import pipelined, text

# Seconds since fetch after which a message without a live batch lease is stranded.
REAP_AFTER = TIMINGS.reap_after
# kombu's own key names (its defaults); its priority lists are configured in eagle_synth/queue.py.
UNACKED_KEY = Channel.unacked_key
UNACKED_INDEX_KEY = Channel.unacked_index_key
BINDING_KEY_FORMAT = Channel.keyprefix_queue
# kombu clamps message priorities to this range before picking a priority list.
MIN_PRIORITY = 0
MAX_PRIORITY = 9
# Unacked entries fetched per HMGET.
FETCH_CHUNK = 200
# Decoded (campaign, batch, keys) cached per delivery tag (for `status --watch`).
DECODED_CACHE_SIZE = 50_000

_RESTORE = LuaScript("restore")

_decoded: dict[str, tuple[str, str, tuple[str, ...]] | None] = {}


@dataclass(frozen=True, slots=True)
class HeldBatch:
    """One of our batch messages in `unacked`, with its raw `entry` (None when only counting)."""

    tag: str
    fetched_at: float
    campaign: str
    batch: str
    keys: tuple[str, ...]
    entry: bytes | None = None

    @property
    def lease_key(self) -> str:
        return CampaignKeys(self.campaign).lease(self.batch)


def _decode_entry(entry: bytes) -> tuple[str, str, tuple[str, ...]] | None:
    if (payload := payload_of_entry(entry)) is None:
        return None
    return str(payload["campaign"]), str(payload["batch"]), tuple(payload.get("keys") or ())


def held_batches(client: redis.Redis, *, fetched_before: float, with_entries: bool = False) -> list[HeldBatch]:
    """Our batch messages (not other apps') fetched before `fetched_before` and not acked yet;
    with_entries keeps the raw entries (restore needs them), else decodings are cached by tag."""
    # (tag, score) pairs: our client returns bytes, which redis-py's types cannot know.
    index = cast(
        "list[tuple[bytes, float]]",
        client.zrange(UNACKED_INDEX_KEY, "-inf", fetched_before, byscore=True, withscores=True),
    )
    held: list[HeldBatch] = []
    wanted = [tag for tag, _ in index if with_entries or tag.decode() not in _decoded]
    entries: dict[bytes, bytes | None] = {}
    for start in range(0, len(wanted), FETCH_CHUNK):
        chunk = wanted[start : start + FETCH_CHUNK]
        entries.update(zip(chunk, cast("list[bytes | None]", client.hmget(UNACKED_KEY, chunk))))
    if len(_decoded) > DECODED_CACHE_SIZE:
        _decoded.clear()
    for tag, score in index:
        name = tag.decode()
        entry = entries.get(tag)  # fetched when not cached (or with_entries)
        if entry is not None:
            _decoded[name] = _decode_entry(entry)
        elif with_entries or name not in _decoded:
            continue  # acknowledged since the index was read
        if (decoded := _decoded[name]) is not None:
            held.append(HeldBatch(name, float(score), *decoded, entry if with_entries else None))
    return held


def stranded_batches(
    client: redis.Redis, *, reap_after: float = REAP_AFTER, with_entries: bool = False
) -> list[HeldBatch]:
    """Held batches fetched more than reap_after seconds ago whose batch lease is gone."""
    held = held_batches(client, fetched_before=time.time() - reap_after, with_entries=with_entries)
    live = pipelined(client, *(("exists", batch.lease_key) for batch in held))
    return [batch for batch, alive in zip(held, live) if not alive]


def held_by_no_one_alive(
    client: redis.Redis, *, reap_after: float = REAP_AFTER, hosts: set[str] | None = None
) -> list[HeldBatch]:
    """Held batches whose holder is known dead: the reaper's rule (stranded_batches), or a lease
    whose holder is a gone process of this host and boot or on a host without a live worker (`hosts`:
    live_hosts, read here when not given), or no lease while no worker is alive anywhere."""
    now = time.time()
    held = held_batches(client, fetched_before=now)
    holders = pipelined(client, *(("get", batch.lease_key) for batch in held))
    alive_hosts = live_hosts(all_nodes(client)) if hosts is None else hosts
    stranded = []
    for batch, raw_holder in zip(held, holders):
        if raw_holder is None:
            dead = batch.fetched_at < now - reap_after or not alive_hosts
        else:
            holder = text(raw_holder)
            dead = holder_gone_here(holder) or holder_host(holder) not in alive_hosts
        if dead:
            stranded.append(batch)
    return stranded


def stranded_prompts(
    client: redis.Redis, *, reap_after: float = REAP_AFTER, hosts: set[str] | None = None
) -> dict[str, int]:
    """Per campaign, prompts of batches held by no one alive (held_by_no_one_alive) that are
    neither done nor failed."""
    from eagle_synth.state.campaign import Campaign

    keys_by_campaign: dict[str, set[str]] = {}
    for batch in held_by_no_one_alive(client, reap_after=reap_after, hosts=hosts):
        keys_by_campaign.setdefault(batch.campaign, set()).update(batch.keys)
    counts = {}
    for name, keys in keys_by_campaign.items():
        try:
            counts[name] = len(keys) - len(Campaign(client, name).finished_keys(sorted(keys)))
        except ValueError:
            continue  # a name no campaign can have: not ours to count
    return counts


def _destination(
    client: redis.Redis, message: dict, exchange: str, routing_key: str, *, queue_name: str | None
) -> str | None:
    """The list kombu would push this message back to (its _lookup and _q_for_pri), or None."""
    queue = None if exchange else routing_key or None
    if exchange:
        bindings = (
            text(member).split(PRIORITY_SEPARATOR, 2) for member in client.smembers(BINDING_KEY_FORMAT % exchange)
        )
        queue = next((bound for key, _, bound in bindings if key == routing_key), None)
        if queue is None and routing_key == queue_name:
            queue = queue_name
    if queue is None:
        return None
    try:
        priority = max(min(int(message["properties"]["priority"]), MAX_PRIORITY), MIN_PRIORITY)
    except (KeyError, TypeError, ValueError):
        priority = 0
    step = PRIORITY_STEPS[bisect(PRIORITY_STEPS, priority) - 1]
    return f"{queue}{PRIORITY_SEPARATOR}{step}" if step else queue


def restore(client: redis.Redis, held: HeldBatch, *, queue_name: str | None = None) -> bool:
    """Put a stranded message back on its queue; False if it was acked, restored or leased meanwhile
    (or cannot be routed, which leaves it to kombu's visibility timeout)."""
    if held.entry is None:
        raise ValueError("restore needs the raw entry: use stranded_batches(with_entries=True)")
    message, exchange, routing_key = json.loads(held.entry)
    destination = _destination(client, message, exchange, routing_key, queue_name=queue_name)
    if destination is None:
        return False
    # As kombu's _do_restore_message: the worker then looks for files an earlier attempt left.
    with suppress(KeyError, TypeError):
        message["headers"]["redelivered"] = True
        message["properties"]["delivery_info"]["redelivered"] = True
    names = (UNACKED_KEY, UNACKED_INDEX_KEY, held.lease_key, destination)
    restored = _RESTORE(client, names, (held.tag, held.entry, json.dumps(message)))
    if restored:
        _decoded.pop(held.tag, None)
    return bool(restored)
