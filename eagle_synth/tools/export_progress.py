"""Progress of a pass over records: what `export` and `vocab` report, and the line they show on a terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from eagle_synth.records import RawRecord

# Redraws per second of the terminal line.
REFRESH_PER_SECOND = 4
# Records read between two progress reports.
REPORT_EVERY = 512


class Progress(Protocol):
    """What a pass over records reports to."""

    def phase(self, description: str) -> None: ...

    def update(self, records_read: int) -> None: ...


def reported(records: Iterable[RawRecord], progress: Progress | None, phase: str) -> Iterator[RawRecord]:
    """The records, unchanged, telling `progress` the phase and then the count read every REPORT_EVERY."""
    if progress is None:
        yield from records
        return
    progress.phase(phase)
    read = 0
    for raw in records:
        yield raw
        read += 1
        if read % REPORT_EVERY == 0:
            progress.update(read)
    progress.update(read)


class RecordsProgress:
    """A live line on stderr when it is a terminal; silent otherwise (logs, CI, pipes).

    Parameters:
        total_records: records expected (the manifest's done count: a bar and an ETA), or None.
        enabled: False to show nothing whatever the terminal.
    """

    def __init__(self, *, total_records: int | None = None, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.total_records = total_records or None
        self._progress: Any = None
        self._task = None
        self._phase = "reading"
        self._started = time.monotonic()

    def __enter__(self) -> RecordsProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            columns = [SpinnerColumn(), TextColumn("{task.description}")]
            if self.total_records:
                columns += [BarColumn(), TimeRemainingColumn()]
            self._progress = RichProgress(
                *columns,
                TimeElapsedColumn(),
                console=Console(stderr=True),
                refresh_per_second=REFRESH_PER_SECOND,
                transient=True,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self._phase, total=self.total_records)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def phase(self, description: str) -> None:
        """Start a pass over the records (a sampled export reads them twice)."""
        self._phase = description
        self._started = time.monotonic()
        if self._progress is not None:
            self._progress.reset(self._task, total=self.total_records, description=description)

    def update(self, records_read: int) -> None:
        if self._progress is None:
            return
        rate = records_read / max(time.monotonic() - self._started, 1e-6)
        self._progress.update(
            self._task, completed=records_read, description=f"{self._phase}: {records_read:,} records ({rate:,.0f}/s)"
        )
