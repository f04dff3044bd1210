"""The record format: one record per prompt sample, in zstd-compressed msgpack files under `OUT/<campaign>/`:

    manifest.json                          campaign settings, server provenance, counts
    records/<batch>-<nonce>.zst            a batch file: what one worker commit wrote
    records/shard-<time>-<nonce>.zst       a shard: many batch files merged by `eagle-synth compact`

Every file is one zstd frame: a msgpack header map, then one map per record. A file appears whole
or not at all (written to a dot-named temporary file, fsynced, renamed). Readers stream one record
at a time. docs/records.md has every field, the id codecs and the measurements behind them.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import msgpack
import msgspec
import zstandard

from eagle_synth.errors import NotACampaignFolder, RecordFilesVanished, RecordFormatError
from eagle_synth.ids import pack_ids, unpack_ids
from eagle_synth.key_set import KeySet

FORMAT_NAME = "eagle-synth-records"
# Version of the record layout written now; readers refuse newer versions rather than misread them.
FORMAT_VERSION = 2
# Versions this module reads: 1 (u32le ids, batch files only) and 2 (u24le ids, shards).
READABLE_VERSIONS = frozenset({1, 2})
# Id encoding written by default: 3 bytes per id, little-endian (docs/records.md, "Choosing the encoding").
ID_CODEC = "u24le"
# Encoding of a record holding an id that does not fit in 24 bits (vocabularies over 16.7M).
WIDE_ID_CODEC = "u32le"
# Bytes per id of each codec this module reads.
ID_CODEC_WIDTH = {"u24le": 3, "u32le": 4}
# zstd level of batch files: cheap enough for the worker's commit path.
RECORD_ZSTD_LEVEL = 9
# zstd level of shards: written once by `compact`, read for weeks; 8-10% smaller than level 9.
SHARD_ZSTD_LEVEL = 19
RECORDS_DIR = "records"
RECORD_SUFFIX = ".zst"
MANIFEST_NAME = "manifest.json"
# Shards are named `shard-...`: never a batch id (hex digits), so `batch_files` cannot match one.
SHARD_PREFIX = "shard-"
# Temporary files start with a dot, which every reader skips.
TMP_PREFIX = ".tmp-"
# Compressed bytes read per step while streaming a file.
READ_CHUNK = 1 << 18
# Largest single msgpack object (header or record) a reader accepts.
MAX_OBJECT_BYTES = 1 << 30


def _with_ids(data: dict, prompt_u32: bytes, output_u32: bytes) -> dict:
    """`data` with little-endian uint32 id bytes added as ID_CODEC, or kept (and WIDE_ID_CODEC
    named) when an id needs 32 bits (a high byte is not 0)."""
    ids = [prompt_u32, output_u32]
    if any(u32[3::4].strip(b"\0") for u32 in ids):
        data["id_codec"] = WIDE_ID_CODEC
    else:
        u24s = [bytearray(u32) for u32 in ids]
        for u24 in u24s:
            del u24[3::4]
        ids = [bytes(u24) for u24 in u24s]
    data["prompt_ids"], data["output_ids"] = ids
    return data


def ids_as_u32le(data: bytes, codec: str) -> bytes:
    """Encoded ids as little-endian uint32 bytes: what numpy/pyarrow can view without a copy per id."""
    if (width := ID_CODEC_WIDTH.get(codec)) is None:
        raise ValueError(f"unknown id codec {codec!r}")
    if len(data) % width:
        raise ValueError(f"{codec} id bytes of length {len(data)} are not a multiple of {width}")
    if width == 4:
        return bytes(data)
    out = bytearray(len(data) // 3 * 4)
    # Three strided copies in C; the fourth byte of each id stays 0.
    for byte in range(3):
        out[byte::4] = data[byte::3]
    return bytes(out)


@dataclass(slots=True)
class Record:
    """One generated sample, exactly as the server produced it; docs/records.md defines every field.

    `prompt_ids` are exactly as the chat template rendered them, `output_ids` exactly as the server
    returned them (EOS included); `sampling` is what was sent (with this sample's seed). Files from
    before vLLM support read as backend "sglang"; readers fill in `batch`. `conversation`,
    `variant` and `tool_calls` are set only by the campaigns that use them.
    """

    key: str
    id: str
    sample: int
    turn: int
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    finish_matched: int | str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    campaign: str = ""
    sampling: dict = field(default_factory=dict)
    source: str = ""
    server: str = ""
    worker: str = ""
    e2e_latency: float | None = None
    created_at: float = 0.0
    repaired_prefix: int = 0
    backend: str = "sglang"
    batch: str = ""
    conversation: str | None = None
    variant: str | None = None
    tool_calls: int | None = None

    @property
    def input_ids(self) -> list[int]:
        """Prompt then output: the sequence a drafter trains on."""
        return self.prompt_ids + self.output_ids

    @property
    def loss_mask(self) -> list[int]:
        """0 over the prompt, 1 over the output."""
        return [0] * len(self.prompt_ids) + [1] * len(self.output_ids)

    def to_wire(self) -> dict:
        """The msgpack map stored for this record; ids in ID_CODEC unless they need WIDE_ID_CODEC."""
        data = {
            name: getattr(self, name)
            for name in _FIELD_NAMES
            if name not in _OMITTED_WHEN_NONE or getattr(self, name) is not None
        }
        return _with_ids(data, pack_ids(self.prompt_ids), pack_ids(self.output_ids))


_FIELD_NAMES = tuple(Record.__dataclass_fields__)
# Fields only some campaigns use: left out of the stored map when unset.
_OMITTED_WHEN_NONE = frozenset({"conversation", "variant", "tool_calls"})
_META_FIELDS = tuple(n for n in _FIELD_NAMES if n not in ("prompt_ids", "output_ids"))


@dataclass(slots=True)
class RawRecord:
    """A record whose ids stay little-endian uint32 bytes (numpy.frombuffer(raw.prompt_u32, "<u4")
    views them without a Python int per id): the fast path export and compact use.

    Parameters:
        meta: every Record field except the ids (key, id, sample, ..., batch).
        prompt_u32, output_u32: the ids as little-endian uint32 bytes.
        src: in a shard, the index in the shard's `sources` of the file the record came from.
    """

    meta: dict
    prompt_u32: bytes
    output_u32: bytes
    src: int | None = None

    @property
    def key(self) -> str:
        return self.meta["key"]

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_u32) // 4

    @property
    def output_len(self) -> int:
        return len(self.output_u32) // 4

    def to_wire(self) -> dict:
        """The stored map (ids in ID_CODEC when they fit), with `src` kept for shards."""
        data = _with_ids(dict(self.meta), self.prompt_u32, self.output_u32)
        if self.src is not None:
            data["src"] = self.src
        return data


def _raw_from_wire(data: dict, header: dict) -> RawRecord:
    codec = data.get("id_codec") or header["id_codec"]
    if not (data.get("batch") and data.get("campaign")):  # version 1 files keep them in the header only
        data = {**data, **{name: data.get(name) or header.get(name, "") for name in ("batch", "campaign")}}
    return RawRecord(
        meta={k: data[k] for k in _META_FIELDS if k in data},
        prompt_u32=ids_as_u32le(data["prompt_ids"], codec),
        output_u32=ids_as_u32le(data["output_ids"], codec),
        src=data.get("src"),
    )


def record_from_wire(data: dict, header: dict) -> Record:
    """A record from its stored map and its file's header (whose `id_codec` a record's own overrides)."""
    raw = _raw_from_wire(data, header)
    return Record(**raw.meta, prompt_ids=unpack_ids(raw.prompt_u32), output_ids=unpack_ids(raw.output_u32))


def campaign_dir(out: str | os.PathLike, campaign: str) -> Path:
    return Path(out) / campaign


def records_dir(campaign_path: str | os.PathLike) -> Path:
    return Path(campaign_path) / RECORDS_DIR


def is_shard(path: str | os.PathLike) -> bool:
    return Path(path).name.startswith(SHARD_PREFIX)


def batch_of_file(path: str | os.PathLike) -> str:
    """The batch id a batch file's name carries (`<batch>-<nonce>.zst`)."""
    return Path(path).name[: -len(RECORD_SUFFIX)].rsplit("-", 1)[0]


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_temporary(folder: Path, *, prefix: str, suffix: str) -> IO[bytes]:
    """A new file in `folder`, made by open() for open()'s mode (0o666 minus the umask: 0644 usually,
    so a trainer running as another user can read records and exports), not mkstemp's 0600."""
    return open(folder / f"{prefix}{secrets.token_hex(8)}{suffix}", "xb")


