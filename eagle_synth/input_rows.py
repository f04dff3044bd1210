"""Input rows of a campaign per source, as the latest `enqueue` of each source counted them (a
rerun replaces its entry, so a file read twice is not counted twice); `status` shows the sum. The
all-time counters `rows-read` / `rows-skipped` still add up every run, for older campaigns.
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
    """Rows one run `read` from one source, those `skipped` (by reason), and those `resumed`
    (passed over as an earlier run's, producer/resume.py); `inherited`: the skips include those
    the earlier run counted among the resumed rows (its cursor kept them)."""

    read: int = 0
    skipped: int = 0
    resumed: int = 0
    skipped_by_reason: Counter = field(default_factory=Counter)
    inherited: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {"read": self.read, "skipped": self.skipped, "skipped_by_reason": dict(self.skipped_by_reason)}
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> SourceRows:
        data = json.loads(raw)
        by_reason = Counter({str(k): int(v) for k, v in (data.get("skipped_by_reason") or {}).items()})
        return cls(read=int(data.get("read", 0)), skipped=int(data.get("skipped", 0)), skipped_by_reason=by_reason)


def store_latest(client: redis.Redis, keys: CampaignKeys, by_source: dict[str, SourceRows]) -> None:
    """Store one run's rows per source (real path; stdin `-`), replacing an earlier entry; a run
    that resumed from a cursor without skip counts (written before they were kept) carries over
    the entry's skips (it never saw why those rows were skipped)."""
    if not by_source:
        return
    names = {s if s == STDIN_SOURCE else os.path.realpath(s): rows for s, rows in by_source.items()}
    mapping = {}
    for (name, rows), raw in zip(names.items(), client.hmget(keys.input_rows, list(names)), strict=True):
        if rows.resumed and not rows.inherited and raw is not None:
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
    if not (entries := client.hgetall(keys.input_rows)):
        return None
    total = SourceRows()
    for rows in map(SourceRows.from_json, entries.values()):
        total.read += rows.read
        total.skipped += rows.skipped
        total.skipped_by_reason.update(rows.skipped_by_reason)
    return total
