"""The progress line `enqueue` shows on a terminal: rows read, rows/s, backlog waits."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Seconds between redraws; enqueue calls update once per chunk of rows.
REFRESH_PER_SECOND = 4


class EnqueueProgress:
    """A live line on stderr when it is a terminal; silent otherwise (logs, CI, --json).

    Parameters:
        enabled: False to show nothing whatever the terminal.
        total_rows: rows expected (for the bar and the ETA), None if unknown.
    """

    def __init__(self, *, enabled: bool = True, total_rows: int | None = None) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.total_rows = total_rows
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._started = time.monotonic()

    def __enter__(self) -> EnqueueProgress:
        if self.enabled:
            columns = [SpinnerColumn(), TextColumn("{task.description}")]
            if self.total_rows:
                columns += [BarColumn(), TimeRemainingColumn()]
            self._progress = Progress(
                *columns,
                TimeElapsedColumn(),
                console=Console(stderr=True),
                refresh_per_second=REFRESH_PER_SECOND,
                transient=True,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("reading rows", total=self.total_rows)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def update(self, summary) -> None:
        if self._progress is None or self._task is None:
            return
        elapsed = max(time.monotonic() - self._started, 1e-6)
        self._progress.update(
            self._task,
            completed=summary.rows_read,
            description=(
                f"rows {summary.rows_read:,} ({summary.rows_read / elapsed:,.0f}/s) | enqueued "
                f"{summary.prompts_enqueued:,} | duplicate {summary.prompts_duplicate:,} | skipped "
                f"{summary.rows_skipped:,}"
            ),
        )

    @staticmethod
    def wanted() -> bool:
        """Whether a progress display would show (so the row count is worth taking)."""
        return sys.stderr.isatty()

    def waiting(self, pending: int, *, held_bytes: int | None = None, max_bytes: int | None = None) -> None:
        message = f"backlog {pending:,} prompts is over --max-backlog: waiting for workers"
        if held_bytes is not None and max_bytes is not None:
            message = (
                f"backlog holds {held_bytes / 1e6:,.0f} MB in Redis (queue, failures, outbox), over "
                f"--max-backlog-mb {max_bytes / 1e6:,.0f}: waiting for workers (or `retry-failed`)"
            )
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=message)
        else:
            print(message, file=sys.stderr, flush=True)