def _publish(handle: IO[bytes], path: Path) -> None:
    """fsync and close a temporary file, then rename it to `path`, durably."""
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
    os.replace(handle.name, path)
    fsync_dir(path.parent)


@contextmanager
def atomic_writer(path: Path) -> Iterator[IO[bytes]]:
    """A file to write in the `with` block, which appears at `path` whole or not at all, even
    across a power cut (an exception in the block leaves no file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = _open_temporary(path.parent, prefix=TMP_PREFIX, suffix=path.suffix)
    try:
        yield handle
        _publish(handle, path)
    except BaseException:
        # close() flushes what is buffered and fails again on a full disk: the file must go anyway.
        with suppress(OSError):
            handle.close()
        Path(handle.name).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a file so that it appears whole or not at all, even across a power cut."""
    with atomic_writer(path) as handle:
        handle.write(data)


def _header(*, campaign: str, **extra: Any) -> dict:
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "id_codec": ID_CODEC,
        "campaign": campaign,
        "created_at": time.time(),
        **extra,
    }


def encode_record_file(records: Iterable[Record], *, campaign: str, batch: str) -> bytes:
    """The bytes of one batch file: header then records, in one zstd frame."""
    encoder = msgspec.msgpack.Encoder()
    parts = [encoder.encode(_header(campaign=campaign, kind="batch", batch=batch))]
    # `batch` is a Record field, so the map keeps its key order.
    parts += [encoder.encode({**record.to_wire(), "batch": batch}) for record in records]
    return zstandard.ZstdCompressor(level=RECORD_ZSTD_LEVEL, write_checksum=True).compress(b"".join(parts))


