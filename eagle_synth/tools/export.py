"""`eagle-synth export`: records to training rows, in the formats the drafter trainers read.

Records stream once through the filters (tools/filters.py) into row groups bounded in rows and ids,
into each split's output files: memory stays flat at any size. Parquet and the datasets folders are
built from the ids' uint32 bytes (RawRecord), without a Python int per id. Docs: docs/records.md.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import os
import re
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle_synth.errors import ExportError, UserError
from eagle_synth.progress import Progress, reported
from eagle_synth.records import RawRecord, iter_raw_records, read_manifest
from eagle_synth.tools.conversation_order import grouped_records, ordered_records
from eagle_synth.tools.export_rows import arrow_batch, arrow_schema, json_row
from eagle_synth.tools.filters import ExportFilters, SelectionStats, sample_cutoff, select_rows
from eagle_synth.tools.trainer_formats import (
    DATASET_FORMATS,
    StagedSplit,
    check_dataset_out,
    specforge_lines,
    write_dataset_folder,
)

__all__ = ["ExportFilters", "ExportResult", "FORMATS", "OutputOptions", "export_records", "export_rows"]

FORMATS = ("jsonl", "parquet", "specforge", "speculators", "hf")
# Rows per Parquet row group (and per JSONL write): big enough for fast scans, small enough for flat memory.
ROW_GROUP_ROWS = 2048
# A row group is also closed once its rows hold this many ids, so long records keep memory flat too.
ROW_GROUP_TOKENS = 8 << 20
# Parquet pages: zstd (pyarrow, datasets and Spark read it) at level 3, 6% smaller than the default
# at about the same speed. Only the columns of few distinct values are dictionary-encoded: on id
# lists a dictionary costs time and grows files by 25%.
PARQUET_OPTIONS = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": ["finish_reason", "finish_matched", "campaign", "server", "worker"],
}
# Digits of the shard index in sharded output names (`out-00000.parquet`).
SHARD_DIGITS = 5
# Bytes SpecForge holds per pre-tokenized token: it keeps each row as Python lists of ints
# (data/prompt_builder.py:199-252 at a6b6b02): an 8-byte list slot plus a 28-byte int object per
# id, an 8-byte slot per mask entry (0 and 1 are shared objects). Measured: 44.0
# (tests/test_trainer_exports.py::test_specforge_holds_about_44_bytes_per_token).
SPECFORGE_BYTES_PER_TOKEN = 44


@dataclass(slots=True)
class ExportResult:
    """What an export wrote: the `--json` summary's figures (docs/records.md, "Filters"; read, dropped and
    clipped in `stats`); `paths` are folders for the datasets formats, `train_data_ratio` is per split ("all" unsplit)."""

    format: str = "jsonl"
    rows: int = 0
    paths: list[Path] = field(default_factory=list)
    tokens: int = 0
    loss_tokens: int = 0
    stats: SelectionStats = field(default_factory=SelectionStats)
    split_rows: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    train_data_ratio: dict[str, float | None] = field(default_factory=dict)
    largest_file_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        summary = {
            "format": self.format,
            "rows": self.rows,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "read": self.stats.read,
            "dropped": self.stats.dropped,
            "clipped": self.stats.clipped,
            "splits": self.split_rows,
            "paths": [str(p) for p in self.paths],
            "warnings": self.warnings,
            "commands": self.commands,
        }
        if self.format == "speculators":
            summary["train_data_ratio"] = self.train_data_ratio
        if self.format == "specforge":
            summary["largest_file_tokens"] = self.largest_file_tokens
            summary["specforge_memory_bytes"] = self.largest_file_tokens * SPECFORGE_BYTES_PER_TOKEN
        return summary | {"seconds": round(self.seconds, 3), "tokens_per_s": round(self.tokens_per_s)}


def _source(
    campaign_path: str | os.PathLike, turns: str, dropped: Counter, *, grouped: bool = False
) -> Iterator[RawRecord]:
    """The records to export: in conversation order for `--history own` (or `turns` "last"); `grouped`
    (speculators): in row-group order; records `turns` leaves out are counted in `dropped`."""
    if turns not in ("all", "last"):
        raise UserError(f"turns {turns!r}: use all or last")
    if grouped:
        return grouped_records(campaign_path, turns=turns, dropped=dropped)
    history = (((read_manifest(campaign_path) or {}).get("settings")) or {}).get("history")
    if history != "own" and turns == "all":
        return iter_raw_records(campaign_path)
    return ordered_records(campaign_path, turns=turns, dropped=dropped)


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """How the output is written: the export flags of the same names (docs/records.md). `zero_last_loss`
    is for SpecForge's EAGLE-3 online runs before upstream #895 (not DFlash)."""

    shard_rows: int | None = None
    shard_tokens: int | None = None
    zero_last_loss: bool = False
    replace: bool = False

    def check(self, format: str, out: Path) -> None:
        if format not in FORMATS:
            raise ExportError(f"--format {format!r}: use one of {', '.join(FORMATS)}")
        for flag, value in (("--shard-rows", self.shard_rows), ("--shard-tokens", self.shard_tokens)):
            if value is not None and value < 1:
                raise ExportError(f"{flag} must be at least 1")
        if self.zero_last_loss and format != "specforge":
            raise ExportError("--zero-last-loss is for --format specforge (SpecForge's EAGLE-3 online target shift)")
        if format == "specforge" and out.name.endswith(".gz"):
            raise ExportError("--format specforge: SpecForge opens data.prompts_path as plain text; drop the .gz")
        if format in DATASET_FORMATS:
            if self.shard_tokens:
                raise ExportError(f"--shard-tokens is for file formats; --format {format} takes --shard-rows")
            check_dataset_out(format, out, replace=self.replace)


