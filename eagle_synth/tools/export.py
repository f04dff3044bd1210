"""`eagle-synth export`: records to training rows (input_ids, loss_mask, provenance)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eagle_synth.records import Record, iter_records


@dataclass(frozen=True, slots=True)
class ExportFilters:
    """Which records become training rows.

    Parameters:
        drop_truncated: skip records that stopped on max_new_tokens (finish_reason length).
        min_output_tokens: skip records with fewer output ids.
        max_length: skip records whose prompt + output is longer.
    """

    drop_truncated: bool = False
    min_output_tokens: int = 0
    max_length: int | None = None

    def keep(self, record: Record) -> bool:
        if self.drop_truncated and record.finish_reason == "length":
            return False
        if len(record.output_ids) < self.min_output_tokens:
            return False
        if self.max_length is not None and len(record.prompt_ids) + len(record.output_ids) > self.max_length:
            return False
        return True


def training_row(record: Record) -> dict:
    """The exported row of one record (docs/records.md, "Export")."""
    return {
        "key": record.key,
        "id": record.id,
        "sample": record.sample,
        "turn": record.turn,
        "input_ids": record.input_ids,
        "loss_mask": record.loss_mask,
        "prompt_tokens": len(record.prompt_ids),
        "completion_tokens": len(record.output_ids),
        "finish_reason": record.finish_reason,
    }


def training_rows(campaign_path: str | os.PathLike, filters: ExportFilters) -> Iterator[dict]:
    for record in iter_records(campaign_path):
        if filters.keep(record):
            yield training_row(record)


def export_jsonl(campaign_path: str | os.PathLike, out: str | os.PathLike, *,
                 filters: ExportFilters = ExportFilters()) -> int:
    """Write one JSON object per line and per kept record; returns rows written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    count = 0
    with open(tmp, "w") as handle:
        for row in training_rows(campaign_path, filters):
            handle.write(json.dumps(row, separators=(",", ":")))
            handle.write("\n")
            count += 1
    os.replace(tmp, out)
    return count


@dataclass(frozen=True, slots=True)
class ExportResult:
    rows: int
    paths: list[Path]


def export_records(campaign_path: str | os.PathLike, out: str | os.PathLike, *, format: str = "jsonl",
                   filters: ExportFilters = ExportFilters(), shard_rows: int | None = None) -> ExportResult:
    """Export in the given format; see export_jsonl."""
    if format != "jsonl":
        raise ValueError(f"--format {format!r}: supported formats are jsonl")
    rows = export_jsonl(campaign_path, out, filters=filters)
    return ExportResult(rows=rows, paths=[Path(out)])