# Seconds after which a temporary record file is an orphan of a killed writer, not a write in
# progress (a worker's write takes milliseconds; a compaction's shard minutes at most).
STALE_TEMPORARY_SECONDS = 3600


def remove_stale_temporaries(
    campaign_path: str | os.PathLike, *, prefix: str = TMP_PREFIX, older_than: float = STALE_TEMPORARY_SECONDS
) -> int:
    """Delete temporary files (`prefix`*) killed writers left in a campaign's records folder,
    if at least `older_than` seconds old (0: all, for a caller that holds the folder's lock)."""
    removed = 0
    cutoff = time.time() - older_than
    for path in records_dir(campaign_path).glob(f"{prefix}*"):
        with suppress(FileNotFoundError):
            if older_than <= 0 or path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
    return removed


def remove_uncommitted(path: Path) -> None:
    """Delete a record file whose keys could not be marked done (its writer lost its lease)."""
    if path.exists():
        path.unlink(missing_ok=True)
        fsync_dir(path.parent)


def write_record_file(campaign_path: str | os.PathLike, *, campaign: str, batch: str, records: list[Record]) -> Path:
    """Atomically write one batch's records; returns the new file's path. Each write gets a fresh
    nonce, so a batch partly redone never overwrites what an earlier attempt committed."""
    if f"{batch}-".startswith(SHARD_PREFIX) or "/" in batch or batch.startswith("."):
        raise ValueError(f"batch id {batch!r} is reserved or not a plain name")
    path = records_dir(campaign_path) / f"{batch}-{secrets.token_hex(4)}{RECORD_SUFFIX}"
    atomic_write_bytes(path, encode_record_file(records, campaign=campaign, batch=batch))
    return path


class ShardWriter(AbstractContextManager["ShardWriter"]):
    """Streams records of `campaign` (kept in the header) into a dot-named temporary file in
    `campaign_path`'s records folder, compressed at zstd `level` by `threads` workers (0: in this
    thread); `commit()` fsyncs and renames it to `shard-<utc time>-<nonce>.zst`, leaving the `with`
    block without a commit leaves no shard. `sources` names the batch files the shard absorbs: a
    record's `src` indexes it, and readers skip a listed file that still exists."""

    def __init__(
        self,
        campaign_path: str | os.PathLike,
        *,
        campaign: str,
        sources: Sequence[str],
        level: int = SHARD_ZSTD_LEVEL,
        threads: int = 0,
    ) -> None:
        self.folder = records_dir(campaign_path)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._handle = _open_temporary(self.folder, prefix=f"{TMP_PREFIX}{SHARD_PREFIX}", suffix=RECORD_SUFFIX)
        compressor = zstandard.ZstdCompressor(level=level, write_checksum=True, threads=threads)
        self._stream = compressor.stream_writer(self._handle, closefd=False)
        self._encoder = msgspec.msgpack.Encoder()
        self._stream.write(self._encoder.encode(_header(campaign=campaign, kind="shard", sources=list(sources))))
        self._done = False

    def add(self, record: RawRecord) -> None:
        """Append one record (its `src` must index `sources`)."""
        self._stream.write(self._encoder.encode(record.to_wire()))

    def commit(self) -> Path:
        """Rename the shard to its final name; returns that path."""
        self._stream.close()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.folder / f"{SHARD_PREFIX}{stamp}-{secrets.token_hex(4)}{RECORD_SUFFIX}"
        _publish(self._handle, path)
        self._done = True
        return path

    def __exit__(self, *exc_info) -> None:
        if self._done:
            return
        # Both flush what is buffered, which fails again on a full disk: the file must go anyway.
        with suppress(zstandard.ZstdError, OSError):
            self._stream.close()
        with suppress(OSError):
            self._handle.close()
        Path(self._handle.name).unlink(missing_ok=True)


