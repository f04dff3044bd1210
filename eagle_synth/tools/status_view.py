"""How `eagle-synth status` looks: tables for people, refreshed in place with --watch.

The view shows every figure of tools.status.campaign_status: counts, failures by reason,
tokens, throughput over the last minute, ETA, and one row per worker and server with the
server's state and since when. --watch keeps going through Redis outages and says so,
because an operator watches exactly when things go wrong.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import redis
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from eagle_synth.node_state import HEALTHY, LOADING, UNKNOWN, WARMING
from eagle_synth.tools.status import campaign_status

# Colour of each server state; anything else (unhealthy, refused) is red.
STATE_STYLES = {HEALTHY: "green", LOADING: "yellow", WARMING: "yellow", UNKNOWN: "dim"}
# Seconds without a heartbeat after which a worker row is flagged stale (workers beat every 10 s).
STALE_HEARTBEAT_S = 30.0
# Width of the progress bar in the title line.
PROGRESS_BAR_WIDTH = 40
# Errors that mean "Redis is not answering right now" rather than a bug: --watch waits them out.
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def format_duration(seconds: float | None) -> str:
    """A short human duration: 45s, 12m, 3h05m, 2d04h; '-' for unknown."""
    if seconds is None:
        return "-"
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _since(since: float | None, now: float) -> str:
    if not since:
        return "-"
    return f"{format_duration(now - since)} (since {_clock(since)})"


def _header(data: dict) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_row(
        Text(f"campaign {data['campaign']}", style="bold"),
        ProgressBar(total=1.0, completed=data["finished_share"], width=PROGRESS_BAR_WIDTH,
                    complete_style="green", finished_style="bold green"),
        Text(f"{100 * data['finished_share']:.1f}% finished"),
        Text(f"at {_clock(data['at'])}", style="dim"),
    )
    return grid


def _counts(data: dict) -> Table:
    window = format_duration(data["rate_window_s"])
    table = Table(show_header=True, header_style="bold", title_justify="left")
    columns = ("enqueued", "queued", "in flight", "stranded", "done", "failed",
               "tokens in", "tokens out", f"records/s ({window})", f"tokens/s ({window})", "ETA")
    for column in columns:
        table.add_column(column, justify="right")
    table.add_row(
        f"{data['enqueued']:,}", f"{data['queued']:,}", f"{data['inflight']:,}",
        Text(f"{data.get('stranded', 0):,}", style="yellow" if data.get("stranded") else ""),
        f"{data['done']:,}",
        Text(f"{data['failed']:,}", style="red" if data["failed"] else ""),
        f"{data['tokens_in']:,}", f"{data['tokens_out']:,}",
        f"{data['records_per_s']:,.2f}", f"{data['tokens_per_s']:,.0f}", format_duration(data["eta_seconds"]),
    )
    return table


def _input(data: dict) -> Table:
    table = Table(show_header=True, header_style="bold")
    for column in ("rows read", "rows skipped", "skipped by reason", "prefix repairs"):
        table.add_column(column, justify="right")
    skipped = ", ".join(f"{r} {c:,}" for r, c in sorted(data["skipped_by_reason"].items(), key=lambda kv: -kv[1]))
    table.add_row(f"{data['rows_read']:,}", f"{data['rows_skipped']:,}", skipped or "-", f"{data['repaired_prefix']:,}")
    return table


def _failures(data: dict) -> Table:
    table = Table(title="failed by reason", title_justify="left", show_header=True, header_style="bold")
    table.add_column("reason")
    table.add_column("prompts now", justify="right")
    table.add_column("ever recorded", justify="right")
    reasons = set(data["failed_by_reason"]) | set(data["failures_recorded_by_reason"])
    for reason in sorted(reasons, key=lambda r: (-data["failed_by_reason"].get(r, 0), r)):
        table.add_row(reason, f"{data['failed_by_reason'].get(reason, 0):,}",
                      f"{data['failures_recorded_by_reason'].get(reason, 0):,}")
    if not reasons:
        table.add_row("(none)", "0", "0")
    return table


def _conversations(data: dict) -> Table:
    conversations = data["conversations"]
    table = Table(title="conversations (--history own)", title_justify="left", show_header=True, header_style="bold")
    for column in ("total", "done", "in progress", "stopped", "stopped by reason", "next turns waiting"):
        table.add_column(column, justify="right")
    reasons = ", ".join(f"{r} {c:,}" for r, c in sorted(conversations["stopped_by_reason"].items(), key=lambda kv: -kv[1]))
    table.add_row(f"{conversations['total']:,}", f"{conversations['done']:,}", f"{conversations['in_progress']:,}",
                  f"{conversations['stopped']:,}", reasons or "-", f"{conversations['followups_waiting']:,}")
    return table


def _workers(data: dict) -> Table:
    now = data["at"]
    table = Table(title="workers", title_justify="left", show_header=True, header_style="bold")
    for column in ("node", "host", "server", "kind", "state", "for", "in flight", "taking batches", "last heartbeat",
                   "detail"):
        table.add_column(column, overflow="fold")
    for w in data["workers"]:
        style = STATE_STYLES.get(w["state"], "red")
        beat = w.get("heartbeat_at")
        beat_age = now - beat if beat else None
        table.add_row(
            str(w["node"]), str(w["host"]), w["server"], w.get("backend") or "-", Text(str(w["state"]), style=style),
            _since(w["since"], now), f"{w['inflight']:,}", "yes" if w["consuming"] else Text("no (disk)" if w.get("disk") else "no", style="yellow"),
            Text(f"{format_duration(beat_age)} ago", style="red" if (beat_age or 0) > STALE_HEARTBEAT_S else "")
            if beat_age is not None else "-",
            Text(w.get("disk") or "", style="red") if w.get("disk") else Text(w.get("detail") or "", style="dim"),
        )
    if not data["workers"]:
        table.add_row(Text("(no live worker)", style="yellow"), *[""] * 9)
    return table


def status_renderable(data: dict, *, footer: str | None = None) -> Group:
    """The whole view of one campaign_status() dict; footer is a dim last line (e.g. watch hints)."""
    parts: list[RenderableType] = [_header(data), _counts(data), _input(data), _failures(data), _workers(data)]
    if data.get("conversations"):
        parts.insert(2, _conversations(data))
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


def render_status(data: dict, *, console: Console | None = None) -> None:
    (console or Console()).print(status_renderable(data))


def _problem(message: str) -> Text:
    return Text(message, style="bold red")


def watch_status(client: redis.Redis, campaign: str, *, interval: float, as_json: bool,
                 console: Console | None = None, refreshes: int | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Refresh every `interval` s until Ctrl-C (or `refreshes` times); with as_json, one JSON line each.

    Redis errors and a vanished campaign are shown (on stderr with as_json) and retried at the
    next refresh instead of ending the watch.
    """
    footer = f"every {interval:g}s; Ctrl-C to stop"
    count = 0
    last_good: dict | None = None

    def snapshot() -> tuple[dict | None, str | None]:
        try:
            return campaign_status(client, campaign), None
        except REDIS_ERRORS as exc:
            return None, f"Redis not answering ({exc}); retrying every {interval:g}s"
        except KeyError as exc:
            return None, str(exc.args[0])

    try:
        if as_json:
            while refreshes is None or count < refreshes:
                data, problem = snapshot()
                if data is not None:
                    print(json.dumps(data), flush=True)
                else:
                    print(f"eagle-synth status: {problem}", file=sys.stderr, flush=True)
                count += 1
                if refreshes is None or count < refreshes:
                    sleep(interval)
            return
        console = console or Console()
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while refreshes is None or count < refreshes:
                data, problem = snapshot()
                if data is not None:
                    last_good = data
                    live.update(status_renderable(data, footer=footer), refresh=True)
                elif last_good is not None:
                    # Keep the last figures on screen, marked stale, so the operator keeps context.
                    live.update(Group(_problem(f"{problem} — figures below are from {_clock(last_good['at'])}"),
                                      status_renderable(last_good, footer=footer)), refresh=True)
                else:
                    live.update(_problem(problem or "no data"), refresh=True)
                count += 1
                if refreshes is None or count < refreshes:
                    sleep(interval)
    except KeyboardInterrupt:
        pass
