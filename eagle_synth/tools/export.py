"""`eagle-synth export`: records to training rows (input_ids, loss_mask, provenance).

Rows stream from the records through a bounded buffer into JSONL or Parquet, so memory stays
flat whatever the campaign's size. Parquet is built from the ids' uint32 bytes without a
Python int per id (RawRecord), which is what makes it fast. Conventions: docs/records.md, "Export".
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from eagle_synth.ids import unpack_ids
from eagle_synth.records import RawRecord, iter_raw_records

FORMATS = ("jsonl", "parquet")
# Rows per Parquet row group (and per JSONL write): big enough for fast scans, small enough for flat memory.
ROW_GROUP_ROWS = 2048
# A row group is also closed once its rows hold this many ids, so long records keep memory flat too.
ROW_GROUP_TOKENS = 8 << 20
# Parquet page compression: zstd reads fast and pyarrow, datasets and Spark all support it.
PARQUET_COMPRESSION = "zstd"
# zstd level of Parquet pages: level 3 is 6% smaller than the default at about the same speed.
PARQUET_COMPRESSION_LEVEL = 3
# Only this column is dictionary-encoded: on id lists a dictionary costs time and grows files by 25%.
PARQUET_DICTIONARY_COLUMNS = ["finish_reason"]
# Digits of the shard index in sharded output names (`out-00000.parquet`).
SHARD_DIGITS = 5
# Columns of an exported row, in order.
COLUMNS = ("key", "id", "sample", "turn", "input_ids", "loss_mask", "prompt_tokens", "completion_tokens",
           "finish_reason")


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

    def reason_to_drop(self, raw: RawRecord) -> str | None:
        """None to keep the record, else the filter that drops it."""
        if self.drop_truncated and raw.meta.get("finish_reason") == "length":
            return "truncated"
        if raw.output_len < self.min_output_tokens:
            return "short_output"
        if self.max_length is not None and raw.prompt_len + raw.output_len > self.max_length:
            return "too_long"
        return None

    def keep(self, raw: RawRecord) -> bool:
        return self.reason_to_drop(raw) is None


@dataclass(slots=True)
class ExportResult:
    """What an export wrote.

    Parameters:
        rows: rows written.
        paths: the output files, in order.
        tokens: ids written (sum of input_ids lengths).
        dropped: records left out, by filter (truncated, short_output, too_long).
        seconds: wall time.
    """

    rows: int = 0
    paths: list[Path] = field(default_factory=list)
    tokens: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def training_row(raw: RawRecord) -> dict:
    """The exported row of one record, with Python lists (docs/records.md, "Export")."""
    meta = raw.meta
    prompt, output = raw.prompt_len, raw.output_len
    return {
        "key": meta["key"],
        "id": str(meta.get("id", "")),
        "sample": int(meta.get("sample", 0)),
        "turn": int(meta.get("turn", 0)),
        "input_ids": unpack_ids(raw.prompt_u32 + raw.output_u32),
        "loss_mask": [0] * prompt + [1] * output,
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "finish_reason": meta.get("finish_reason", ""),
    }


def _source(campaign_path: str | os.PathLike, turns: str, result: ExportResult) -> Iterator[RawRecord]:
    """The records to export: in conversation order for `--history own` campaigns (or `--turns last`)."""
    from eagle_synth.records import read_manifest
    from eagle_synth.tools.conversation_order import ordered_records

    history = (((read_manifest(campaign_path) or {}).get("settings")) or {}).get("history")
    if history != "own" and turns == "all":
        return iter_raw_records(campaign_path)

    def dropped(reason: str) -> None:
        result.dropped[reason] = result.dropped.get(reason, 0) + 1

    return ordered_records(campaign_path, turns=turns, dropped=dropped)


def _kept(campaign_path: str | os.PathLike, filters: ExportFilters, result: ExportResult,
          turns: str = "all") -> Iterator[RawRecord]:
    for raw in _source(campaign_path, turns, result):
        reason = filters.reason_to_drop(raw)
        if reason is None:
            yield raw
        else:
            result.dropped[reason] = result.dropped.get(reason, 0) + 1


def _row_groups(records: Iterator[RawRecord]) -> Iterator[list[RawRecord]]:
    group: list[RawRecord] = []
    tokens = 0
    for raw in records:
        group.append(raw)
        tokens += raw.prompt_len + raw.output_len
        if len(group) >= ROW_GROUP_ROWS or tokens >= ROW_GROUP_TOKENS:
            yield group
            group, tokens = [], 0
    if group:
        yield group


# ----------------------------------------------------------------------------- output files


class _Outputs:
    """Output files: one, or shards of `shard_rows` rows; each appears only when complete.

    `out.parquet` with shards becomes `out-00000.parquet`, `out-00001.parquet`, ...; a
    folder (an existing one, or a name without a suffix) gets `part-00000.<format>`, ...
    """

    def __init__(self, out: Path, *, suffix: str, shard_rows: int | None) -> None:
        self.shard_rows = shard_rows
        if out.is_dir() and not shard_rows:
            raise ValueError(f"--out {out} is a folder: give a file name, or --shard-rows N to write "
                             "part-00000... files into it")
        if shard_rows and (out.is_dir() or not out.suffix):
            out.mkdir(parents=True, exist_ok=True)
            self.folder, self.stem, self.suffix = out, "part", suffix
        else:
            name = out.name
            gz = out.suffix == ".gz" and len(out.suffixes) > 1
            full_suffix = "".join(out.suffixes[-2:]) if gz else (out.suffix or suffix)
            self.folder, self.stem, self.suffix = out.parent, name[: len(name) - len(full_suffix)], full_suffix
        self.single = out
        self.folder.mkdir(parents=True, exist_ok=True)
        self.done: list[Path] = []

    def path(self, index: int) -> Path:
        if not self.shard_rows:
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
        if not self.shard_rows:
            return
        pattern = re.compile(rf"{re.escape(self.stem)}-\d{{{SHARD_DIGITS}}}{re.escape(self.suffix)}")
        for path in self.folder.iterdir():
            if pattern.fullmatch(path.name) and path not in self.done:
                path.unlink()

    def discard(self, index: int) -> None:
        self.tmp(self.path(index)).unlink(missing_ok=True)
        for path in self.done:
            path.unlink(missing_ok=True)


def _shards_of(groups: Iterator[list[RawRecord]], shard_rows: int | None) -> Iterator[tuple[int, list[RawRecord]]]:
    """(shard index, row group) pairs; a row group never spans two shards."""
    if not shard_rows:
        for group in groups:
            yield 0, group
        return
    index, in_shard = 0, 0
    for group in groups:
        while group:
            take = group[: shard_rows - in_shard]
            group = group[len(take):]
            yield index, take
            in_shard += len(take)
            if in_shard >= shard_rows:
                index, in_shard = index + 1, 0


def _open_jsonl(path: Path) -> IO[str]:
    if path.name.endswith(".gz.tmp"):
        return gzip.open(path, "wt", compresslevel=6)
    return open(path, "w")


# ----------------------------------------------------------------------------- parquet


def parquet_schema():
    import pyarrow as pa

    return pa.schema([
        ("key", pa.string()), ("id", pa.string()), ("sample", pa.int32()), ("turn", pa.int32()),
        ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
        ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()), ("finish_reason", pa.string()),
    ])


def _arrow_batch(group: list[RawRecord], schema):
    """One record batch from a row group: the ids' bytes become the list values buffer as they are."""
    import pyarrow as pa

    offsets = array("i", [0])
    total = 0
    for raw in group:
        total += raw.prompt_len + raw.output_len
        offsets.append(total)
    ids = b"".join(raw.prompt_u32 + raw.output_u32 for raw in group)
    if sys.byteorder != "little":
        swapped = array("I")
        swapped.frombytes(ids)
        swapped.byteswap()
        ids = swapped.tobytes()
    mask = b"".join(b"\x00" * raw.prompt_len + b"\x01" * raw.output_len for raw in group)
    offsets_array = pa.array(offsets, type=pa.int32())
    input_ids = pa.ListArray.from_arrays(offsets_array, pa.Array.from_buffers(pa.int32(), total, [None, pa.py_buffer(ids)]))
    loss_mask = pa.ListArray.from_arrays(offsets_array, pa.Array.from_buffers(pa.int8(), total, [None, pa.py_buffer(mask)]))
    metas = [raw.meta for raw in group]
    columns = [
        pa.array([m["key"] for m in metas], pa.string()),
        pa.array([str(m.get("id", "")) for m in metas], pa.string()),
        pa.array([int(m.get("sample", 0)) for m in metas], pa.int32()),
        pa.array([int(m.get("turn", 0)) for m in metas], pa.int32()),
        input_ids, loss_mask,
        pa.array([raw.prompt_len for raw in group], pa.int32()),
        pa.array([raw.output_len for raw in group], pa.int32()),
        pa.array([m.get("finish_reason", "") for m in metas], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _parquet_writer(path: Path, schema):
    import pyarrow.parquet as pq

    return pq.ParquetWriter(path, schema, compression=PARQUET_COMPRESSION,
                            compression_level=PARQUET_COMPRESSION_LEVEL, use_dictionary=PARQUET_DICTIONARY_COLUMNS)


def _write_shards(shards: Iterator[tuple[int, list[RawRecord]]], outputs: _Outputs, result: ExportResult, *,
                  open_file: Callable[[Path], Any], write_group: Callable[[Any, list[RawRecord]], None]) -> None:
    """Write numbered output files from (file index, row group) pairs; each file appears whole
    (temporary name, then published) or not at all. With no rows, one empty file is written
    (a Parquet one still carries the schema, so readers find the columns)."""
    handle, index = None, 0
    try:
        for index_now, group in shards:
            if handle is not None and index_now != index:
                handle.close()
                outputs.publish(index)
                handle = None
            index = index_now
            if handle is None:
                handle = open_file(outputs.tmp(outputs.path(index)))
            write_group(handle, group)
            result.rows += len(group)
            result.tokens += sum(raw.prompt_len + raw.output_len for raw in group)
        if handle is None:
            handle = open_file(outputs.tmp(outputs.path(index)))
        handle.close()
        handle = None
        outputs.publish(index)
    except BaseException:
        if handle is not None:
            handle.close()
        outputs.discard(index)
        raise


def _write_parquet(shards: Iterator[tuple[int, list[RawRecord]]], outputs: _Outputs, result: ExportResult) -> None:
    schema = parquet_schema()
    _write_shards(
        shards, outputs, result,
        open_file=lambda path: _parquet_writer(path, schema),
        write_group=lambda writer, group: writer.write_batch(_arrow_batch(group, schema), row_group_size=len(group)),
    )


def _write_jsonl(shards: Iterator[tuple[int, list[RawRecord]]], outputs: _Outputs, result: ExportResult) -> None:
    _write_shards(
        shards, outputs, result, open_file=_open_jsonl,
        write_group=lambda handle, group: handle.write(
            "".join(json.dumps(training_row(raw), separators=(",", ":")) + "\n" for raw in group)),
    )


def export_records(campaign_path: str | os.PathLike, out: str | os.PathLike, *, format: str = "jsonl",
                   filters: ExportFilters = ExportFilters(), shard_rows: int | None = None,
                   turns: str = "all") -> ExportResult:
    """Export a campaign's records as training rows; streams, so memory stays flat.

    Parameters:
        campaign_path: the campaign folder (OUT/<campaign>).
        out: output file (`.jsonl`, `.jsonl.gz` or `.parquet`), or with shard_rows a file name
            to number (`out-00000.parquet`) or a folder (`part-00000.parquet`).
        format: "jsonl" or "parquet".
        filters: which records to keep.
        shard_rows: rows per output file (None: one file).
        turns: "all", or "last" for only the last turn of each `--history own` conversation;
            such campaigns are written in conversation order (turns together, in order).
    """
    if format not in FORMATS:
        raise ValueError(f"--format {format!r}: use one of {', '.join(FORMATS)}")
    if shard_rows is not None and shard_rows < 1:
        raise ValueError("--shard-rows must be at least 1")
    started = time.perf_counter()
    result = ExportResult()
    outputs = _Outputs(Path(out), suffix=f".{format}", shard_rows=shard_rows)
    if turns not in ("all", "last"):
        raise ValueError(f"--turns {turns!r}: use all or last")
    shards = _shards_of(_row_groups(_kept(campaign_path, filters, result, turns)), shard_rows)
    (_write_parquet if format == "parquet" else _write_jsonl)(shards, outputs, result)
    outputs.remove_stale_shards()
    result.paths = list(outputs.done)
    result.seconds = time.perf_counter() - started
    return result


def export_jsonl(campaign_path: str | os.PathLike, out: str | os.PathLike, *,
                 filters: ExportFilters = ExportFilters()) -> int:
    """Write one JSON object per line and per kept record; returns rows written."""
    return export_records(campaign_path, out, format="jsonl", filters=filters).rows