def _iter_objects(path: Path) -> Iterator[Any]:
    """The msgpack objects of one file, streamed; a truncated or corrupt file raises."""
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_OBJECT_BYTES)
    fed = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            data = decompressor.decompress(chunk)
            unpacker.feed(data)
            fed += len(data)
            yield from unpacker
            if decompressor.eof:
                if decompressor.unused_data or handle.read(1):
                    raise RecordFormatError(f"{path}: damaged record file (bytes after the end of its zstd frame)")
                break
    if not decompressor.eof:
        raise RecordFormatError(f"{path}: damaged record file (truncated: its zstd frame does not end)")
    if unpacker.tell() != fed:
        raise RecordFormatError(f"{path}: damaged record file (truncated inside a record)")


def _check_header(path: Path, header: Any) -> dict:
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise RecordFormatError(f"{path}: not an eagle-synth record file")
    version = header.get("version", 0)
    codec = header.get("id_codec")
    if version not in READABLE_VERSIONS or codec not in ID_CODEC_WIDTH:
        raise RecordFormatError(
            f"{path}: format version {version} / codec {codec} is newer than this eagle-synth "
            f"reads (versions {sorted(READABLE_VERSIONS)}); upgrade eagle-synth"
        )
    header.setdefault("kind", "batch")
    return header


_T = TypeVar("_T")


@contextmanager
def _damage_names(path: Path) -> Iterator[None]:
    """Report a decoding error inside the block as RecordFormatError naming the file."""
    try:
        yield
    except RecordFormatError:
        raise
    except (zstandard.ZstdError, msgpack.UnpackException, ValueError, KeyError, TypeError) as exc:
        raise RecordFormatError(f"{path}: damaged record file ({exc!r})") from exc


def _iter_file(
    path: str | os.PathLike, make: Callable[[dict, dict], _T], *, accept: Callable[[dict, dict], bool] | None = None
) -> Iterator[_T]:
    """Stream one file through `make(wire, header)`, skipping maps `accept` refuses."""
    path = Path(path)
    with _damage_names(path):
        objects = _iter_objects(path)
        header = _check_header(path, next(objects, None))
        for data in objects:
            if not isinstance(data, dict):
                raise RecordFormatError(f"{path}: damaged record file (a record is not a map)")
            if accept is None or accept(data, header):
                yield make(data, header)


def read_file_header(path: str | os.PathLike) -> dict:
    """The header map of one record file (format, version, id_codec, kind, batch or sources)."""
    path = Path(path)
    with _damage_names(path):
        return _check_header(path, next(_iter_objects(path), None))


def read_record_file(path: str | os.PathLike) -> Iterator[Record]:
    """Stream the records of one file (a batch file or a shard); read_raw_file as RawRecord."""
    return _iter_file(path, record_from_wire)


def read_raw_file(path: str | os.PathLike) -> Iterator[RawRecord]:
    return _iter_file(path, _raw_from_wire)


def batch_files(campaign_path: str | os.PathLike, batch: str) -> list[Path]:
    """Batch files already written for a batch (by this host's earlier attempts); never a shard,
    whose records were committed and marked done before compaction moved them."""
    folder = records_dir(campaign_path)
    return sorted(p for p in folder.glob(f"{batch}-*{RECORD_SUFFIX}") if not is_shard(p) and batch_of_file(p) == batch)


def record_files(campaign_path: str | os.PathLike) -> list[Path]:
    """Every complete record file of a campaign (batch files, then shards), in a stable order."""
    folder = records_dir(campaign_path)
    if not folder.is_dir():
        raise NotACampaignFolder(folder, campaign_path)
    files = [p for p in folder.iterdir() if p.suffix == RECORD_SUFFIX and not p.name.startswith(".")]
    return sorted(files, key=lambda p: (is_shard(p), p.name))


