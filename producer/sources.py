"""Streaming readers for prompt-set inputs, the formats of docs/inputs.md.

Input paths become parsed rows (``SourceRow``) and per-row failures (``BadRow``), holding at
most one line, array element or record batch in memory; an input unusable before reading starts
raises ``InputError``. A ``.json`` file is an array (streamed with ijson) or JSONL, by its first
non-space byte.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import io
import itertools
import json
import os
import sys
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

import ijson
import zstandard

from eagle_synth.errors import InputError

STDIN = "-"  # the path that means "JSONL on standard input"

PARQUET_BATCH_ROWS = 1024  # rows decoded per parquet batch: bounds memory without per-batch overhead dominating
ARROW_SLICE_ROWS = 1024  # rows turned into python dicts at once from one arrow record batch of any size
SNIFF_CHUNK_BYTES = 64 * 1024  # read size while looking for the first non-space byte of a .json file
ZSTD_READ_BYTES = 64 * 1024  # compressed bytes fed to the zstd decoder per step; output per step is ratio-bound
COUNT_CHUNK_BYTES = 1 << 22  # bytes read per step when counting a JSONL file's lines for a progress total

# BadRow.reason slugs.  Stable: callers count and report by them.
BAD_JSON = "bad-json"
NOT_AN_OBJECT = "not-an-object"
NON_UTF8 = "non-utf8"
TRUNCATED_FILE = "truncated-file"
UNREADABLE_FILE = "unreadable-file"
UNSUPPORTED_LAYOUT = "unsupported-layout"

# Input kinds (_detect): "json" is an array or JSONL, decided by sniffing.
STDIN_KIND = "stdin"
JSONL = "jsonl"
JSON = "json"
PARQUET = "parquet"
HF_DATASET = "hf"
HF_DATASET_DICT = "hf-dict"
_KIND_OF_SUFFIX = {".jsonl": JSONL, ".ndjson": JSONL, ".json": JSON, ".parquet": PARQUET}
_COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_UTF8_BOM = b"\xef\xbb\xbf"
_SUPPORTED_HINT = (
    ".jsonl/.ndjson/.json (optionally .gz or .zst), .parquet, a datasets.save_to_disk "
    "directory, or '-' for JSONL on stdin"
)
# Errors that mean "the bytes could not be read/decoded", as opposed to bad row content.
_READ_ERRORS: tuple[type[BaseException], ...] = (OSError, zlib.error)
# ... or that the input ends mid-way (gzip and _ZstdReader raise EOFError there).
_CUT_ERRORS: tuple[type[BaseException], ...] = (EOFError, *_READ_ERRORS)
_JSON_TYPES = ((list, "an array"), (str, "a string"), (bool, "a boolean"), (type(None), "null"))


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One row; `source` as given; `line` 1-based (JSONL's physical line, else the row index)."""

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


Item = SourceRow | BadRow


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """The inputs to read: ``"-"``, an existing path as given, or a glob's sorted matches (files
    and saved datasets); the same real path once. InputError for what cannot be read."""
    if not patterns:
        raise InputError(
            f"no inputs given; pass one or more files, globs, dataset directories or '-' ({_SUPPORTED_HINT})"
        )
    out: dict[str, str] = {}  # real path -> the input as given
    for pattern in patterns:
        if pattern == STDIN or os.path.exists(pattern):
            matches = [pattern]
        elif any(ch in pattern for ch in "*?["):
            found = glob.glob(pattern, recursive=True)
            matches = sorted(m for m in found if os.path.isfile(m) or _dataset_kind(m))
            if not matches:
                raise InputError(
                    f"{pattern}: pattern matched no input files; check the pattern and quote it so the shell does not expand it"
                )
        else:
            raise InputError(f"{pattern}: no such file or directory; check the path")
        for match in matches:
            _detect(match)
            out.setdefault(match if match == STDIN else os.path.realpath(match), match)
    return list(out.values())


def _dataset_kind(path: str) -> str | None:
    for marker, kind in (("dataset_dict.json", HF_DATASET_DICT), ("state.json", HF_DATASET)):
        if os.path.isfile(os.path.join(path, marker)):  # false for a `path` that is no directory
            return kind
    return None


