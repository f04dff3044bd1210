"""Streaming readers for prompt-set inputs.

Turns input paths into a stream of parsed rows (``SourceRow``) and per-row
failures (``BadRow``) without ever holding a whole file in memory.  Fatal
problems that make an input unusable before reading starts (missing path,
unknown format) raise ``InputError``.

Supported inputs (see docs/inputs.md):

* JSONL: ``.jsonl`` / ``.ndjson``, optionally ``.gz`` or ``.zst`` compressed;
* JSON: ``.json`` (optionally compressed) holding either one array of objects
  (streamed with ijson) or JSONL, decided by the first non-space character;
* Parquet: ``.parquet``;
* a directory written by ``datasets.Dataset.save_to_disk`` (``state.json`` +
  ``.arrow`` shards) or ``DatasetDict.save_to_disk`` (``dataset_dict.json`` +
  one such directory per split);
* ``-``: JSONL on standard input.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import sys
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

import ijson
import zstandard

from eagle_synth.errors import UserError

STDIN = "-"  # the path that means "JSONL on standard input"

PARQUET_BATCH_ROWS = 1024  # rows decoded per parquet batch: bounds memory without per-batch overhead dominating
ARROW_SLICE_ROWS = 1024  # rows turned into python dicts at once from one arrow record batch of any size
SNIFF_CHUNK_BYTES = 64 * 1024  # read size while looking for the first non-space byte of a .json file
ZSTD_READ_BYTES = 64 * 1024  # compressed bytes fed to the zstd decoder per step; output per step is ratio-bound

# BadRow.reason slugs.  Stable: callers count and report by them.
BAD_JSON = "bad-json"
NOT_AN_OBJECT = "not-an-object"
NON_UTF8 = "non-utf8"
TRUNCATED_FILE = "truncated-file"
UNREADABLE_FILE = "unreadable-file"
UNSUPPORTED_LAYOUT = "unsupported-layout"

_JSON_WHITESPACE = b" \t\r\n"
_UTF8_BOM = b"\xef\xbb\xbf"
_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_SUPPORTED_HINT = (
    ".jsonl/.ndjson/.json (optionally .gz or .zst), .parquet, a datasets.save_to_disk "
    "directory, or '-' for JSONL on stdin"
)
# Errors that mean "the bytes could not be read/decoded", as opposed to bad row content.
_READ_ERRORS: tuple[type[BaseException], ...] = (OSError, zlib.error)


class InputError(UserError):
    """An input cannot be used at all; the message names it and says what to do."""


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One row as a dict; `source` as given ("-": stdin, "<dir>/<split>": a DatasetDict split);
    `line` 1-based: the physical line of JSONL, the row index otherwise."""

    source: str
    line: int
    data: dict


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row, or the rest of a file, that could not be parsed; ``line`` 0 is the whole file."""

    source: str
    line: int
    reason: str  # stable slug, see the module constants and docs/inputs.md
    detail: str  # human message


# Input kinds (_detect): "json" is an array or JSONL, decided by sniffing.
STDIN_KIND, JSONL, JSON, PARQUET, HF_DATASET, HF_DATASET_DICT = "stdin", "jsonl", "json", "parquet", "hf", "hf-dict"
# What _detect says of an input: its kind and compression ("gzip", "zstd" or None).
_Spec = tuple[str, str | None]


# --------------------------------------------------------------------------- discovery


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """The inputs to read: ``"-"``, an existing path (as given, glob characters and all), or a
    glob's sorted matches (``**`` allowed; files and saved datasets, not other folders); the
    same real path once. Raises InputError for no pattern, a pattern matching nothing, a
    missing path or an unsupported format (each input's format is checked)."""
    if not patterns:
        raise InputError(
            f"no inputs given; pass one or more files, globs, dataset directories or '-' ({_SUPPORTED_HINT})"
        )
    out: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        if pattern == STDIN or os.path.exists(pattern):
            matches = [pattern]
        elif _has_glob_magic(pattern):
            matches = sorted(m for m in glob.glob(pattern, recursive=True) if os.path.isfile(m) or _is_dataset_dir(m))
            if not matches:
                raise InputError(
                    f"{pattern}: pattern matched no input files; check the pattern and quote it so the shell does not expand it"
                )
        else:
            raise InputError(f"{pattern}: no such file or directory; check the path")
        for match in matches:
            _detect(match)
            key = match if match == STDIN else os.path.realpath(match)
            if key not in seen:
                seen.add(key)
                out.append(match)
    return out


def source_fingerprint(path: str) -> str:
    """Cheap identity of an input: ``"<name>:<size>:<mtime_ns>"`` for a file,
    ``"<name>:dir:<count>:<size>:<newest mtime_ns>"`` for a dataset folder, ``"-"`` for stdin.
    Content is not hashed. Raises InputError if the path cannot be stat'ed."""
    if path == STDIN:
        return STDIN
    name = os.path.basename(os.path.normpath(path))
    try:
        st = os.stat(path)
        if not os.path.isdir(path):
            return f"{name}:{st.st_size}:{st.st_mtime_ns}"
        count = size = 0
        newest = st.st_mtime_ns
        for root, _dirs, files in os.walk(path):
            for filename in files:
                fst = os.stat(os.path.join(root, filename))
                count += 1
                size += fst.st_size
                newest = max(newest, fst.st_mtime_ns)
        return f"{name}:dir:{count}:{size}:{newest}"
    except OSError as exc:
        raise InputError(
            f"{path}: cannot fingerprint input ({exc.strerror or exc}); check it still exists and is readable"
        ) from exc


def _has_glob_magic(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _is_dataset_dir(path: str) -> bool:
    return os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, "dataset_dict.json")) or os.path.isfile(os.path.join(path, "state.json"))
    )


