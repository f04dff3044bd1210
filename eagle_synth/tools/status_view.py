"""How `eagle-synth status` looks: every figure of tools.status.campaign_status as tables, laid
out for the console's width (StatusView), refreshed in place with --watch, which keeps going
through Redis outages and says so: an operator watches exactly when things go wrong.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from rich import box
from rich.columns import Columns
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.padding import Padding
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from eagle_synth.settings import DEFAULT_QUEUE
from eagle_synth.state.node_state import HEALTHY, LOADING, UNKNOWN, WARMING
from eagle_synth.tools.status import campaign_status

# Colour of each server state; anything else (unhealthy, refused) is red.
STATE_STYLES = {HEALTHY: "green", LOADING: "yellow", WARMING: "yellow", UNKNOWN: "dim"}
# Seconds without a heartbeat after which a worker row is flagged stale (workers beat every 10 s).
STALE_HEARTBEAT_S = 30.0
# Width of the progress bar in the title line, and the narrowest worth drawing beside the text.
PROGRESS_BAR_WIDTH = 40
MIN_PROGRESS_BAR_WIDTH = 10
# A width no console has: measuring a table in it gives the width its rows want unwrapped.
UNLIMITED_WIDTH = 100_000
# Columns of the wide workers table, in order.
WORKER_COLUMNS = (
    "node",
    "host",
    "server",
    "kind",
    "state",
    "for",
    "in flight",
    "taking batches",
    "last heartbeat",
    "detail",
)
# Beyond this many seconds the expected end is shown as a duration: a clock time a day or more
# ahead would read as today's.
CLOCK_ETA_LIMIT_S = 86400
# Failure reasons listed in the compact view (--watch on a short terminal); the rest are summed.
COMPACT_FAILURE_REASONS = 3
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


def finish_estimate(data: dict) -> str:
    """`ends ~18:50:12` at the current rate, `ends in 2d04h` beyond a day, `` without a rate or when done."""
    eta = data.get("eta_seconds")
    if eta is None or data["finished_share"] >= 1.0:
        return ""
    if eta >= CLOCK_ETA_LIMIT_S:
        return f"ends in {format_duration(eta)}"
    return f"ends ~{_clock(data['at'] + eta)}"


def _header(data: dict, width: int) -> RenderableType:
    """Name, progress bar, share finished, expected end and time of the figures on one line; the bar
    shrinks to the width, and a name too long for that goes on a line of its own above."""
    name = Text(f"campaign {data['campaign']}", style="bold")
    estimate = finish_estimate(data)
    if ended := data.get("ended"):
        estimate = f"closed {_clock(ended['at'])}" if ended.get("at") else "closed"
    share = Text(f"{100 * data['finished_share']:.1f}% finished" + (f", {estimate}" if estimate else ""))
    clock = Text(f"as of {_clock(data['at'])}", style="dim")
    grid = Table.grid(padding=(0, 1))
    beside = width - name.cell_len - share.cell_len - clock.cell_len - 3  # the grid's padding
    if beside >= MIN_PROGRESS_BAR_WIDTH:
        grid.add_row(name, _bar(data, min(PROGRESS_BAR_WIDTH, beside)), share, clock)
        return grid
    below = width - share.cell_len - clock.cell_len - 2
    grid.add_row(_bar(data, max(min(PROGRESS_BAR_WIDTH, below), 1)), share, clock)
    return Group(name, grid)


def fleet_line(data: dict) -> Text:
    """Where the campaign stands on a shared fleet, on one line: its model, priority, batches
    waiting in its queue, and the workers taking it (or, cancelled, when and what it had)."""
    if cancelled := data.get("cancelled"):
        at = _clock(float(cancelled.get("at") or 0))
        return Text(
            f"cancelled at {at}: {data['done']:,} records stay in its folder, {data['failed']:,} prompts had failed",
            style="bold yellow",
        )
    model = (data.get("model") or {}).get("tokenizer") or "?"
    serving = data.get("serving") or []
    takers = f"{len(serving)} worker{'s' if len(serving) != 1 else ''}" if serving else "no worker"
    line = Text(
        f"model {model} · priority {data.get('priority')} · {data.get('queued_batches', 0):,} batches queued · "
    )
    line.append(f"taken by {takers}", style="" if serving else "yellow")
    if not_served := data.get("not_served"):
        line.append(f" · {len(not_served)} server{'s' if len(not_served) != 1 else ''} of another model", style="dim")
    return line


def _bar(data: dict, width: int) -> ProgressBar:
    share = data["finished_share"]
    return ProgressBar(total=1.0, completed=share, width=width, complete_style="green", finished_style="bold green")


def _table(title: str, *, compact: bool, frame: box.Box | None, **options) -> Table:
    """A titled table; compact: no box (four lines fewer per block)."""
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=None if compact else frame,
        padding=(0, 1, 0, 0) if compact else (0, 1),
        **options,
    )


def _figures(title: str, rows: list[tuple[str, str | Text]], *, compact: bool = False) -> Table:
    table = _table(title, compact=compact, frame=box.SQUARE, show_header=False)
    table.add_column("figure", style="dim", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for label, value in rows:
        table.add_row(label, value)
    return table


def _blocks(data: dict, *, compact: bool = False) -> list[Table]:
    """The label/value blocks: prompts, conversations (`--history own` only), throughput, input."""
    window = format_duration(data["rate_window_s"])
    skipped = sorted(data["skipped_by_reason"].items(), key=lambda kv: (-kv[1], kv[0]))
    blocks: dict[str, list[tuple[str, str | Text]] | None] = {
        "prompts": [
            ("enqueued", f"{data['enqueued']:,}"),
            ("queued", f"{data['queued']:,}"),
            ("in flight", f"{data['inflight']:,}"),
            ("stranded", Text(f"{data.get('stranded', 0):,}", style="yellow" if data.get("stranded") else "")),
            ("done", f"{data['done']:,}"),
            ("failed", Text(f"{data['failed']:,}", style="red" if data["failed"] else "")),
        ],
        "conversations": None,
        "throughput": [
            ("tokens in", f"{data['tokens_in']:,}"),
            ("tokens out", f"{data['tokens_out']:,}"),
            ("prefix cache hits", f"{data.get('cache_hit_share', 0.0):.1%}"),
            (f"records/s ({window})", f"{data['records_per_s']:,.2f}"),
            (f"tokens/s ({window})", f"{data['tokens_per_s']:,.0f}"),
            ("ETA", format_duration(data["eta_seconds"])),
        ],
        "input": [
            ("rows read", f"{data['rows_read']:,}"),
            ("rows skipped", f"{data['rows_skipped']:,}"),
            # One reason a line keeps the block narrow however many reasons there are.
            ("skipped by reason", "\n".join(f"{r} {c:,}" for r, c in skipped) or "-"),
            ("prefix repairs", f"{data['repaired_prefix']:,}"),
        ],
    }
    if conversations := data.get("conversations"):
        stopped = conversations["stopped"]
        blocks["conversations"] = [
            ("total", f"{conversations['total']:,}"),
            ("done", f"{conversations['done']:,}"),
            ("in progress", f"{conversations['in_progress']:,}"),
            ("next turns waiting", f"{conversations['followups_waiting']:,}"),
            ("stopped", Text(f"{stopped:,}", style="yellow" if stopped else "")),
            *(
                (f"  {reason}", f"{count:,}")
                for reason, count in sorted(conversations["stopped_by_reason"].items(), key=lambda kv: -kv[1])
            ),
        ]
    return [_figures(title, rows, compact=compact) for title, rows in blocks.items() if rows is not None]


def _failures(data: dict, *, compact: bool = False) -> Table:
    """Failures by reason, most first; compact: the reasons past COMPACT_FAILURE_REASONS summed."""
    table = _table("failed by reason", compact=compact, frame=box.HEAVY_HEAD, header_style="bold")
    table.add_column("reason")
    table.add_column("prompts now", justify="right", no_wrap=True)
    table.add_column("ever recorded", justify="right", no_wrap=True)
    now = data["failed_by_reason"]
    ever = data["failures_recorded_by_reason"]
    reasons = sorted(set(now) | set(ever), key=lambda r: (-now.get(r, 0), r))
    shown = reasons[:COMPACT_FAILURE_REASONS] if compact and len(reasons) > COMPACT_FAILURE_REASONS + 1 else reasons
    for reason in shown:
        table.add_row(reason, f"{now.get(reason, 0):,}", f"{ever.get(reason, 0):,}")
    if rest := reasons[len(shown) :]:
        table.add_row(
            Text(f"{len(rest)} more reasons", style="dim"),
            f"{sum(now.get(r, 0) for r in rest):,}",
            f"{sum(ever.get(r, 0) for r in rest):,}",
        )
    if not reasons:
        table.add_row("(none)", "0", "0")
    return table


def _worker_cells(w: dict, now: float) -> dict[str, str | Text]:
    beat = w.get("heartbeat_at")
    why = "disk" if w.get("disk") else "redis" if w.get("redis") else None
    problem = "; ".join(filter(None, (w.get("disk"), w.get("redis"))))
    heartbeat: str | Text = "-"
    if beat:
        heartbeat = Text(f"{format_duration(now - beat)} ago", style="red" if now - beat > STALE_HEARTBEAT_S else "")
    return {
        "node": str(w["node"]),
        "host": str(w["host"]),
        "server": w["server"],
        "kind": w.get("backend") or "-",
        "state": Text(str(w["state"]), style=STATE_STYLES.get(w["state"], "red")),
        "for": f"{format_duration(now - w['since'])} (since {_clock(w['since'])})" if w["since"] else "-",
        "in flight": f"{w['inflight']:,}",
        "taking batches": "yes" if w["consuming"] else Text(f"no ({why})" if why else "no", style="yellow"),
        "last heartbeat": heartbeat,
        "detail": Text(problem, style="red") if problem else Text(w.get("detail") or "", style="dim"),
    }


def _workers_table(data: dict) -> Table:
    table = Table(title="workers", title_justify="left", title_style="bold", show_header=True, header_style="bold")
    for column in WORKER_COLUMNS:
        table.add_column(column, no_wrap=True)
    for w in data["workers"]:
        cells = _worker_cells(w, data["at"])
        table.add_row(*(cells[column] for column in WORKER_COLUMNS))
    if not data["workers"]:
        table.add_row(Text("(no live worker)", style="yellow"), *[""] * (len(WORKER_COLUMNS) - 1))
    return table


def _workers_blocks(data: dict, *, compact: bool = False) -> Group:
    """Each node on a line, its servers indented below, fields labelled in the text: for narrow
    terminals and pipes. Compact: durations without clock times, so a server's line fits 80 columns."""
    lines: list[RenderableType] = [Text("workers", style="bold")]

    def indented(text: Text, by: int) -> None:
        lines.append(Padding(text, (0, 0, 0, by), expand=False))  # wrapped lines keep the indent

    if not data["workers"]:
        indented(Text("(no live worker)", style="yellow"), 2)
    node = None
    for w in data["workers"]:
        cells = _worker_cells(w, data["at"])
        if w["node"] != node:
            node = w["node"]
            head = (str(node), "bold"), f" on {cells['host']}: last heartbeat ", cells["last heartbeat"]
            indented(Text.assemble(*head, ", taking batches ", cells["taking batches"]), 2)
        since = format_duration(data["at"] - w["since"]) if compact and w["since"] else cells["for"]
        server = Text.assemble(cells["server"], f" ({cells['kind']}) ", cells["state"], " for ", since)
        server.append(f"; in flight {cells['in flight']}")
        if cells["detail"]:
            server.append_text(Text.assemble("; ", cells["detail"]))
        indented(server, 4)
    return Group(*lines)