def _detect(path: str) -> tuple[str, str | None]:
    """The kind and compression of ``path``; InputError if it cannot be read at all."""
    if path == STDIN:
        return STDIN_KIND, None
    if os.path.isdir(path):
        kind = _dataset_kind(path)
        if kind is None:
            raise InputError(
                f"{path}: directory is not a saved Hugging Face dataset (no state.json or dataset_dict.json); "
                f"pass its files or a glob such as '{os.path.join(path, '*.jsonl')}'"
            )
        return kind, None
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file; check the path")
    stem, ext = os.path.splitext(os.path.basename(path).lower())
    compression = _COMPRESSION_SUFFIXES.get(ext)
    if compression is not None:
        stem, ext = os.path.splitext(stem)
    kind = _KIND_OF_SUFFIX.get(ext)
    if kind is None:
        raise InputError(f"{path}: unknown input format '{ext or '(no extension)'}'; supported: {_SUPPORTED_HINT}")
    if kind == PARQUET and compression is not None:
        raise InputError(
            f"{path}: compressed parquet is not supported (parquet compresses internally); decompress it first"
        )
    return kind, compression


def iter_source_rows(paths: Sequence[str], *, stdin: IO[bytes] | None = None) -> Iterator[Item]:
    """Every row of ``paths``, in order, as SourceRow or BadRow. Every path is checked first
    (InputError now, not after hours of work); problems met while reading become BadRows (a
    file cut mid-way yields its rows before the cut, then one). ``stdin`` replaces
    ``sys.stdin.buffer`` for ``"-"`` and is never closed."""
    readers: dict[str, Callable[[str, str | None], Iterator[Item]]] = {
        STDIN_KIND: lambda _p, _c: _iter_jsonl(stdin if stdin is not None else sys.stdin.buffer, STDIN),
        JSONL: lambda p, c: _with_opened(p, c, _iter_jsonl),
        JSON: _iter_json_file,
        PARQUET: lambda p, _c: _iter_parquet(p),
        HF_DATASET: lambda p, _c: _iter_hf_dataset(p),
        HF_DATASET_DICT: lambda p, _c: _iter_hf_dataset_dict(p),
    }
    plan = [(path, *_detect(path)) for path in paths]
    return itertools.chain.from_iterable(readers[kind](path, compression) for path, kind, compression in plan)


class ReadProgress:
    """How far reading the input files has got, in bytes of the files as stored (compressed
    bytes for .gz/.zst): a progress measure for inputs whose rows cannot be counted cheaply
    (input_bytes). One per process (READ_PROGRESS): the readers run one file at a time."""

    def __init__(self) -> None:
        self.finished = 0  # bytes of the files read to their end
        self._current: IO[bytes] | None = None  # the stored file being read

    def reading(self, stream: IO[bytes]) -> None:
        # gzip's file object keeps the stored file as `fileobj`, _ZstdReader as `_raw`.
        self._current = (
            getattr(stream, "fileobj", None) or getattr(getattr(stream, "raw", None), "_raw", None) or stream
        )

    def done(self, path: str) -> None:
        self._current = None
        with contextlib.suppress(OSError):
            self.finished += os.path.getsize(path)

    def bytes_read(self) -> int:
        at = 0
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed or gone meanwhile
            at = self._current.tell() if self._current is not None else 0
        return self.finished + at


READ_PROGRESS = ReadProgress()


def _open_bytes(path: str, compression: str | None) -> IO[bytes]:
    if compression == "gzip":
        return cast(IO[bytes], gzip.open(path, "rb"))  # a binary file object; typeshed types it apart
    raw = open(path, "rb")
    return io.BufferedReader(_ZstdReader(raw)) if compression == "zstd" else raw


def _with_opened(
    path: str, compression: str | None, reader: Callable[..., Iterator[Item]], *args: object
) -> Iterator[Item]:
    try:
        stream = _open_bytes(path, compression)
    except OSError as exc:
        yield BadRow(path, 0, UNREADABLE_FILE, f"cannot open: {exc.strerror or exc}")
        return
    with stream:
        READ_PROGRESS.reading(stream)
        yield from reader(stream, path, *args)
    READ_PROGRESS.done(path)


