"""Input rows of a campaign, per source: what the latest `enqueue` that read each source counted.

Rerunning `enqueue` on the same file (to resume, or to add new rows) reads its rows again; adding
each run's figures would count a 300-row file as 600 rows read after two runs. So each run
stores, per source it read (a file's real path, a dataset split, or `-` for stdin), the rows it
read and skipped there, replacing what an earlier run stored for that source; `status` shows the
sum over sources. A campaign's figures therefore mean "rows in its inputs, as last read", and
two different files add up while one file read twice does not. (The all-time counters
`rows-read` / `rows-skipped` in eagle_synth.state.counters still add up every run, for campaigns
enqueued before this store existed.)
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

import redis

from eagle_synth.state.keys import CampaignKeys

# The source name stdin rows carry (producer.sources.STDIN): one entry, replaced by each stdin run.
STDIN_SOURCE = "-"


@dataclass(slots=True)
class SourceRows:
    """Rows one enqueue run read from one source.

    Parameters:
        read: rows read (every row: enqueued, duplicate or skipped).
        skipped: rows skipped, with skipped_by_reason saying why.
        resumed: rows an earlier run had accounted for, passed over before templating
            (producer/resume.py); whatever of them that run skipped is kept from its entry.
    """

    read: int = 0
    skipped: int = 0
    resumed: int = 0
    skipped_by_reason: Counter = field(default_factory=Counter)

    def to_json(self) -> str:
        return json.dumps(
            {"read": self.read, "skipped": self.skipped, "skipped_by_reason": dict(self.skipped_by_reason)}
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> SourceRows:
        data = json.loads(raw)
        return cls(
            read=int(data.get("read", 0)),
            skipped=int(data.get("skipped", 0)),
            skipped_by_reason=Counter({str(k): int(v) for k, v in (data.get("skipped_by_reason") or {}).items()}),
        )


def source_name(source: str) -> str:
    """The stable name of a source: a file's (or dataset folder's) real path, so `data.jsonl` and
    `./data.jsonl` are one source; stdin stays `-`."""
    return source if source == STDIN_SOURCE else os.path.realpath(source)


def store_latest(client: redis.Redis, keys: CampaignKeys, by_source: dict[str, SourceRows]) -> None:
    """Store one run's rows per source, replacing an earlier run's entry for each of them.

    A run that resumed a source past rows an earlier run accounted for never saw why those rows
    were skipped, so the earlier entry's skips are carried over (its rows read are not: this run
    read the whole source again)."""
    if not by_source:
        return
    names = {source_name(s): rows for s, rows in by_source.items()}
    earlier = dict(zip(names, client.hmget(keys.input_rows, list(names)), strict=True))
    mapping = {}
    for name, rows in names.items():
        raw = earlier[name]
        if rows.resumed and raw is not None:
            before = SourceRows.from_json(raw)
            rows = SourceRows(
                read=rows.read,
                skipped=rows.skipped + before.skipped,
                skipped_by_reason=rows.skipped_by_reason + before.skipped_by_reason,
            )
        mapping[name] = rows.to_json()
    client.hset(keys.input_rows, mapping=mapping)  # type: ignore[arg-type]


def totals(client: redis.Redis, keys: CampaignKeys) -> SourceRows | None:
    """The sum over every source's latest run; None for a campaign that stored none."""
    entries = client.hgetall(keys.input_rows)
    if not entries:
        return None
    total = SourceRows()
    for raw in entries.values():
        rows = SourceRows.from_json(raw)
        total.read += rows.read
        total.skipped += rows.skipped
        total.skipped_by_reason.update(rows.skipped_by_reason)
    return total
