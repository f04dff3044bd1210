"""Where a campaign stands: counts from Redis, in-flight prompts and server states from the
workers' heartbeats, stranded prompts (held by a dead worker, see eagle_synth.state.stranded),
throughput over the last minute and an ETA.

`campaign_status` returns one JSON-ready dict; its keys are the contract of
`eagle-synth status --json` (STATUS_KEYS, WORKER_KEYS) and only ever gain new members.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from eagle_synth import input_rows
from eagle_synth.errors import CampaignNotFound
from eagle_synth.priorities import campaign_priority
from eagle_synth.queue import campaign_queues, queued_count
from eagle_synth.settings import broker_settings
from eagle_synth.state.campaign import Campaign, CampaignSettings, Progress
from eagle_synth.state.campaign_archive import ended_info
from eagle_synth.state.campaign_control import cancel_marker, known_campaigns
from eagle_synth.state.conversation_store import ConversationStore
from eagle_synth.state.keys import (
    FAILED_PREFIX,
    REPAIRED_PREFIX,
    ROWS_READ,
    ROWS_SKIPPED,
    TOKENS_CACHED,
    TOKENS_IN,
    TOKENS_OUT,
)
from eagle_synth.state.node_state import UNKNOWN, NodeRouting, all_nodes, live_hosts
from eagle_synth.state.stranded import stranded_prompts

# Window for records/s and tokens/s, seconds.
RATE_WINDOW = 60.0
# Shortest span a rate is divided by, so a burst right after start does not read as a huge rate.
MIN_RATE_SPAN = 1.0

# Top-level keys of campaign_status(), in the order `status --json` documents them.
STATUS_KEYS = (
    "campaign",
    "enqueued",
    "queued",
    "inflight",
    "done",
    "failed",
    "finished_share",
    "failed_by_reason",
    "failures_recorded_by_reason",
    "rows_read",
    "rows_skipped",
    "skipped_by_reason",
    "tokens_in",
    "tokens_out",
    "cache_hit_share",
    "repaired_prefix",
    "records_per_s",
    "tokens_per_s",
    "rate_window_s",
    "eta_seconds",
    "workers",
    "at",
    "stranded",
    "conversations",
    "ended",
    "priority",
    "model",
    "queued_batches",
    "serving",
    "not_served",
    "cancelled",
)
# Keys of each entry of "workers": one per (worker node, server) pair.
WORKER_KEYS = (
    "node",
    "host",
    "server",
    "state",
    "since",
    "detail",
    "consuming",
    "inflight",
    "heartbeat_at",
    "disk",
    "redis",
    "backend",
)
# Keys of each row of `eagle-synth campaigns --json`.
CAMPAIGN_ROW_KEYS = (
    *STATUS_KEYS[:6],
    "records_per_s",
    "eta_seconds",
    "stranded",
    "priority",
    "model",
    "queued_batches",
    "serving",
    "cancelled",
    "ended",
)


def _share(part: int, whole: int) -> float:
    """part / whole to 4 places; 0.0 when there is no whole yet."""
    return round(part / whole, 4) if whole else 0.0


def campaign_status(
    client: redis.Redis, name: str, *, stranded: dict[str, int] | None = None, queue: str | None = None
) -> dict:
    """One JSON-ready dict with STATUS_KEYS; KeyError (with a hint) if the campaign is unknown.
    `stranded`: stranded_prompts(client) when the caller has it (one scan for all campaigns);
    `queue`: the base queue name campaign queues are made from (default: the configured one,
    EAGLE_SYNTH_QUEUE, as every caller that does not pass it, the exporter too, must read)."""
    campaign = Campaign(client, name)
    if not campaign.exists():
        if (marker := cancel_marker(client, name)) is not None:
            return _cancelled_status(name, marker)
        raise CampaignNotFound(name)
    progress = campaign.progress()
    ended = ended_info(campaign)
    if ended is not None:  # closed: its key sets are folded into a file; the marker keeps the totals
        done = int(ended.get("done", 0))
        failed = int(ended.get("failed", 0))
        progress = Progress(enqueued=done + failed, done=done, failed=failed, counters=progress.counters)
    nodes = all_nodes(client)
    # Heartbeats can lag a finished batch by a moment; never show more in flight than pending.
    inflight = min(sum(n.get("inflight_by_campaign", {}).get(name, 0) for n in nodes), progress.pending)
    # Stranded prompts wait for a reaper: fetched by a worker that died, not at any server.
    if stranded is None:
        stranded = stranded_prompts(client, hosts=live_hosts(nodes))
    stranded_here = stranded.get(name, 0)
    stranded_here = min(stranded_here, progress.pending - inflight)
    now = time.time()
    records_per_s, tokens_per_s = _rates(campaign.recent_events(seconds=RATE_WINDOW), now=now)
    eta = progress.pending / records_per_s if records_per_s > 0 else None
    inputs = input_rows.totals(client, campaign.keys)
    settings = campaign.settings()
    return {
        "campaign": name,
        "enqueued": progress.enqueued,
        "queued": max(progress.pending - inflight - stranded_here, 0),
        "inflight": inflight,
        "done": progress.done,
        "failed": progress.failed,
        "finished_share": round((progress.done + progress.failed) / progress.enqueued, 4) if progress.enqueued else 0.0,
        "failed_by_reason": campaign.failure_counts(),
        "failures_recorded_by_reason": {
            key.removeprefix(FAILED_PREFIX): value
            for key, value in progress.counters.items()
            if key.startswith(FAILED_PREFIX)
        },
        # Per source as its latest enqueue read it (a rerun replaces, not adds); older campaigns: all-time counters.
        "rows_read": inputs.read if inputs else progress.counters.get(ROWS_READ, 0),
        "rows_skipped": inputs.skipped if inputs else progress.counters.get(ROWS_SKIPPED, 0),
        "skipped_by_reason": dict(inputs.skipped_by_reason) if inputs else campaign.skipped(),
        "tokens_in": progress.counters.get(TOKENS_IN, 0),
        "tokens_out": progress.counters.get(TOKENS_OUT, 0),
        # Of the prompt tokens of the records, the share the servers found in their prefix cache.
        "cache_hit_share": _share(progress.counters.get(TOKENS_CACHED, 0), progress.counters.get(TOKENS_IN, 0)),
        "repaired_prefix": progress.counters.get(REPAIRED_PREFIX, 0),
        "records_per_s": round(records_per_s, 3),
        "tokens_per_s": round(tokens_per_s, 1),
        "rate_window_s": RATE_WINDOW,
        "eta_seconds": round(eta, 1) if eta is not None else None,
        "workers": list(_workers(nodes)),
        "at": now,
        "stranded": stranded_here,
        # ConversationStore.counts() of a `--history own` campaign, else None.
        "conversations": ConversationStore(campaign).counts() if settings and settings.history == "own" else None,
        # Closed (`eagle-synth close`): where its state was folded, with its done and failed counts
        # (which are then the figures above: enqueued is done + failed, nothing pending).
        "ended": ended,
        # On a shared fleet: its priority (higher first), its model (the tokenizer it was
        # templated with), batches waiting in its queue, the workers taking it, and servers
        # that do not (another model, or a model they cannot name) with why.
        "priority": campaign_priority(client, name),
        "model": _model(settings),
        "queued_batches": sum(
            queued_count(client, q) for q in campaign_queues(client, queue or broker_settings().queue, name)
        ),
        "serving": sorted(n.get("node", "") for n in nodes if name in NodeRouting.parse(n.get("routing")).campaigns),
        "not_served": list(_not_served(nodes, name)),
        # Cancelled (`eagle-synth cancel`): what it had then (a cancelled campaign has only this).
        "cancelled": None,
    }


def _model(settings: CampaignSettings | None) -> dict | None:
    """The campaign's model as its tokenizer names it: {"tokenizer", "fingerprint"}."""
    if settings is None:
        return None
    return {"tokenizer": settings.tokenizer_path, "fingerprint": settings.tokenizer_fingerprint}