@dataclass
class StatusView:
    """One campaign_status() dict laid out for the console's width: blocks side by side while they
    fit, workers as a table when each row fits one line, else a block per node; no line wider than
    the console (80 columns when not a terminal). Given a `height` (--watch: the terminal's; None:
    any), a taller view goes compact (no boxes, rare failure reasons summed) so at 80x24 failures
    and workers stay on screen (Live crops the rest). `footer`: a dim last line (watch hints).
    """

    data: dict
    footer: str | None = field(default=None, kw_only=True)
    height: int | None = field(default=None, kw_only=True)

    def _parts(self, console: Console, options: ConsoleOptions, *, compact: bool) -> list[RenderableType]:
        table = _workers_table(self.data)
        # Measured without a width limit: rich clamps a measurement to the width it is given.
        fits = Measurement.get(console, options.update_width(UNLIMITED_WIDTH), table).maximum <= options.max_width
        return [
            _header(self.data, options.max_width),
            fleet_line(self.data),
            Columns(_blocks(self.data, compact=compact), padding=(0, 2)),
            _failures(self.data, compact=compact),
            table if fits else _workers_blocks(self.data, compact=compact),
            *([Text(self.footer, style="dim")] if self.footer else []),
        ]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        parts = self._parts(console, options, compact=False)
        if self.height is not None:
            tall = len(console.render_lines(Group(*parts), options.update(height=None), pad=False))
            if tall > self.height:
                parts = self._parts(console, options, compact=True)
        yield from parts