class _ZstdReader(io.RawIOBase):
    """Raw zstd decoder over a file, raising EOFError (as gzip does) on a stream cut mid-frame:
    ``stream_reader`` returns a silent EOF there, which would hide lost rows. Decodes
    concatenated frames; corrupt data raises OSError once what was decoded before it is read."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self._raw = raw
        self._parts = self._decoded()
        self._out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._out:
            if (part := next(self._parts, None)) is None:
                return 0
            self._out = memoryview(part)
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _decoded(self) -> Iterator[bytes]:
        decoder: Any = None  # a zstandard decompressobj, one per frame
        while chunk := self._raw.read(ZSTD_READ_BYTES):
            while chunk:
                if decoder is None or decoder.eof:
                    decoder = zstandard.ZstdDecompressor().decompressobj()
                try:
                    yield decoder.decompress(chunk)
                except zstandard.ZstdError as exc:
                    raise OSError(f"corrupt zstd data: {exc}") from exc
                chunk = decoder.unused_data if decoder.eof else b""
        if decoder is not None and not decoder.eof:
            raise EOFError("zstd stream ended before the end of its last frame")

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def _iter_jsonl(stream: IO[bytes], source: str) -> Iterator[Item]:
    lines = iter(stream)
    lineno = 0
    unterminated: bytes | None = None  # a line without "\n" can only be the last one
    while True:
        at = lineno if unterminated is not None else lineno + 1
        try:
            raw = next(lines, None)
        except _CUT_ERRORS as exc:
            yield _cut_short(source, at, "line", exc)
            return
        if raw is None:
            break
        lineno += 1
        if not raw.endswith(b"\n"):
            unterminated = raw
        elif row := _parse_line(raw, source, lineno, last_unterminated=False):
            yield row
    if unterminated is not None and (row := _parse_line(unterminated, source, lineno, last_unterminated=True)):
        yield row


def _cut_short(source: str, at: int, unit: str, exc: BaseException) -> BadRow:
    """The BadRow of an input that ends (EOFError) or fails to read at its `unit` (line, element, row) `at`."""
    if isinstance(exc, EOFError):
        return BadRow(source, at, TRUNCATED_FILE, f"input ends early at {unit} {at} ({exc}); earlier rows were read")
    return BadRow(source, at, UNREADABLE_FILE, f"read failed at {unit} {at}: {exc}; earlier rows were read")


def _parse_line(raw: bytes, source: str, lineno: int, *, last_unterminated: bool) -> Item | None:
    if lineno == 1:
        raw = raw.removeprefix(_UTF8_BOM)
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if last_unterminated:
            message = f"last line has no newline and is cut inside a UTF-8 character ({exc.reason})"
            return BadRow(source, lineno, TRUNCATED_FILE, message)
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
    return _row(source, lineno, value)


def _row(source: str, line: int, value: object) -> Item:
    if isinstance(value, dict):
        return SourceRow(source, line, value)
    kind = next((name for cls, name in _JSON_TYPES if isinstance(value, cls)), "a number")
    return BadRow(source, line, NOT_AN_OBJECT, f"expected a JSON object, got {kind}")


def _iter_json_file(path: str, compression: str | None) -> Iterator[Item]:
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
    """(the first non-space byte, b"" if none; whether a UTF-8 BOM starts the stream)."""
    chunk = stream.read(SNIFF_CHUNK_BYTES)
    has_bom = chunk.startswith(_UTF8_BOM)
    chunk = chunk.removeprefix(_UTF8_BOM).lstrip(b" \t\r\n")
    while not chunk and (more := stream.read(SNIFF_CHUNK_BYTES)):
        chunk = more.lstrip(b" \t\r\n")
    return chunk[:1], has_bom


def _iter_jsonl_in_json_file(stream: IO[bytes], source: str) -> Iterator[Item]:
    # A .json file that starts with "{" but whose first line is not a whole object is almost
    # surely one pretty-printed object; reading it as JSONL would report every line as
    # bad-json, so report the layout once instead.
    items = _iter_jsonl(stream, source)
    first = next(items, None)
    if isinstance(first, BadRow) and first.reason == BAD_JSON:
        yield BadRow(
            source,
            first.line,
            UNSUPPORTED_LAYOUT,
            "file starts with '{' but its first line is not a complete JSON object; "
            "expected a JSON array of objects or one object per line (JSONL)",
        )
        return
    if first is not None:
        yield first
        yield from items


def _iter_json_array(stream: IO[bytes], source: str, has_bom: bool) -> Iterator[Item]:
    if has_bom:
        stream.read(len(_UTF8_BOM))
    items = ijson.items(stream, "item", use_float=True)
    for at in itertools.count(1):
        try:
            value = next(items)
        except StopIteration:
            return
        except _CUT_ERRORS as exc:
            yield _cut_short(source, at, "element", exc)
            return
        except ijson.JSONError as exc:
            # yajl's messages carry a multi-line excerpt with a caret; keep the first line.
            arg = exc.args[0] if exc.args else exc
            text = (arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)).strip()
            message = text.splitlines()[0] if text else type(exc).__name__
            if "premature EOF" in message or "Incomplete JSON" in message:
                reason = TRUNCATED_FILE
            elif "UTF8" in message or "UTF-8" in message:
                reason = NON_UTF8
            else:
                reason = BAD_JSON
            yield BadRow(source, at, reason, f"{message} (at or after element {at}); earlier rows were read")
            return
        yield _row(source, at, value)


def _iter_parquet(path: str) -> Iterator[Item]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        yield BadRow(path, 0, UNREADABLE_FILE, f"not a readable parquet file: {exc}")
        return
    with parquet:
        yield from _iter_record_batches(parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS), path, 0)


def _iter_record_batches(batches: Iterable, source: str, start: int) -> Generator[Item, None, tuple[int, bool]]:
    """Rows numbered from ``start + 1``; returns the last number and whether all were read."""
    import pyarrow as pa

    index = start
    try:
        for batch in batches:
            for offset in range(0, batch.num_rows, ARROW_SLICE_ROWS):
                for data in batch.slice(offset, ARROW_SLICE_ROWS).to_pylist():
                    index += 1
                    yield SourceRow(source, index, data)
    except (OSError, pa.ArrowException) as exc:
        yield _cut_short(source, index + 1, "row", exc)
        return index, False
    return index, True


def _read_listing(path: str, name: str, read: Callable[[Any], list]) -> Generator[BadRow, None, list]:
    """The entries `read` takes from the listing file; an unreadable one yields its BadRow and has none."""
    listing = os.path.join(path, name)
    try:
        with open(listing, encoding="utf-8") as fh:
            return read(json.load(fh))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = "shard" if name == "state.json" else "split"
        yield BadRow(path, 0, UNREADABLE_FILE, f"cannot read the {what} list in {listing}: {exc!r}")
        return []


def _iter_hf_dataset(path: str) -> Iterator[Item]:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    shards = yield from _read_listing(
        path, "state.json", lambda state: [entry["filename"] for entry in state["_data_files"]]
    )
    index = 0
    for shard in shards:
        try:
            reader = ipc.open_stream(os.path.join(path, shard))
        except (OSError, pa.ArrowException) as exc:
            detail = f"cannot open shard {os.path.basename(shard)} as an arrow stream: {exc}"
            yield BadRow(path, index + 1, UNREADABLE_FILE, detail)
            return
        with reader:
            # Row numbers continue across shards, so a broken shard ends the dataset.
            index, complete = yield from _iter_record_batches(reader, path, index)
            if not complete:
                return


def _split_names(listing: Any) -> list:
    splits = listing["splits"]
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        raise TypeError("'splits' is not a list of names")
    return splits


def _iter_hf_dataset_dict(path: str) -> Iterator[Item]:
    splits = yield from _read_listing(path, "dataset_dict.json", _split_names)
    for split in splits:  # a split missing its state.json is an unreadable file
        yield from _iter_hf_dataset(os.path.join(path, split))


def input_bytes(paths: Sequence[str]) -> int | None:
    """A progress total in stored bytes (READ_PROGRESS) when every input is a JSON or JSONL
    file (compressed or not); else None."""
    total = 0
    for path in expand_inputs(paths):
        kind, _ = _detect(path)
        if kind not in (JSONL, JSON):
            return None
        total += os.path.getsize(path)
    return total


def estimate_rows(paths: Sequence[str]) -> int | None:
    """A progress total where cheap: plain JSONL's lines, Parquet's metadata; else None."""
    total = 0
    for path in expand_inputs(paths):
        kind, compression = _detect(path)
        if kind == JSONL and compression is None:
            with open(path, "rb") as handle:
                last = b"\n"
                while chunk := handle.read(COUNT_CHUNK_BYTES):
                    total += chunk.count(b"\n")
                    last = chunk[-1:]
            # A final line without a newline is a row too; blank lines are rare enough to ignore.
            total += last != b"\n"
        elif kind == PARQUET:
            import pyarrow.parquet as pq

            total += pq.ParquetFile(path).metadata.num_rows
        else:
            return None
    return total
