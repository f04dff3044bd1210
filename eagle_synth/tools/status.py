"""Where a campaign stands: counts from Redis, in-flight prompts and server states from the
workers' heartbeats, throughput over the last minute and an ETA."""

from __future__ import annotations

import time

import redis

from eagle_synth.campaign import Campaign
from eagle_synth.node_state import all_nodes

# Window for records/s and tokens/s, seconds.
RATE_WINDOW = 60.0


def campaign_status(client: redis.Redis, name: str) -> dict:
    """One JSON-ready dict: enqueued, queued, inflight, done, failed and the rest."""
    campaign = Campaign(client, name)
    if not campaign.exists():
        raise KeyError(f"no campaign named {name!r} in this Redis; `eagle-synth campaigns` lists them")
    progress = campaign.progress()
    nodes = all_nodes(client)
    inflight = sum(n.get("inflight_by_campaign", {}).get(name, 0) for n in nodes)
    inflight = min(inflight, progress.pending)
    events = campaign.recent_events(seconds=RATE_WINDOW)
    now = time.time()
    if events:
        span = max(now - events[0]["at"], 1.0) if len(events) > 1 else RATE_WINDOW
        span = min(span, RATE_WINDOW)
        records_per_s = sum(e["records"] for e in events) / span
        tokens_per_s = sum(e["tokens_out"] for e in events) / span
    else:
        records_per_s = tokens_per_s = 0.0
    eta = progress.pending / records_per_s if records_per_s > 0 else None
    failures: dict[str, int] = {}
    for key, value in progress.counters.items():
        if key.startswith("failed-"):
            failures[key[len("failed-"):]] = value
    workers = []
    for node in nodes:
        for url, state in node.get("server_states", {}).items():
            workers.append({
                "node": node.get("node"), "host": node.get("host"), "server": url,
                "state": state.get("state"), "since": state.get("since"), "detail": state.get("detail"),
                "consuming": node.get("consuming") == "1",
                "inflight": node.get("inflight_by_server", {}).get(url, 0),
            })
    return {
        "campaign": name,
        "enqueued": progress.enqueued,
        "queued": max(progress.pending - inflight, 0),
        "inflight": inflight,
        "done": progress.done,
        "failed": progress.failed,
        "failed_by_reason": _current_failures(campaign),
        "failures_recorded_by_reason": failures,
        "rows_read": progress.counters.get("rows-read", 0),
        "rows_skipped": progress.counters.get("rows-skipped", 0),
        "skipped_by_reason": campaign.skipped(),
        "tokens_in": progress.counters.get("tokens-in", 0),
        "tokens_out": progress.counters.get("tokens-out", 0),
        "repaired_prefix": progress.counters.get("repaired-prefix", 0),
        "records_per_s": round(records_per_s, 3),
        "tokens_per_s": round(tokens_per_s, 1),
        "eta_seconds": round(eta, 1) if eta is not None else None,
        "workers": workers,
        "at": now,
    }


def _current_failures(campaign: Campaign) -> dict[str, int]:
    counts: dict[str, int] = {}
    for failure in campaign.failures().values():
        counts[failure.reason] = counts.get(failure.reason, 0) + 1
    return counts