# Columns of the several-campaigns table (`status A B ...`), and the widest campaign name it
# keeps whole: the rest of a row takes about 58 columns, so a row fits 80.
FLEET_COLUMNS = ("campaign", "pri", "finished", "done", "failed", "queued", "in flight", "workers", "ETA")
FLEET_NAME_WIDTH = 22


@dataclass
class FleetView:
    """Several campaign_status() dicts as one table, a campaign a row, then why a server of the
    fleet does not take a campaign (one line each): `status A B --watch` at 80x24."""

    rows: list[dict]
    footer: str | None = field(default=None, kw_only=True)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = Table(box=box.SIMPLE_HEAD, header_style="bold", padding=(0, 1, 0, 0), pad_edge=False)
        for column in FLEET_COLUMNS:
            table.add_column(column, no_wrap=True, justify="left" if column == "campaign" else "right")
        table.columns[0].min_width = min(
            max((len(data["campaign"]) for data in self.rows), default=8), FLEET_NAME_WIDTH
        )
        for data in self.rows:
            cancelled = data.get("cancelled")
            table.add_row(
                Text(data["campaign"], style="bold"),
                str(data.get("priority") if data.get("priority") is not None else "-"),
                Text("cancelled", style="yellow") if cancelled else f"{100 * data['finished_share']:.1f}%",
                f"{data['done']:,}",
                Text(f"{data['failed']:,}", style="red" if data["failed"] else ""),
                f"{data['queued']:,}",
                f"{data['inflight']:,}",
                Text(str(len(data.get("serving") or [])), style="" if data.get("serving") or cancelled else "yellow"),
                format_duration(data["eta_seconds"]),
            )
        yield table
        for data in self.rows:
            for entry in data.get("not_served") or []:
                why = (
                    "serves another model"
                    if "does not match" in entry["detail"]
                    else "cannot say which model it serves"
                )
                line = f"{data['campaign']}: not taken by {entry['server']} ({entry['node']}): {why}"
                yield Text(line, style="dim", no_wrap=True, overflow="ellipsis")
        if self.footer:
            yield Text(self.footer, style="dim")


