"""The live progress line of `enqueue`, `export` and `vocab`: on stderr when it is a terminal, else silent."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

# Redraws per second of the terminal line.
REFRESH_PER_SECOND = 4
# Records read between two progress reports.
REPORT_EVERY = 512

_T = TypeVar("_T")


class Progress(Protocol):
    """What a pass over records reports to."""

    def phase(self, description: str) -> None: ...

    def update(self, records_read: int) -> None: ...


def reported(records: Iterable[_T], progress: Progress | None, phase: str) -> Iterator[_T]:
    """The records, unchanged, telling `progress` the phase and then the count read every REPORT_EVERY."""
    if progress is None:
        yield from records
        return
    progress.phase(phase)
    read = 0
    for read, raw in enumerate(records, 1):
        yield raw
        if read % REPORT_EVERY == 0:
            progress.update(read)
    progress.update(read)


def wanted() -> bool:
    """Whether a progress line would show (so counting the rows for its total is worth it)."""
    return sys.stderr.isatty()


class LiveLine:
    """A spinner, description, bar, percent and ETA when `total` is known, and time elapsed (if `enabled`)."""

    def __init__(self, *, total: int | None = None, enabled: bool = True, description: str = "") -> None:
        self.enabled = enabled and wanted()
        self.total = total or None
        self.description = description
        self.started = time.monotonic()
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                SpinnerColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            bar = [BarColumn(), TaskProgressColumn(), TimeRemainingColumn()] if self.total else []
            self._progress = RichProgress(
                *[SpinnerColumn(), TextColumn("{task.description}"), *bar, TimeElapsedColumn()],
                console=Console(stderr=True),
                refresh_per_second=REFRESH_PER_SECOND,
                transient=True,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self.description, total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def show(self, description: str, completed: int | None = None) -> bool:
        """Redraw the line; False when there is none (not a terminal)."""
        if self._progress is None:
            return False
        self._progress.update(self._task, completed=completed, description=description)
        return True

    def rate(self, count: int) -> float:
        return count / max(time.monotonic() - self.started, 1e-6)


class RecordsProgress(LiveLine):
    """Progress of a pass over records (`total_records`: the manifest's done count)."""

    def __init__(self, *, total_records: int | None = None, enabled: bool = True) -> None:
        super().__init__(total=total_records, enabled=enabled, description="reading")

    def phase(self, description: str) -> None:
        """Start a pass over the records (a sampled export reads them twice)."""
        self.description = description
        self.started = time.monotonic()
        if self._progress is not None:
            self._progress.reset(self._task, total=self.total, description=description)

    def update(self, records_read: int) -> None:
        self.show(f"{self.description}: {records_read:,} records ({self.rate(records_read):,.0f}/s)", records_read)


class EnqueueProgress(LiveLine):
    """Progress of `enqueue`: what it is doing before the first rows are in (`phase`), then rows
    read, rows/s, and why it waits when the backlog is full. The bar's total is `total_rows`
    when the rows could be counted cheaply, else `total_bytes` of the input files, which
    `bytes_read` says how far reading has got in."""

    def __init__(
        self,
        *,
        enabled: bool = True,
        total_rows: int | None = None,
        total_bytes: int | None = None,
        bytes_read: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(total=total_rows or total_bytes, enabled=enabled, description="starting")
        self.by_bytes = not total_rows and total_bytes is not None and bytes_read is not None
        self.bytes_read = bytes_read

    def phase(self, description: str) -> None:
        self.started = time.monotonic()  # rows/s counts from the rows, not from the tokenizer's load
        self.show(description)

    def update(self, summary) -> None:
        read = summary.rows_read
        done = self.bytes_read() if self.by_bytes and self.bytes_read is not None else read
        self.show(
            f"rows {read:,} ({self.rate(read):,.0f}/s) | enqueued {summary.prompts_enqueued:,} | "
            f"duplicate {summary.prompts_duplicate:,} | skipped {summary.rows_skipped:,}",
            done,
        )

    def waiting(self, pending: int, *, held_bytes: int | None = None, max_bytes: int | None = None) -> None:
        message = f"backlog {pending:,} prompts is over --max-backlog: waiting for workers"
        if held_bytes is not None and max_bytes is not None:
            message = (
                f"backlog holds {held_bytes / 1e6:,.0f} MB in Redis (queue, failures, outbox), over "
                f"--max-backlog-mb {max_bytes / 1e6:,.0f}: waiting for workers (or `retry-failed`)"
            )
        if not self.show(message):
            print(message, file=sys.stderr, flush=True)