def _not_served(nodes: list[dict], name: str) -> Iterator[dict]:
    for node in nodes:
        why = NodeRouting.parse(node.get("routing")).not_served.get(name, {})
        for url, detail in sorted(why.items()):
            yield {"node": node.get("node"), "server": url, "detail": detail}


def _cancelled_status(name: str, marker: dict) -> dict:
    """A cancelled campaign's status: nothing pending, what it had when cancelled, the marker."""
    data: dict[str, Any] = dict.fromkeys(STATUS_KEYS, 0)
    data["campaign"] = name
    data["done"] = marker.get("done", 0)
    data["failed"] = marker.get("failed", 0)
    data["failed_by_reason"] = {}
    data["failures_recorded_by_reason"] = {}
    data["skipped_by_reason"] = {}
    data["workers"] = []
    data["rate_window_s"] = RATE_WINDOW
    data["eta_seconds"] = None
    data["at"] = time.time()
    data["finished_share"] = 0.0
    data["cache_hit_share"] = 0.0
    data |= {key: None for key in ("conversations", "ended", "model")}
    data["serving"] = []
    data["not_served"] = []
    data["priority"] = None
    data["cancelled"] = marker
    return data


def campaigns_overview(client: redis.Redis, *, queue: str | None = None) -> list[dict]:
    """Every campaign's row for `eagle-synth campaigns` (CAMPAIGN_ROW_KEYS plus finished_share),
    cancelled ones included."""
    rows = []
    stranded = stranded_prompts(client)
    for name in known_campaigns(client):
        try:
            data = campaign_status(client, name, stranded=stranded, queue=queue)
        except KeyError:
            continue  # listed but its settings are gone (deleted by hand): nothing to show
        rows.append({key: data[key] for key in (*CAMPAIGN_ROW_KEYS, "finished_share")})
    return rows


