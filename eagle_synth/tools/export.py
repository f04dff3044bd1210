"""`eagle-synth export`: records to training rows, in the formats the drafter trainers read.

Records stream through the filters (tools/filters.py: clip, drop, sample, split) in one pass,
into row groups bounded in rows and ids, into the output files of each split: memory stays
flat whatever the campaign's size. Parquet and the datasets folders are built from the ids'
uint32 bytes without a Python int per id (RawRecord), which is what makes them fast.
Formats: jsonl, parquet (tools/export_rows.py: every Record field), specforge, speculators,
hf (tools/trainer_formats.py). Conventions: docs/records.md, "Export".
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from eagle_synth.errors import UserError
from eagle_synth.progress import Progress, reported
from eagle_synth.records import RawRecord, iter_raw_records
from eagle_synth.tools.export_rows import arrow_batch, arrow_schema, column_names, json_row
from eagle_synth.tools.filters import ExportError, ExportFilters, SelectionStats, sample_cutoff, select_rows
from eagle_synth.tools.trainer_formats import (
    DATASET_FORMATS,
    SPECULATORS_COLUMNS,
    StagedSplit,
    check_dataset_out,
    require_datasets,
    specforge_lines,
    write_dataset_folder,
)

__all__ = ["ExportFilters", "ExportResult", "FORMATS", "OutputOptions", "export_records", "export_rows"]

FORMATS = ("jsonl", "parquet", "specforge", "speculators", "hf")
# Rows per Parquet row group (and per JSONL write): big enough for fast scans, small enough for flat memory.
ROW_GROUP_ROWS = 2048
# A row group is also closed once its rows hold this many ids, so long records keep memory flat too.
ROW_GROUP_TOKENS = 8 << 20
# Parquet page compression: zstd reads fast and pyarrow, datasets and Spark all support it.
PARQUET_COMPRESSION = "zstd"
# zstd level of Parquet pages: level 3 is 6% smaller than the default at about the same speed.
PARQUET_COMPRESSION_LEVEL = 3
# Only these columns are dictionary-encoded: few distinct values each; on id lists a dictionary
# costs time and grows files by 25%.
PARQUET_DICTIONARY_COLUMNS = ["finish_reason", "finish_matched", "campaign", "server", "worker"]
# Digits of the shard index in sharded output names (`out-00000.parquet`).
SHARD_DIGITS = 5
# Columns of a jsonl / parquet / hf row, in order: every Record field (tools/export_rows.py).
COLUMNS = column_names()
# Bytes SpecForge holds per pre-tokenized token: it keeps each row as Python lists of ints
# (data/prompt_builder.py:199-252 at a6b6b02): an 8-byte list slot plus a 28-byte int object per
# id, an 8-byte slot per mask entry (0 and 1 are shared objects). Measured: 44.0
# (tests/test_trainer_exports.py::test_specforge_holds_about_44_bytes_per_token).
SPECFORGE_BYTES_PER_TOKEN = 44


@dataclass(slots=True)
class ExportResult:
    """What an export wrote: rows and ids (`tokens`, `loss_tokens` mask-1) of all splits, the
    output files (datasets formats: folders) in order, and SelectionStats' read / dropped / clipped.

    Parameters:
        split_rows: rows per split (empty when not splitting).
        warnings, commands: what the user should know (a trainer file that could not be
            written), and without torch the one-line commands that make the missing torch files.
        train_data_ratio: speculators: per split name ("all" when not splitting), the
            --train-data-ratio nearest 0.9 whose validation cut falls between input rows.
        largest_file_tokens: jsonl / parquet / specforge: ids in the largest output file (what
            one SpecForge run over it holds in memory, times SPECFORGE_BYTES_PER_TOKEN).
    """

    format: str = "jsonl"
    rows: int = 0
    paths: list[Path] = field(default_factory=list)
    tokens: int = 0
    loss_tokens: int = 0
    read: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    clipped: int = 0
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
        """The `--json` summary."""
        return {
            "format": self.format,
            "rows": self.rows,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "read": self.read,
            "dropped": self.dropped,
            "clipped": self.clipped,
            "splits": self.split_rows,
            "paths": [str(p) for p in self.paths],
            "warnings": self.warnings,
            "commands": self.commands,
            **({"train_data_ratio": self.train_data_ratio} if self.format == "speculators" else {}),
            **(
                {
                    "largest_file_tokens": self.largest_file_tokens,
                    "specforge_memory_bytes": self.largest_file_tokens * SPECFORGE_BYTES_PER_TOKEN,
                }
                if self.format == "specforge"
                else {}
            ),
            "seconds": round(self.seconds, 3),
            "tokens_per_s": round(self.tokens_per_s),
        }


def _source(
    campaign_path: str | os.PathLike, turns: str, dropped: dict[str, int], *, grouped: bool = False
) -> Iterator[RawRecord]:
    """The records to export: in conversation order for `--history own` campaigns (or `turns`
    "last"); with `grouped` (speculators) every campaign's conversations together, ordered by
    the hash of their key; records a `turns` choice leaves out are counted in `dropped`."""
    from eagle_synth.records import read_manifest
    from eagle_synth.tools.conversation_order import grouped_records, ordered_records

    if turns not in ("all", "last"):
        raise UserError(f"turns {turns!r}: use all or last")

    def count(reason: str) -> None:
        dropped[reason] = dropped.get(reason, 0) + 1

    if grouped:
        return grouped_records(campaign_path, turns=turns, dropped=count)
    history = (((read_manifest(campaign_path) or {}).get("settings")) or {}).get("history")
    if history != "own" and turns == "all":
        return iter_raw_records(campaign_path)
    return ordered_records(campaign_path, turns=turns, dropped=count)


# ----------------------------------------------------------------------------- output files


class _Outputs:
    """Output file names of one split: one file, or shards of `shard_rows` rows.

    `out.parquet` with shards becomes `out-00000.parquet`, `out-00001.parquet`, ...; a
    folder (an existing one, or a name without a suffix) gets `part-00000.<format>`, ...
    A split adds its name: `out-test.parquet`, `out-test-00000.parquet`, or `test-00000...`
    in a folder (the names `datasets.load_dataset` maps to splits by itself).
    """

    def __init__(self, out: Path, *, suffix: str, sharded: bool, split: str | None = None) -> None:
        self.sharded = sharded
        if out.is_dir() and not sharded:
            raise ExportError(
                f"--out {out} is a folder: give a file name, or --shard-rows N to write part-00000... files into it"
            )
        if sharded and (out.is_dir() or not out.suffix):
            self.folder, self.stem, self.suffix = out, split or "part", suffix
        else:
            name = out.name
            gz = out.suffix == ".gz" and len(out.suffixes) > 1
            full_suffix = "".join(out.suffixes[-2:]) if gz else (out.suffix or suffix)
            stem = name[: len(name) - len(full_suffix)]
            self.folder, self.stem, self.suffix = out.parent, f"{stem}-{split}" if split else stem, full_suffix
        self.single = out if split is None else self.folder / f"{self.stem}{self.suffix}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.done: list[Path] = []

    def path(self, index: int) -> Path:
        if not self.sharded:
            return self.single
        return self.folder / f"{self.stem}-{index:0{SHARD_DIGITS}d}{self.suffix}"

    @staticmethod
    def tmp(path: Path) -> Path:
        return path.with_name(f".{path.name}.tmp")

    def publish(self, index: int) -> None:
        path = self.path(index)
        os.replace(self.tmp(path), path)
        self.done.append(path)

    def remove_stale_shards(self) -> None:
        """Shards of an earlier, larger export to the same name would be read as part of this one."""
        if not self.sharded:
            return
        pattern = re.compile(rf"{re.escape(self.stem)}-\d{{{SHARD_DIGITS}}}{re.escape(self.suffix)}")
        for path in self.folder.iterdir():
            if pattern.fullmatch(path.name) and path not in self.done:
                path.unlink()

    def discard(self, index: int) -> None:
        self.tmp(self.path(index)).unlink(missing_ok=True)
        for path in self.done:
            path.unlink(missing_ok=True)


class _FileSink:
    """Writes one split's row groups into its numbered files; each appears whole or not at all.

    A file is closed at `shard_rows` rows, or before a row that would take it past
    `shard_tokens` ids (a longer row gets a file of its own). With no rows, one empty file is
    written (a Parquet one still carries the schema, so readers find the columns).
    """

    def __init__(
        self,
        outputs: _Outputs,
        *,
        open_file: Callable[[Path], Any],
        write_group: Callable[[Any, list[RawRecord]], None],
        options: OutputOptions,
    ) -> None:
        self.outputs = outputs
        self._open_file = open_file
        self._write_group = write_group
        self._shard_rows = options.shard_rows
        self._shard_tokens = options.shard_tokens
        self._handle: Any = None
        self._index = 0
        self._in_shard = 0
        self._tokens_in_shard = 0
        self.largest_file_tokens = 0

    def _fitting(self, group: list[RawRecord]) -> int:
        """How many of the group's first rows go into the current file."""
        room = len(group) if not self._shard_rows else min(len(group), self._shard_rows - self._in_shard)
        if not self._shard_tokens:
            return room
        tokens = self._tokens_in_shard
        for n, raw in enumerate(group[:room]):
            tokens += raw.prompt_len + raw.output_len
            if tokens > self._shard_tokens and (n or self._in_shard):
                return n
        return room

    def add_group(self, group: list[RawRecord]) -> None:
        while group:
            count = self._fitting(group)
            if count == 0:
                self._next_file()
                continue
            take, group = group[:count], group[count:]
            if self._handle is None:
                self._open()
            self._write_group(self._handle, take)
            self._in_shard += len(take)
            self._tokens_in_shard += sum(raw.prompt_len + raw.output_len for raw in take)
            self.largest_file_tokens = max(self.largest_file_tokens, self._tokens_in_shard)
            if self._shard_rows and self._in_shard >= self._shard_rows:
                self._next_file()

    def _open(self) -> None:
        self._handle = self._open_file(self.outputs.tmp(self.outputs.path(self._index)))

    def _next_file(self) -> None:
        self._publish()
        self._index, self._in_shard, self._tokens_in_shard = self._index + 1, 0, 0

    def _publish(self) -> None:
        self._handle.close()
        self._handle = None
        self.outputs.publish(self._index)

    def close(self) -> list[Path]:
        if self._handle is None and not self.outputs.done:
            self._open()
        if self._handle is not None:
            self._publish()
        self.outputs.remove_stale_shards()
        return list(self.outputs.done)

    def abort(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self.outputs.discard(self._index)


def _open_jsonl(path: Path) -> IO[str]:
    if path.name.endswith(".gz.tmp"):
        return gzip.open(path, "wt", compresslevel=6, encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def _parquet_writer(path: Path, schema):
    import pyarrow.parquet as pq

    return pq.ParquetWriter(
        path,
        schema,
        compression=PARQUET_COMPRESSION,
        compression_level=PARQUET_COMPRESSION_LEVEL,
        use_dictionary=PARQUET_DICTIONARY_COLUMNS,
    )


def _file_sink(format: str, out: Path, split: str | None, options: OutputOptions) -> _FileSink:
    outputs = _Outputs(
        out,
        suffix=".parquet" if format == "parquet" else ".jsonl",
        sharded=bool(options.shard_rows or options.shard_tokens),
        split=split,
    )
    if format == "parquet":
        schema = arrow_schema()
        return _FileSink(
            outputs,
            open_file=lambda path: _parquet_writer(path, schema),
            write_group=lambda writer, group: writer.write_batch(arrow_batch(group, schema), row_group_size=len(group)),
            options=options,
        )
    if format == "specforge":
        return _FileSink(
            outputs,
            open_file=lambda path: open(path, "w", encoding="utf-8"),
            write_group=lambda handle, group: handle.write(
                specforge_lines(group, zero_last_loss=True) if options.zero_last_loss else specforge_lines(group)
            ),
            options=options,
        )
    return _FileSink(
        outputs,
        open_file=_open_jsonl,
        write_group=lambda handle, group: handle.write(
            "".join(json.dumps(json_row(raw), separators=(",", ":"), ensure_ascii=False) + "\n" for raw in group)
        ),
        options=options,
    )


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """How the output is written (what rows there are is ExportFilters').

    Parameters:
        shard_rows: rows per output file (None: one file; datasets formats: datasets' default).
        shard_tokens: jsonl / parquet / specforge: at most this many ids per output file (a
            longer row gets a file of its own), so one SpecForge run per file stays under a
            memory budget (SPECFORGE_BYTES_PER_TOKEN each).
        zero_last_loss: specforge: set each row's last loss_mask entry to 0 (EAGLE-3 online
            runs before upstream SpecForge #895; not DFlash).
        replace: speculators / hf: replace an --out folder even if it holds files an export did
            not write (hidden_states/, d2t.npy, vocab files).
    """

    shard_rows: int | None = None
    shard_tokens: int | None = None
    zero_last_loss: bool = False
    replace: bool = False


def _check_options(format: str, out: Path, options: OutputOptions) -> None:
    if format not in FORMATS:
        raise ExportError(f"--format {format!r}: use one of {', '.join(FORMATS)}")
    if options.shard_rows is not None and options.shard_rows < 1:
        raise ExportError("--shard-rows must be at least 1")
    if options.shard_tokens is not None and options.shard_tokens < 1:
        raise ExportError("--shard-tokens must be at least 1")
    if options.zero_last_loss and format != "specforge":
        raise ExportError("--zero-last-loss is for --format specforge (SpecForge's EAGLE-3 online target shift)")
    if format == "specforge" and out.name.endswith(".gz"):
        raise ExportError("--format specforge: SpecForge opens data.prompts_path as plain text; drop the .gz")
    if format in DATASET_FORMATS:
        if options.shard_tokens:
            raise ExportError(f"--shard-tokens is for file formats; --format {format} takes --shard-rows")
        require_datasets(format)
        check_dataset_out(out, replace=options.replace)


# ----------------------------------------------------------------------------- the export


def _learned(filters: ExportFilters, zero_last_loss: bool) -> ExportFilters:
    """With zero_last_loss the zeroed position is not learned: a row needs one more generated id
    to keep min_loss_tokens."""
    return dataclasses.replace(filters, min_loss_tokens=filters.min_loss_tokens + 1) if zero_last_loss else filters


class _Groups:
    """Buffers each split's rows into row groups of at most ROW_GROUP_ROWS rows or ROW_GROUP_TOKENS ids."""

    def __init__(self, sinks: dict[str | None, Any], result: ExportResult) -> None:
        self.sinks = sinks
        self.result = result
        self._rows: dict[str | None, list[RawRecord]] = {name: [] for name in sinks}
        self._tokens: dict[str | None, int] = dict.fromkeys(sinks, 0)

    def add(self, split: str | None, row: RawRecord) -> None:
        group = self._rows[split]
        group.append(row)
        self._tokens[split] += row.prompt_len + row.output_len
        if len(group) >= ROW_GROUP_ROWS or self._tokens[split] >= ROW_GROUP_TOKENS:
            self.flush(split)

    def flush(self, split: str | None) -> None:
        group = self._rows[split]
        if not group:
            return
        self.sinks[split].add_group(group)
        self.result.rows += len(group)
        self.result.tokens += self._tokens[split]
        self.result.loss_tokens += sum(row.output_len for row in group)
        if split is not None:
            self.result.split_rows[split] = self.result.split_rows.get(split, 0) + len(group)
        self._rows[split], self._tokens[split] = [], 0

    def fill(self, records: Iterable[RawRecord], filters: ExportFilters, stats: SelectionStats, cutoff: int | None):
        """The one pass: records through the filters, into row groups, into each split's sink."""
        for split, row in select_rows(records, filters, stats, cutoff=cutoff):
            self.add(split, row)
        for split in self.sinks:
            self.flush(split)


def export_rows(
    records: Iterable[RawRecord],
    out: str | os.PathLike,
    *,
    format: str = "jsonl",
    filters: ExportFilters = ExportFilters(),
    shard_rows: int | None = None,
    cutoff: int | None = None,
    shard_tokens: int | None = None,
    zero_last_loss: bool = False,
    replace: bool = False,
) -> ExportResult:
    """Export rows from any stream of records (a generator is read once, lazily).

    Parameters are export_records'; `cutoff` is the one tools.filters.sample_cutoff finds
    for filters.sample over the same records (None keeps every candidate).
    """
    started = time.perf_counter()
    out = Path(out)
    options = OutputOptions(
        shard_rows=shard_rows, shard_tokens=shard_tokens, zero_last_loss=zero_last_loss, replace=replace
    )
    _check_options(format, out, options)
    filters = _learned(filters, zero_last_loss)
    result = ExportResult(format=format)
    splits: tuple[str | None, ...] = filters.split_names or (None,)
    stats = SelectionStats()
    if format in DATASET_FORMATS:
        staging = out.parent / f".{out.name}.staging-{secrets.token_hex(4)}"
        staging.mkdir(parents=True)
        staged: dict[str | None, StagedSplit] = {}
        try:
            for name in splits:
                staged[name] = StagedSplit(
                    staging / f"{name or 'all'}.arrow",
                    count_tokens=format == "speculators",
                    selected=SPECULATORS_COLUMNS if format == "speculators" else None,
                )
            _Groups(staged, result).fill(records, filters, stats, cutoff)
            for part in staged.values():
                part.close()
            write_dataset_folder(out, staged, result, shard_rows)
        finally:
            for part in staged.values():
                part.close()
            shutil.rmtree(staging, ignore_errors=True)
    else:
        sinks = {name: _file_sink(format, out, name, options) for name in splits}
        try:
            _Groups(sinks, result).fill(records, filters, stats, cutoff)
            for sink in sinks.values():
                result.paths += sink.close()
        except BaseException:
            for sink in sinks.values():
                sink.abort()
            raise
        result.largest_file_tokens = max(sink.largest_file_tokens for sink in sinks.values())
    if zero_last_loss:
        result.loss_tokens -= result.rows
    result.read, result.dropped, result.clipped = stats.read, stats.dropped, stats.clipped
    if filters.splits:
        result.split_rows = {name: result.split_rows.get(name, 0) for name in filters.split_names}
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
    """Export a campaign's records as training rows; streams, so memory stays flat.

    Parameters:
        out: jsonl / parquet / specforge: output file (`.jsonl`, `.jsonl.gz` or `.parquet`),
            or with shard_rows / shard_tokens a file name to number (`out-00000.parquet`) or a
            folder (`part-00000.parquet`); with splits each file name gains `-<split>`.
            speculators / hf: a folder (replaced if it holds only an earlier export).
        progress: told the phase and the records read as the export goes.
        turns: "all", or "last" for only the last turn of each `--history own` conversation;
            such campaigns are written in conversation order (turns together, in order).
        shard_rows, shard_tokens, zero_last_loss, replace: OutputOptions'.
    """
    started = time.perf_counter()
    _check_options(
        format,
        Path(out),
        OutputOptions(shard_rows=shard_rows, shard_tokens=shard_tokens, zero_last_loss=zero_last_loss, replace=replace),
    )
    cutoff = None
    by_turn: dict[str, int] = {}
    if filters.sample is not None:
        sampled = reported(_source(campaign_path, turns, {}), progress, "sampling")
        cutoff = sample_cutoff(sampled, _learned(filters, zero_last_loss))
    records = reported(_source(campaign_path, turns, by_turn, grouped=format == "speculators"), progress, "exporting")
    result = export_rows(
        records,
        out,
        format=format,
        filters=filters,
        shard_rows=shard_rows,
        cutoff=cutoff,
        shard_tokens=shard_tokens,
        zero_last_loss=zero_last_loss,
        replace=replace,
    )
    for reason, count in by_turn.items():
        result.dropped[reason] = result.dropped.get(reason, 0) + count
    result.seconds = time.perf_counter() - started
    return result