def _detect(path: str) -> _Spec:
    """Decide how to read ``path``; raise InputError if it cannot be read at all."""
    if path == STDIN:
        return STDIN_KIND, None
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "dataset_dict.json")):
            return HF_DATASET_DICT, None
        if os.path.isfile(os.path.join(path, "state.json")):
            return HF_DATASET, None
        raise InputError(
            f"{path}: directory is not a saved Hugging Face dataset (no state.json or dataset_dict.json); "
            f"pass its files or a glob such as '{os.path.join(path, '*.jsonl')}'"
        )
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file; check the path")
    stem, ext = os.path.splitext(os.path.basename(path).lower())
    compression = _COMPRESSION_SUFFIXES.get(ext)
    if compression is not None:
        stem, ext = os.path.splitext(stem)
    if ext in _JSONL_SUFFIXES:
        kind = JSONL
    elif ext == ".json":
        kind = JSON
    elif ext == ".parquet":
        if compression is not None:
            raise InputError(
                f"{path}: compressed parquet is not supported (parquet compresses internally); decompress it first"
            )
        kind = PARQUET
    else:
        raise InputError(f"{path}: unknown input format '{ext or '(no extension)'}'; supported: {_SUPPORTED_HINT}")
    return kind, compression


# --------------------------------------------------------------------------- reading


def iter_source_rows(paths: Sequence[str], *, stdin: IO[bytes] | None = None) -> Iterator[SourceRow | BadRow]:
    """Every row of ``paths``, in order, as SourceRow or BadRow.

    Every path is checked first (InputError now, not after hours of work); problems met while
    reading become BadRows (a file cut mid-way yields its rows before the cut, then one
    BadRow). ``stdin`` replaces ``sys.stdin.buffer`` for ``"-"`` and is never closed. Memory
    stays bounded by one line, one array element or one record batch.
    """
    plan = [(path, _detect(path)) for path in paths]
    return _iter_plan(plan, stdin)


def _iter_plan(plan: list[tuple[str, _Spec]], stdin: IO[bytes] | None) -> Iterator[SourceRow | BadRow]:
    for path, (kind, compression) in plan:
        if kind == STDIN_KIND:
            yield from _iter_jsonl(stdin if stdin is not None else sys.stdin.buffer, STDIN)
        elif kind == JSONL:
            yield from _with_opened(path, compression, _iter_jsonl)
        elif kind == JSON:
            yield from _iter_json_file(path, compression)
        elif kind == PARQUET:
            yield from _iter_parquet(path)
        elif kind == HF_DATASET:
            yield from _iter_hf_dataset(path, path)
        else:
            yield from _iter_hf_dataset_dict(path)


