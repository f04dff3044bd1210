"""What an operator does to a running campaign on a shared fleet: change its priority, cancel it.

Priority: every campaign has a Celery queue of its own (eagle_synth/queue.py), and its priority
travels in each message; `set_priority` stores the new value (every later publish reads it)
and moves the messages already queued to the list of the new priority, one Lua step each, so a
message a worker takes meanwhile is never doubled.

Starvation: priorities are strict (a fetch takes the highest priority any consumed queue holds),
so a steady stream of urgent campaigns could hold a lower one back forever. `age_waiting`
raises a campaign's queued batches one level whenever it has batches queued and wrote no
record for PRIORITY_AGING seconds (its stored priority, which new batches get, stays): a
campaign waiting behind others climbs to the top within 9 such periods and is then served
beside them, round-robin. The reconciler runs it (one worker per round, cluster-wide).

Cancel (`cancel_campaign`): the campaign's marker is written first, so publishes (send_payload),
new batches and batches in flight see it and stop (workers/batch.py); then its queue and its
`unacked` entries leave the broker, and every other key of it is deleted. Records already on
disk stay where they are, readable. Batches in flight notice the marker at their next prompt
(within a second) and write nothing more; their fenced writes fail anyway, their lease being
gone. The keys are deleted again once no worker reports prompts of it in flight, so a write
that raced the first sweep does not outlive it: the marker is all that is left.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from eagle_synth.errors import CampaignCancelled
from eagle_synth.priorities import PRIORITIES, check_priority, message_priority
from eagle_synth.queue import PRIORITY_STEPS, campaign_queue, host_queues, queue_lists, readdressed
from eagle_synth.settings import TIMINGS
from eagle_synth.state.campaign import Campaign, campaign_names
from eagle_synth.state.keys import CAMPAIGNS, HOST_QUEUES, KEY_PREFIX, CampaignKeys
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.node_state import all_nodes
from eagle_synth.state.redis_client import pipelined, text
from eagle_synth.state.stranded import UNACKED_INDEX_KEY, UNACKED_KEY, held_batches

# Seconds a campaign with queued batches may go without writing a record before its queued
# batches rise a priority level (EAGLE_SYNTH_PRIORITY_AGING; 600: a 5 reaches the top in 40 min).
PRIORITY_AGING = TIMINGS.priority_aging
# Seconds `cancel` waits for workers to stop the campaign's prompts in flight before its last sweep.
CANCEL_SETTLE_TIMEOUT = 60.0
# Seconds between its looks at the workers' heartbeats meanwhile.
CANCEL_POLL_INTERVAL = 0.5
# Keys read per SCAN step while deleting a campaign's keys.
SCAN_COUNT = 500

_MOVE_MESSAGE = LuaScript("move_message")


def cancel_marker(client: redis.Redis, campaign: str) -> dict | None:
    """What `cancel` recorded (at, queued, held, done, failed), or None if it was not cancelled."""
    raw = client.get(CampaignKeys(campaign).cancelled)
    if raw is None:
        return None
    try:
        marker = json.loads(raw)
    except ValueError:
        return {}
    return marker if isinstance(marker, dict) else {}


def refuse_if_cancelled(client: redis.Redis, campaign: str) -> None:
    """Raise CampaignCancelled (what to do instead) when `campaign` was cancelled."""
    if (marker := cancel_marker(client, campaign)) is None:
        return
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(marker.get("at") or 0)))
    raise CampaignCancelled(
        f"campaign {campaign!r} was cancelled at {when}; its records stay in its folder. Nothing was "
        f"enqueued: use a new campaign name, or `eagle-synth cancel {campaign} --forget` to start it "
        "afresh under this name (its earlier records are then not skipped)"
    )


def set_priority(client: redis.Redis, campaign: str, priority: int, *, base_queue: str) -> int:
    """Store the campaign's priority and move its queued messages to that priority's list;
    returns how many moved."""
    check_priority(priority)
    client.set(CampaignKeys(campaign).priority, priority)
    return _move_queued(client, campaign_queue(base_queue, campaign), lambda _: priority)


def age_waiting(client: redis.Redis, *, base_queue: str, after: float = PRIORITY_AGING) -> list[str]:
    """Raise by one level the queued batches of every campaign that has some and wrote no record
    for `after` s (nor was raised within it); returns the campaigns raised."""
    now = time.time()
    raised = []
    for name in campaign_names(client):
        queue = campaign_queue(base_queue, name)
        keys = CampaignKeys(name)
        lengths = pipelined(client, *(("llen", name) for name in queue_lists(queue)))
        if not any(lengths[1:]):
            continue  # nothing queued below the top level (the first list: kombu's step 0)
        last_record = client.xrevrange(keys.events, count=1)
        entry_id = last_record[0][0] if last_record else None
        written_at = int(text(entry_id).split("-")[0]) / 1000 if entry_id else 0.0
        aged_at = float(client.get(keys.aged_at) or 0.0)
        if now - max(written_at, aged_at) < after:
            continue
        client.set(keys.aged_at, now)
        if _move_queued(client, queue, lambda level: min(level + 1, max(PRIORITIES))):
            raised.append(name)
    return raised


def _move_queued(client: redis.Redis, queue: str, new_level: Callable[[int], int]) -> int:
    """Move every message queued in `queue` from its priority level's list to `new_level(level)`'s;
    returns how many moved."""
    lists = queue_lists(queue)
    moved = 0
    for source, step in zip(lists, PRIORITY_STEPS, strict=True):
        level = max(PRIORITIES) - step  # the campaign priority of that kombu step
        wanted = message_priority(new_level(level))
        target = lists[PRIORITY_STEPS.index(wanted)]
        if target == source:
            continue
        # Oldest first (kombu pushes left and pops right), so the moved keep their order.
        for raw in reversed(client.lrange(source, 0, -1)):
            moved += _MOVE_MESSAGE(client, (source, target), (raw, readdressed(raw, priority=wanted)))
    return moved


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What `cancel_campaign` did: batches taken off the queue and out of `unacked` (their
    prompts), records and failures the campaign had, keys deleted, and whether workers
    stopped its prompts in flight before CANCEL_SETTLE_TIMEOUT."""

    queued_batches: int
    held_batches: int
    done: int
    failed: int
    keys_deleted: int
    settled: bool