def render_status(data: dict, *, console: Console | None = None) -> None:
    (console or Console()).print(StatusView(data))


def render_fleet(rows: list[dict], *, console: Console | None = None) -> None:
    (console or Console()).print(FleetView(rows))


def watch_status(
    client: redis.Redis,
    campaign: str | list[str],
    *,
    interval: float,
    as_json: bool,
    console: Console | None = None,
    refreshes: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    queue: str = DEFAULT_QUEUE,
) -> None:
    """Refresh every `interval` s until Ctrl-C (or `refreshes` times); with as_json, one JSON line each.
    Redis errors and a vanished campaign are shown (stderr with as_json) and retried, not fatal.
    Several campaigns show as one FleetView table (JSON: a list per line)."""
    if isinstance(campaign, list) and len(campaign) > 1:
        _watch_fleet(
            client,
            campaign,
            interval=interval,
            as_json=as_json,
            console=console,
            refreshes=refreshes,
            sleep=sleep,
            queue=queue,
        )
        return
    campaign = campaign[0] if isinstance(campaign, list) else campaign
    footer = f"every {interval:g}s; Ctrl-C to stop"
    console = console or Console()
    last_good: dict | None = None
    live_view = contextlib.nullcontext() if as_json else Live(console=console, auto_refresh=False, transient=False)
    with contextlib.suppress(KeyboardInterrupt), live_view as live:
        for count in itertools.count(1) if refreshes is None else range(1, refreshes + 1):
            data = None
            problem = None
            try:
                data = campaign_status(client, campaign, queue=queue)
            except REDIS_ERRORS as exc:
                problem = f"Redis not answering ({exc}); retrying every {interval:g}s"
            except KeyError as exc:
                problem = str(exc.args[0])
            if live is None:
                if data is not None:
                    print(json.dumps(data), flush=True)
                else:
                    print(f"eagle-synth status: {problem}", file=sys.stderr, flush=True)
            elif data is not None:
                last_good = data
                live.update(StatusView(data, footer=footer, height=console.size.height), refresh=True)
            elif last_good is not None:
                # Keep the last figures on screen, marked stale, so the operator keeps context.
                stale = Text(f"{problem} — figures below are from {_clock(last_good['at'])}", style="bold red")
                view = StatusView(last_good, footer=footer, height=console.size.height - 1)
                live.update(Group(stale, view), refresh=True)
            else:
                live.update(Text(problem or "no data", style="bold red"), refresh=True)
            if refreshes is None or count < refreshes:
                sleep(interval)


