"""How `eagle-synth status` looks: a table for people, refreshed with --watch."""

from __future__ import annotations

import json
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from eagle_synth.tools.status import campaign_status


def _ago(since: float | None, now: float) -> str:
    if not since:
        return "-"
    seconds = int(now - since)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return _ago(time.time() - seconds, time.time())


def status_renderable(data: dict) -> Group:
    now = data["at"]
    counts = Table(title=f"campaign {data['campaign']}", show_header=True, header_style="bold")
    for column in ("enqueued", "queued", "in flight", "done", "failed", "records/s", "tokens/s", "ETA"):
        counts.add_column(column, justify="right")
    counts.add_row(
        f"{data['enqueued']:,}", f"{data['queued']:,}", f"{data['inflight']:,}", f"{data['done']:,}",
        f"{data['failed']:,}", f"{data['records_per_s']:.2f}", f"{data['tokens_per_s']:,.0f}", _eta(data["eta_seconds"]),
    )
    parts = [counts]
    tokens = Table(show_header=True, header_style="bold")
    for column in ("tokens in", "tokens out", "rows read", "rows skipped", "prefix repairs"):
        tokens.add_column(column, justify="right")
    tokens.add_row(f"{data['tokens_in']:,}", f"{data['tokens_out']:,}", f"{data['rows_read']:,}",
                   f"{data['rows_skipped']:,}", f"{data['repaired_prefix']:,}")
    parts.append(tokens)
    if data["failed_by_reason"]:
        failed = Table(title="failed by reason", show_header=True, header_style="bold")
        failed.add_column("reason")
        failed.add_column("prompts", justify="right")
        for reason, count in sorted(data["failed_by_reason"].items(), key=lambda kv: -kv[1]):
            failed.add_row(reason, f"{count:,}")
        parts.append(failed)
    workers = Table(title="workers", show_header=True, header_style="bold")
    for column in ("node", "host", "server", "state", "since", "in flight", "taking batches"):
        workers.add_column(column)
    for w in data["workers"]:
        style = {"healthy": "green", "loading": "yellow", "warming": "yellow"}.get(w["state"], "red")
        workers.add_row(
            str(w["node"]), str(w["host"]), w["server"], f"[{style}]{w['state']}[/{style}]",
            _ago(w["since"], now), str(w["inflight"]), "yes" if w["consuming"] else "no",
        )
    if not data["workers"]:
        workers.add_row("(no live worker)", "", "", "", "", "", "")
    parts.append(workers)
    return Group(*parts)


def render_status(data: dict) -> None:
    Console().print(status_renderable(data))


def watch_status(client, campaign: str, *, interval: float, as_json: bool) -> None:
    """Refresh until Ctrl-C; with as_json, print one JSON line per refresh."""
    try:
        if as_json:
            while True:
                print(json.dumps(campaign_status(client, campaign)), flush=True)
                time.sleep(interval)
        with Live(status_renderable(campaign_status(client, campaign)), refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(status_renderable(campaign_status(client, campaign)))
    except KeyboardInterrupt:
        pass