def cancel_campaign(
    client: redis.Redis,
    campaign: str,
    *,
    base_queue: str,
    settle_timeout: float = CANCEL_SETTLE_TIMEOUT,
    on_wait: Callable[[int], None] | None = None,
) -> CancelOutcome:
    """Cancel `campaign` (see the module's docstring). `on_wait(inflight)` is told while workers
    still report its prompts in flight."""
    state = Campaign(client, campaign)
    progress = state.progress()
    keys = state.keys
    # The marker first: from here on nothing is published, taken or committed for it.
    marker = {"at": time.time(), "done": progress.done, "failed": progress.failed}
    client.set(keys.cancelled, json.dumps(marker))
    hosts = host_queues(client, base_queue, campaign)
    lists = [name for queue in (campaign_queue(base_queue, campaign), *hosts) for name in queue_lists(queue)]
    queued = sum(int(n) for n in pipelined(client, *(("llen", name) for name in lists)))
    client.delete(*lists)
    if hosts:
        client.hdel(HOST_QUEUES, *hosts)
    held = [h for h in held_batches(client, fetched_before=time.time() + 3600) if h.campaign == campaign]
    if held:
        tags = [h.tag for h in held]
        pipelined(client, ("hdel", UNACKED_KEY, *tags), ("zrem", UNACKED_INDEX_KEY, *tags))
    client.srem(CAMPAIGNS, campaign)
    deleted = _delete_state(client, keys)
    settled = _wait_for_inflight(client, campaign, timeout=settle_timeout, on_wait=on_wait)
    deleted += _delete_state(client, keys)
    client.srem(CAMPAIGNS, campaign)
    marker["queued"] = queued
    marker["held"] = len(held)
    client.set(keys.cancelled, json.dumps(marker))
    return CancelOutcome(
        queued_batches=queued,
        held_batches=len(held),
        done=progress.done,
        failed=progress.failed,
        keys_deleted=deleted,
        settled=settled,
    )


def forget_cancel(client: redis.Redis, campaign: str) -> bool:
    """Delete a cancelled campaign's marker, so its name can be enqueued again; False if none."""
    return bool(client.delete(CampaignKeys(campaign).cancelled))


def cancelled_names(client: redis.Redis) -> list[str]:
    """Every campaign whose cancel marker is in this Redis."""
    prefix = f"{KEY_PREFIX}:campaign:"
    suffix = ":cancelled"
    found = client.scan_iter(match=f"{prefix}*{suffix}", count=SCAN_COUNT)
    return sorted(text(key)[len(prefix) : -len(suffix)] for key in found)


def known_campaigns(client: redis.Redis) -> list[str]:
    """Running (or closed) campaigns and cancelled ones."""
    return sorted(set(campaign_names(client)) | set(cancelled_names(client)))


def _delete_state(client: redis.Redis, keys: CampaignKeys) -> int:
    """Delete every key of the campaign but its cancel marker."""
    doomed = [k for k in client.scan_iter(match=f"{keys.base}:*", count=SCAN_COUNT) if text(k) != keys.cancelled]
    return int(client.delete(*doomed)) if doomed else 0


def _wait_for_inflight(
    client: redis.Redis, campaign: str, *, timeout: float, on_wait: Callable[[int], None] | None
) -> bool:
    deadline = time.monotonic() + timeout
    while (inflight := sum(n.get("inflight_by_campaign", {}).get(campaign, 0) for n in all_nodes(client))) > 0:
        if time.monotonic() >= deadline:
            return False
        if on_wait is not None:
            on_wait(inflight)
        time.sleep(CANCEL_POLL_INTERVAL)
    return True