def _writer(
    format: str, options: OutputOptions, *, gz: bool
) -> tuple[Callable[[Path], Any], Callable[[Any, list], None]]:
    """(open a file, write a row group to it) for a file format; `gz`: a gzipped JSONL file."""
    if format == "parquet":
        import pyarrow.parquet as pq

        schema = arrow_schema()
        return (
            lambda path: pq.ParquetWriter(path, schema, **PARQUET_OPTIONS),
            lambda writer, group: writer.write_batch(arrow_batch(group, schema), row_group_size=len(group)),
        )
    if format == "specforge":
        return (
            lambda path: open(path, "w", encoding="utf-8"),
            lambda handle, group: handle.write(
                specforge_lines(group, zero_last_loss=True) if options.zero_last_loss else specforge_lines(group)
            ),
        )
    opener: Callable[..., Any] = functools.partial(gzip.open, compresslevel=6) if gz else open
    return (
        lambda path: opener(path, "wt", encoding="utf-8"),
        lambda handle, group: handle.write(
            "".join(json.dumps(json_row(raw), separators=(",", ":"), ensure_ascii=False) + "\n" for raw in group)
        ),
    )


class _FileSink:
    """Writes one split's row groups into its files (named as docs/records.md, "Output files"), each
    whole or not at all: closed at `shard_rows` rows, or before a row that would take it past
    `shard_tokens` ids. With no rows, one empty file (a Parquet one still carries the schema)."""

    def __init__(self, format: str, out: Path, split: str | None, options: OutputOptions) -> None:
        self.shard_rows = options.shard_rows
        self.shard_tokens = options.shard_tokens
        self.sharded = bool(self.shard_rows or self.shard_tokens)
        if out.is_dir() and not self.sharded:
            raise ExportError(
                f"--out {out} is a folder: give a file name, or --shard-rows N to write part-00000... files into it"
            )
        default_suffix = ".parquet" if format == "parquet" else ".jsonl"
        if self.sharded and (out.is_dir() or not out.suffix):
            self.folder = out
            self.stem = split or "part"
            self.suffix = default_suffix
        else:
            gz = out.suffix == ".gz" and len(out.suffixes) > 1
            self.suffix = "".join(out.suffixes[-2:]) if gz else (out.suffix or default_suffix)
            stem = out.name[: len(out.name) - len(self.suffix)]
            self.folder = out.parent
            self.stem = f"{stem}-{split}" if split else stem
        self.single = out if split is None else self.folder / f"{self.stem}{self.suffix}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.open_file, self.write_group = _writer(format, options, gz=self.suffix.endswith(".gz"))
        self.done: list[Path] = []
        self.handle: Any = None
        self.index = 0
        self.in_shard = 0
        self.tokens_in_shard = 0
        self.largest_file_tokens = 0

    def path(self, index: int) -> Path:
        return self.folder / f"{self.stem}-{index:0{SHARD_DIGITS}d}{self.suffix}" if self.sharded else self.single

    def tmp(self) -> Path:
        path = self.path(self.index)
        return path.with_name(f".{path.name}.tmp")

    def _fitting(self, group: list[RawRecord]) -> int:
        """How many of the group's first rows go into the current file."""
        room = min(len(group), self.shard_rows - self.in_shard) if self.shard_rows else len(group)
        if not self.shard_tokens:
            return room
        tokens = self.tokens_in_shard
        for n, raw in enumerate(group[:room]):
            tokens += raw.prompt_len + raw.output_len
            if tokens > self.shard_tokens and (n or self.in_shard):
                return n
        return room

    def add_group(self, group: list[RawRecord]) -> None:
        while group:
            count = self._fitting(group)
            if count == 0:
                self._next_file()
                continue
            take, group = group[:count], group[count:]
            if self.handle is None:
                self.handle = self.open_file(self.tmp())
            self.write_group(self.handle, take)
            self.in_shard += len(take)
            self.tokens_in_shard += sum(raw.prompt_len + raw.output_len for raw in take)
            self.largest_file_tokens = max(self.largest_file_tokens, self.tokens_in_shard)

    def _next_file(self) -> None:
        """Publish the file being written and start counting the next one."""
        self.handle.close()
        self.handle = None
        os.replace(self.tmp(), self.path(self.index))
        self.done.append(self.path(self.index))
        self.index = self.index + 1
        self.in_shard = 0
        self.tokens_in_shard = 0

    def close(self) -> list[Path]:
        if self.handle is None and not self.done:
            self.handle = self.open_file(self.tmp())
        if self.handle is not None:
            self._next_file()
        if self.sharded:  # shards of an earlier, larger export to the same name would be read as part of this one
            pattern = re.compile(rf"{re.escape(self.stem)}-\d{{{SHARD_DIGITS}}}{re.escape(self.suffix)}")
            for path in self.folder.iterdir():
                if pattern.fullmatch(path.name) and path not in self.done:
                    path.unlink()
        return list(self.done)

    def abort(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        self.tmp().unlink(missing_ok=True)
        for path in self.done:
            path.unlink(missing_ok=True)


def _learned(filters: ExportFilters, zero_last_loss: bool) -> ExportFilters:
    """With zero_last_loss the zeroed position is not learned: a row needs one more generated id
    to keep min_loss_tokens."""
    return dataclasses.replace(filters, min_loss_tokens=filters.min_loss_tokens + 1) if zero_last_loss else filters


def _fill(
    sinks: dict[str | None, Any],
    result: ExportResult,
    records: Iterable[RawRecord],
    filters: ExportFilters,
    cutoff: int | None,
) -> None:
    """The one pass: selected rows into each split's row groups (ROW_GROUP_ROWS, ROW_GROUP_TOKENS), into its sink."""
    groups: dict[str | None, list[RawRecord]] = {name: [] for name in sinks}
    tokens: dict[str | None, int] = dict.fromkeys(sinks, 0)

    def flush(split: str | None) -> None:
        if not (group := groups[split]):
            return
        sinks[split].add_group(group)
        result.rows += len(group)
        result.tokens += tokens[split]
        result.loss_tokens += sum(row.output_len for row in group)
        if split is not None:
            result.split_rows[split] += len(group)
        groups[split] = []
        tokens[split] = 0

    for split, row in select_rows(records, filters, result.stats, cutoff=cutoff):
        groups[split].append(row)
        tokens[split] += row.prompt_len + row.output_len
        if len(groups[split]) >= ROW_GROUP_ROWS or tokens[split] >= ROW_GROUP_TOKENS:
            flush(split)
    for split in sinks:
        flush(split)


def export_rows(
    records: Iterable[RawRecord],
    out: str | os.PathLike,
    *,
    format: str = "jsonl",
    filters: ExportFilters = ExportFilters(),
    options: OutputOptions = OutputOptions(),
    cutoff: int | None = None,
) -> ExportResult:
    """Export rows from any stream of records (a generator is read once, lazily); parameters as
    export_records', `cutoff` as tools.filters.sample_cutoff finds it over the same records."""
    started = time.perf_counter()
    out = Path(out)
    options.check(format, out)
    filters = _learned(filters, options.zero_last_loss)
    result = ExportResult(format=format, split_rows=dict.fromkeys(filters.split_names, 0))
    splits: tuple[str | None, ...] = filters.split_names or (None,)
    if format in DATASET_FORMATS:
        staging = out.parent / f".{out.name}.staging-{secrets.token_hex(4)}"
        staging.mkdir(parents=True)
        staged: dict[str | None, StagedSplit] = {}
        try:
            for name in splits:
                staged[name] = StagedSplit(staging / f"{name or 'all'}.arrow", speculators=format == "speculators")
            _fill(staged, result, records, filters, cutoff)
            for part in staged.values():
                part.close()
            write_dataset_folder(out, staged, result, options.shard_rows)
        finally:
            for part in staged.values():
                part.close()
            shutil.rmtree(staging, ignore_errors=True)
    else:
        sinks = {name: _FileSink(format, out, name, options) for name in splits}
        try:
            _fill(sinks, result, records, filters, cutoff)
            for sink in sinks.values():
                result.paths += sink.close()
        except BaseException:
            for sink in sinks.values():
                sink.abort()
            raise
        result.largest_file_tokens = max(sink.largest_file_tokens for sink in sinks.values())
    if options.zero_last_loss:
        result.loss_tokens -= result.rows
    result.seconds = time.perf_counter() - started
    return result


def export_records(
    campaign_path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    format: str = "jsonl",
    filters: ExportFilters = ExportFilters(),
    shard_rows: int | None = None,
    progress: Progress | None = None,
    turns: str = "all",
    shard_tokens: int | None = None,
    zero_last_loss: bool = False,
    replace: bool = False,
) -> ExportResult:
    """Export a campaign's records as training rows, streaming, into `out` (a file, a name to number or
    a folder: _FileSink; a folder for datasets formats). `turns` "last": only each `--history own`
    conversation's last turn. shard_rows, shard_tokens, zero_last_loss, replace: OutputOptions'."""
    started = time.perf_counter()
    options = OutputOptions(shard_rows, shard_tokens, zero_last_loss, replace)
    options.check(format, Path(out))
    # sample_cutoff reads nothing (and starts no progress phase) when filters.sample is None.
    sampled = reported(_source(campaign_path, turns, Counter()), progress, "sampling")
    cutoff = sample_cutoff(sampled, _learned(filters, zero_last_loss))
    by_turn: Counter[str] = Counter()
    records = reported(_source(campaign_path, turns, by_turn, grouped=format == "speculators"), progress, "exporting")
    result = export_rows(records, out, format=format, filters=filters, options=options, cutoff=cutoff)
    result.stats.dropped.update(by_turn)
    result.seconds = time.perf_counter() - started
    return result