def _watch_fleet(
    client: redis.Redis,
    campaigns: list[str],
    *,
    interval: float,
    as_json: bool,
    console: Console | None,
    refreshes: int | None,
    sleep: Callable[[float], None],
    queue: str,
) -> None:
    """watch_status for several campaigns: a FleetView (or a JSON list) per refresh."""
    footer = f"every {interval:g}s; Ctrl-C to stop"
    console = console or Console()
    live_view = contextlib.nullcontext() if as_json else Live(console=console, auto_refresh=False, transient=False)
    with contextlib.suppress(KeyboardInterrupt), live_view as live:
        for count in itertools.count(1) if refreshes is None else range(1, refreshes + 1):
            try:
                rows = [campaign_status(client, name, queue=queue) for name in campaigns]
            except (*REDIS_ERRORS, KeyError) as exc:
                problem = f"{exc.args[0] if isinstance(exc, KeyError) else exc}; retrying every {interval:g}s"
                if live is None:
                    print(f"eagle-synth status: {problem}", file=sys.stderr, flush=True)
                else:
                    live.update(Text(problem, style="bold red"), refresh=True)
            else:
                if live is None:
                    print(json.dumps(rows), flush=True)
                else:
                    live.update(FleetView(rows, footer=footer), refresh=True)
            if refreshes is None or count < refreshes:
                sleep(interval)