def _rates(events: list[dict], *, now: float) -> tuple[float, float]:
    """Records/s and output tokens/s over the events of the last RATE_WINDOW seconds."""
    if not events:
        return 0.0, 0.0
    # A single event says nothing about its span, so it is spread over the whole window.
    span = now - events[0]["at"] if len(events) > 1 else RATE_WINDOW
    span = min(max(span, MIN_RATE_SPAN), RATE_WINDOW)
    return sum(e["records"] for e in events) / span, sum(e["tokens_out"] for e in events) / span


def _workers(nodes: list[dict]) -> Iterator[dict]:
    for node in nodes:
        states = dict(node.get("server_states", {}))
        # A node that has not published yet still lists its servers; show them as unknown.
        servers = _parsed(node.get("servers"), json.loads)
        for url in map(str, servers if isinstance(servers, list) else []):
            states.setdefault(url, {"state": UNKNOWN, "since": None, "detail": "not probed yet"})
        for url, state in sorted(states.items()):
            yield {
                "node": node.get("node"),
                "host": node.get("host"),
                "server": url,
                "state": state.get("state"),
                "since": state.get("since") or None,
                "detail": state.get("detail"),
                "consuming": node.get("consuming") == "1",
                "inflight": node.get("inflight_by_server", {}).get(url, 0),
                "heartbeat_at": _parsed(node.get("updated") or node.get("started"), float),
                # Why the worker's output folder cannot take records (None when it can).
                "disk": node.get("disk") or None,
                # What is wrong with Redis for this worker: an evicting policy or no persistence
                # (it takes no batches), replicas not acknowledging its marks (None: nothing).
                "redis": node.get("redis") or None,
                # The server's kind as preflight found it ("sglang", "vllm"; None before).
                "backend": state.get("backend"),
            }


def _parsed(raw: str | None, parse: Callable[[str], Any]) -> Any:
    """`parse(raw)`, or None when raw is empty or malformed."""
    try:
        return parse(raw) if raw else None
    except ValueError:
        return None