@dataclass(frozen=True, slots=True)
class CampaignFiles:
    """A snapshot of a campaign's record files: `batch_files` no shard holds yet, `shards` oldest
    first, and the batch files a shard already holds (`absorbed`: left by a stopped compaction;
    readers skip them, the next `compact` deletes them). `shard_sources` maps each shard to the
    batch file names it absorbed; `repeated_batches` are the batch ids whose records sit in more
    than one file, the only records a repeated key can come from."""

    batch_files: list[Path]
    shards: list[Path]
    absorbed: list[Path]
    shard_sources: dict[Path, list[str]]
    repeated_batches: frozenset[str]

    @property
    def live(self) -> list[Path]:
        """Batch files, then shards: every record once (up to repeated keys)."""
        return self.batch_files + self.shards


def _shard_sources(path: Path) -> list[str]:
    try:
        return list(read_file_header(path).get("sources", []))
    except RecordFormatError:
        # Reading the shard itself will report the damage; its sources, if still here, stay readable.
        return []


def scan_campaign(campaign_path: str | os.PathLike) -> CampaignFiles:
    """List a campaign's files and read shard headers (not records): cheap, bounded by file count."""
    files = record_files(campaign_path)
    shards = [p for p in files if is_shard(p)]
    sources = {p: _shard_sources(p) for p in shards}
    absorbed_names = {name for names in sources.values() for name in names}
    batch_list = [p for p in files if not is_shard(p) and p.name not in absorbed_names]
    absorbed = [p for p in files if not is_shard(p) and p.name in absorbed_names]
    places = Counter(batch_of_file(path) for path in batch_list)
    for names in sources.values():
        places.update({batch_of_file(name) for name in names})
    repeated = frozenset(b for b, count in places.items() if count > 1)
    return CampaignFiles(
        batch_files=batch_list, shards=shards, absorbed=absorbed, shard_sources=sources, repeated_batches=repeated
    )


def _iter_campaign(campaign_path: str | os.PathLike, *, dedupe: bool, make: Callable[[dict, dict], _T]) -> Iterator[_T]:
    scan = scan_campaign(campaign_path)
    seen = KeySet()

    def fresh(data: dict, header: dict) -> bool:
        # Decided on the stored map, before any id is decoded; across every file of the campaign.
        return not dedupe or seen.add(str(data.get("key")))

    missing: set[str] = set()
    for path in scan.live:
        try:
            # A vanished file raises on open, before any record is yielded; only batch files vanish.
            yield from _iter_file(path, make, accept=fresh)
        except FileNotFoundError:
            if is_shard(path):
                raise
            missing.add(path.name)
    # Batch files a concurrent `compact` moved into a shard after our scan: read from that shard.
    for path in record_files(campaign_path) if missing else []:
        if not missing or not is_shard(path) or path in scan.shard_sources:
            continue
        names = read_file_header(path).get("sources", [])
        if indices := frozenset(i for i, name in enumerate(names) if name in missing):
            missing -= {names[i] for i in indices}

            def moved(data: dict, header: dict, sources: frozenset[int] = indices) -> bool:
                return data.get("src") in sources and fresh(data, header)

            yield from _iter_file(path, make, accept=moved)
    if missing:
        raise RecordFilesVanished(
            f"record files {sorted(missing)[:3]} vanished from {records_dir(campaign_path)} and no shard "
            "holds them: something other than `eagle-synth compact` deleted them"
        )


def iter_records(campaign_path: str | os.PathLike, *, dedupe: bool = True) -> Iterator[Record]:
    """Stream every record of a campaign folder, file by file, without loading it whole
    (docs/records.md, "Reading records from training code"); iter_raw_records gives RawRecord.

    With `dedupe` (the default) a repeated key is skipped, whatever files hold it, so a training
    job sees one record per prompt sample even where a crash (or a stopped `compact`) left two;
    keys are remembered as 64-bit digests (eagle_synth/key_set.py, 256 MB for 10M records). Safe
    while workers write and `compact` runs (a file compacted away mid-read is read from its shard).
    """
    return _iter_campaign(campaign_path, dedupe=dedupe, make=record_from_wire)


def iter_raw_records(campaign_path: str | os.PathLike, *, dedupe: bool = True) -> Iterator[RawRecord]:
    return _iter_campaign(campaign_path, dedupe=dedupe, make=_raw_from_wire)


def write_manifest(campaign_path: str | os.PathLike, manifest: dict) -> Path:
    path = Path(campaign_path) / MANIFEST_NAME
    atomic_write_bytes(path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return path


def read_manifest(campaign_path: str | os.PathLike) -> dict | None:
    path = Path(campaign_path) / MANIFEST_NAME
    if not path.exists():
        return None
    return json.loads(path.read_text())