def _open_bytes(path: str, compression: str | None) -> IO[bytes]:
    if compression == "gzip":
        return cast(IO[bytes], gzip.open(path, "rb"))  # a binary file object; typeshed types it apart
    raw = open(path, "rb")
    if compression == "zstd":
        return io.BufferedReader(_ZstdReader(raw))
    return raw


def _with_opened(
    path: str, compression: str | None, reader: Callable[..., Iterator[SourceRow | BadRow]], *args: object
) -> Iterator[SourceRow | BadRow]:
    try:
        stream = _open_bytes(path, compression)
    except OSError as exc:
        yield BadRow(path, 0, UNREADABLE_FILE, f"cannot open: {exc.strerror or exc}")
        return
    with stream:
        yield from reader(stream, path, *args)


class _ZstdReader(io.RawIOBase):
    """Raw zstd decoder over a file, raising EOFError (as gzip does) on a stream cut mid-frame:
    ``stream_reader`` returns a silent EOF there, which would hide lost rows. Decodes
    concatenated frames."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self._raw = raw
        self._decoder: Any = None  # a zstandard decompressobj
        self._out = b""
        self._pos = 0
        self._done = False
        self._error: OSError | None = None  # raised once the rows decoded before it are consumed

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._pos >= len(self._out):
            if self._done:
                return 0
            self._out, self._pos = self._decode_step(), 0
        n = min(len(buffer), len(self._out) - self._pos)
        buffer[:n] = memoryview(self._out)[self._pos : self._pos + n]
        self._pos += n
        return n

    def _decode_step(self) -> bytes:
        if self._error is not None:
            self._done = True
            raise self._error
        chunk = self._raw.read(ZSTD_READ_BYTES)
        if not chunk:
            self._done = True
            if self._decoder is not None and not self._decoder.eof:
                raise EOFError("zstd stream ended before the end of its last frame")
            return b""
        parts = []
        try:
            while chunk:
                if self._decoder is None or self._decoder.eof:
                    self._decoder = zstandard.ZstdDecompressor().decompressobj()
                parts.append(self._decoder.decompress(chunk))
                chunk = self._decoder.unused_data if self._decoder.eof else b""
        except zstandard.ZstdError as exc:
            self._error = OSError(f"corrupt zstd data: {exc}")
            self._error.__cause__ = exc
        if self._error is not None and not parts:
            self._done = True
            raise self._error
        return b"".join(parts)

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def _iter_jsonl(stream: IO[bytes], source: str) -> Iterator[SourceRow | BadRow]:
    """JSONL from a byte stream, one line at a time; blank lines are skipped."""
    lines = iter(stream)
    lineno = 0
    unterminated: bytes | None = None  # a line without "\n" can only be the last one
    while True:
        try:
            raw = next(lines, None)
        except EOFError as exc:
            at = lineno if unterminated is not None else lineno + 1
            yield BadRow(source, at, TRUNCATED_FILE, f"input ends early at line {at} ({exc}); earlier rows were read")
            return
        except _READ_ERRORS as exc:
            at = lineno if unterminated is not None else lineno + 1
            yield BadRow(source, at, UNREADABLE_FILE, f"read failed at line {at}: {exc}; earlier rows were read")
            return
        if raw is None:
            break
        lineno += 1
        if not raw.endswith(b"\n"):
            unterminated = raw
            continue
        row = _parse_line(raw, source, lineno, last_unterminated=False)
        if row is not None:
            yield row
    if unterminated is not None:
        row = _parse_line(unterminated, source, lineno, last_unterminated=True)
        if row is not None:
            yield row


def _parse_line(raw: bytes, source: str, lineno: int, *, last_unterminated: bool) -> SourceRow | BadRow | None:
    if lineno == 1 and raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if last_unterminated:
            return BadRow(
                source,
                lineno,
                TRUNCATED_FILE,
                f"last line has no newline and is cut inside a UTF-8 character ({exc.reason})",
            )
        return BadRow(source, lineno, NON_UTF8, f"invalid UTF-8 at byte {exc.start}: {exc.reason}")
    try:
        value = json.loads(text)
    except RecursionError:
        return BadRow(source, lineno, BAD_JSON, "JSON nested too deeply to parse")
    except ValueError as exc:  # JSONDecodeError, and int-size limits which json reports as plain ValueError
        message = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        if last_unterminated:
            return BadRow(source, lineno, TRUNCATED_FILE, f"last line has no newline and does not parse ({message})")
        return BadRow(source, lineno, BAD_JSON, message)
    if not isinstance(value, dict):
        return BadRow(source, lineno, NOT_AN_OBJECT, f"expected a JSON object, got {_json_type(value)}")
    return SourceRow(source, lineno, value)


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _iter_json_file(path: str, compression: str | None) -> Iterator[SourceRow | BadRow]:
    """A .json file: an array of objects, or JSONL under a .json name."""
    try:
        with _open_bytes(path, compression) as stream:
            first, has_bom = _sniff(stream)
    except EOFError as exc:
        yield BadRow(path, 0, TRUNCATED_FILE, f"input ends before any JSON ({exc})")
        return
    except _READ_ERRORS as exc:
        yield BadRow(path, 0, UNREADABLE_FILE, f"cannot read: {exc}")
        return
    if first == b"[":
        yield from _with_opened(path, compression, _iter_json_array, has_bom)
    elif first:
        yield from _with_opened(path, compression, _iter_jsonl_in_json_file)


def _sniff(stream: IO[bytes]) -> tuple[bytes, bool]:
    """Return the first non-whitespace byte (b"" if none) and whether a BOM leads."""
    has_bom = False
    first_chunk = True
    while chunk := stream.read(SNIFF_CHUNK_BYTES):
        if first_chunk and chunk.startswith(_UTF8_BOM):
            has_bom, chunk = True, chunk[len(_UTF8_BOM) :]
        first_chunk = False
        stripped = chunk.lstrip(_JSON_WHITESPACE)
        if stripped:
            return stripped[:1], has_bom
    return b"", has_bom


def _iter_jsonl_in_json_file(stream: IO[bytes], source: str) -> Iterator[SourceRow | BadRow]:
    # A .json file that starts with "{" but whose first line is not a whole
    # object is almost surely one pretty-printed object; reading it as JSONL
    # would report every line as bad-json, so report the layout once instead.
    first = True
    for item in _iter_jsonl(stream, source):
        if first and isinstance(item, BadRow) and item.reason == BAD_JSON:
            yield BadRow(
                source,
                item.line,
                UNSUPPORTED_LAYOUT,
                "file starts with '{' but its first line is not a complete JSON object; "
                "expected a JSON array of objects or one object per line (JSONL)",
            )
            return
        first = False
        yield item


def _iter_json_array(stream: IO[bytes], source: str, has_bom: bool) -> Iterator[SourceRow | BadRow]:
    if has_bom:
        stream.read(len(_UTF8_BOM))
    items = ijson.items(stream, "item", use_float=True)
    index = 0
    while True:
        try:
            value = next(items, _END)
        except EOFError as exc:
            yield BadRow(
                source,
                index + 1,
                TRUNCATED_FILE,
                f"input ends early at element {index + 1} ({exc}); earlier rows were read",
            )
            return
        except ijson.JSONError as exc:
            message = _ijson_message(exc)
            if "premature EOF" in message or "Incomplete JSON" in message:
                reason = TRUNCATED_FILE
            elif "UTF8" in message or "UTF-8" in message:
                reason = NON_UTF8
            else:
                reason = BAD_JSON
            yield BadRow(
                source, index + 1, reason, f"{message} (at or after element {index + 1}); earlier rows were read"
            )
            return
        except _READ_ERRORS as exc:
            yield BadRow(
                source, index + 1, UNREADABLE_FILE, f"read failed at element {index + 1}: {exc}; earlier rows were read"
            )
            return
        if value is _END:
            return
        index += 1
        if isinstance(value, dict):
            yield SourceRow(source, index, value)
        else:
            yield BadRow(source, index, NOT_AN_OBJECT, f"expected a JSON object, got {_json_type(value)}")


_END = object()


def _ijson_message(exc: Exception) -> str:
    # yajl's messages carry a multi-line excerpt with a caret; keep the first line.
    arg = exc.args[0] if exc.args else exc
    text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _iter_parquet(path: str) -> Iterator[SourceRow | BadRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        yield BadRow(path, 0, UNREADABLE_FILE, f"not a readable parquet file: {exc}")
        return
    try:
        yield from _iter_record_batches(parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS), path, 0)
    finally:
        parquet.close()


def _iter_record_batches(
    batches: Iterable, source: str, start: int
) -> Generator[SourceRow | BadRow, None, tuple[int, bool]]:
    """Rows of arrow record batches numbered from ``start + 1``; returns the last row number
    and whether the batches were read to the end without error."""
    import pyarrow as pa

    index = start
    try:
        for batch in batches:
            for offset in range(0, batch.num_rows, ARROW_SLICE_ROWS):
                for data in batch.slice(offset, ARROW_SLICE_ROWS).to_pylist():
                    index += 1
                    yield SourceRow(source, index, data)
    except (OSError, pa.ArrowException) as exc:
        yield BadRow(
            source, index + 1, UNREADABLE_FILE, f"read failed at row {index + 1}: {exc}; earlier rows were read"
        )
        return index, False
    return index, True


def _iter_hf_dataset(path: str, source: str) -> Iterator[SourceRow | BadRow]:
    """One ``Dataset.save_to_disk`` directory: its arrow shards in state.json order."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    state_path = os.path.join(path, "state.json")
    try:
        with open(state_path, encoding="utf-8") as fh:
            state = json.load(fh)
        shards = [os.path.join(path, entry["filename"]) for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        yield BadRow(source, 0, UNREADABLE_FILE, f"cannot read the shard list in {state_path}: {exc!r}")
        return
    index = 0
    for shard in shards:
        try:
            arrow_file = pa.OSFile(shard)
        except (OSError, pa.ArrowException) as exc:
            yield BadRow(source, index + 1, UNREADABLE_FILE, f"cannot open shard {os.path.basename(shard)}: {exc}")
            return
        with arrow_file:
            try:
                reader = ipc.open_stream(arrow_file)
            except (OSError, pa.ArrowException) as exc:
                yield BadRow(
                    source, index + 1, UNREADABLE_FILE, f"shard {os.path.basename(shard)} is not an arrow stream: {exc}"
                )
                return
            # Row numbers continue across shards, so a broken shard ends the dataset.
            index, complete = yield from _iter_record_batches(reader, source, index)
            if not complete:
                return


def _iter_hf_dataset_dict(path: str) -> Iterator[SourceRow | BadRow]:
    """A ``DatasetDict.save_to_disk`` directory: each split in dataset_dict.json order."""
    dict_path = os.path.join(path, "dataset_dict.json")
    try:
        with open(dict_path, encoding="utf-8") as fh:
            splits = json.load(fh)["splits"]
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise TypeError("'splits' is not a list of names")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        yield BadRow(path, 0, UNREADABLE_FILE, f"cannot read the split list in {dict_path}: {exc!r}")
        return
    for split in splits:
        split_path = os.path.join(path, split)
        if not os.path.isfile(os.path.join(split_path, "state.json")):
            yield BadRow(
                split_path, 0, UNREADABLE_FILE, f"split '{split}' listed in dataset_dict.json has no state.json"
            )
            continue
        yield from _iter_hf_dataset(split_path, split_path)


# Bytes read per step when counting the lines of a JSONL file for the progress bar's total.
COUNT_CHUNK_BYTES = 1 << 22


def estimate_rows(paths: Sequence[str]) -> int | None:
    """Rows the inputs hold where that is cheap (a progress total): plain JSONL by its lines at
    disk speed, Parquet from its metadata; None for anything else."""
    total = 0
    for path in expand_inputs(paths):
        kind, compression = _detect(path)
        if kind == JSONL and compression is None:
            total += _count_lines(path)
        elif kind == PARQUET:
            import pyarrow.parquet as pq

            total += pq.ParquetFile(path).metadata.num_rows
        else:
            return None
    return total


def _count_lines(path: str) -> int:
    lines = 0
    with open(path, "rb") as handle:
        last = b"\n"
        while chunk := handle.read(COUNT_CHUNK_BYTES):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    # A final line without a newline is a row too; blank lines are rare enough to ignore.
    return lines + (last != b"\n")
