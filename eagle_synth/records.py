"""The record format: one record per prompt sample, in zstd-compressed msgpack files.

Layout under `OUT/<campaign>/`:

    manifest.json                  campaign settings, server provenance, counts
    records/<batch>-<nonce>.zst    a zstd frame: a header map, then one map per record

A record file appears whole or not at all: it is written to a temporary name, fsynced and
renamed. Readers stream: one file at a time, one record at a time. See docs/records.md.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgpack
import zstandard

from eagle_synth.ids import pack_ids, unpack_ids

FORMAT_NAME = "eagle-synth-records"
# Version of the record layout; readers refuse newer versions rather than misread them.
FORMAT_VERSION = 1
# Name of the id encoding inside a record file (see docs/records.md).
ID_CODEC = "u32le"
# zstd level for record files: records are written once and read for weeks.
RECORD_ZSTD_LEVEL = 9
RECORDS_DIR = "records"
RECORD_SUFFIX = ".zst"
MANIFEST_NAME = "manifest.json"


class RecordFormatError(ValueError):
    """A record file is damaged or of an unknown format; the message names the file."""


@dataclass(slots=True)
class Record:
    """One generated sample, exactly as the server produced it.

    Parameters:
        key: stable prompt key (prompt ids + sampling + sample index).
        id: source row id (provenance).
        sample: sample index among the prompt's n samples.
        turn: index of the user turn the prompt ends at.
        prompt_ids: the prompt ids exactly as the chat template rendered them.
        output_ids: the generated ids exactly as the server returned them (EOS included).
        finish_reason: "stop", "length" or "abort".
        finish_matched: the stop token id or string that ended generation, if any.
        prompt_tokens, completion_tokens, cached_tokens: the server's own counts.
        campaign: campaign name.
        sampling: the sampling parameters sent (with this sample's seed).
        source: `file:line` of the input row.
        server: URL of the server that generated it.
        worker: the worker node that wrote it.
        e2e_latency: server-side latency in seconds.
        created_at: unix time the record was written.
        repaired_prefix: ids dropped from the front of output_ids by the prompt-tail repair.
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

    @property
    def input_ids(self) -> list[int]:
        """Prompt then output: the sequence a drafter trains on."""
        return self.prompt_ids + self.output_ids

    @property
    def loss_mask(self) -> list[int]:
        """0 over the prompt, 1 over the output."""
        return [0] * len(self.prompt_ids) + [1] * len(self.output_ids)

    def to_wire(self) -> dict:
        data = asdict(self)
        data["prompt_ids"] = pack_ids(self.prompt_ids)
        data["output_ids"] = pack_ids(self.output_ids)
        return data

    @classmethod
    def from_wire(cls, data: dict) -> Record:
        data = dict(data)
        data["prompt_ids"] = unpack_ids(data["prompt_ids"])
        data["output_ids"] = unpack_ids(data["output_ids"])
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def campaign_dir(out: str | os.PathLike, campaign: str) -> Path:
    return Path(out) / campaign


def records_dir(campaign_path: str | os.PathLike) -> Path:
    return Path(campaign_path) / RECORDS_DIR


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a file so that it appears whole or not at all, even across a power cut."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def encode_record_file(records: Iterable[Record], *, campaign: str, batch: str) -> bytes:
    """The bytes of one record file: header then records, in one zstd frame."""
    packer = msgpack.Packer(use_bin_type=True)
    header = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "id_codec": ID_CODEC,
        "campaign": campaign, "batch": batch, "created_at": time.time(),
    }
    raw = packer.pack(header) + b"".join(packer.pack(r.to_wire()) for r in records)
    return zstandard.ZstdCompressor(level=RECORD_ZSTD_LEVEL).compress(raw)


def write_record_file(campaign_path: str | os.PathLike, *, campaign: str, batch: str,
                      records: list[Record]) -> Path:
    """Atomically write one batch's records; returns the new file's path.

    Each write gets a fresh nonce so a batch that is partly redone never overwrites the
    records an earlier attempt already committed.
    """
    path = records_dir(campaign_path) / f"{batch}-{secrets.token_hex(4)}{RECORD_SUFFIX}"
    atomic_write_bytes(path, encode_record_file(records, campaign=campaign, batch=batch))
    return path


def batch_files(campaign_path: str | os.PathLike, batch: str) -> list[Path]:
    """Record files already written for a batch (by this host's earlier attempts)."""
    folder = records_dir(campaign_path)
    if not folder.is_dir():
        return []
    return sorted(folder.glob(f"{batch}-*{RECORD_SUFFIX}"))


def record_files(campaign_path: str | os.PathLike) -> list[Path]:
    """Every complete record file of a campaign, in a stable order."""
    folder = records_dir(campaign_path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder} does not exist: is {campaign_path} a campaign folder (OUT/<campaign>)?"
        )
    return sorted(p for p in folder.iterdir() if p.suffix == RECORD_SUFFIX and not p.name.startswith("."))


def read_record_file(path: str | os.PathLike) -> Iterator[Record]:
    """Stream the records of one file."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            reader = zstandard.ZstdDecompressor().stream_reader(handle)
            unpacker = msgpack.Unpacker(reader, raw=False, max_buffer_size=1 << 30)
            header = next(unpacker, None)
            if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
                raise RecordFormatError(f"{path}: not an eagle-synth record file")
            if header.get("version", 0) > FORMAT_VERSION or header.get("id_codec") != ID_CODEC:
                raise RecordFormatError(
                    f"{path}: format version {header.get('version')} / codec "
                    f"{header.get('id_codec')} is newer than this eagle-synth reads; upgrade it"
                )
            for data in unpacker:
                yield Record.from_wire(data)
    except (zstandard.ZstdError, msgpack.UnpackException, ValueError) as exc:
        if isinstance(exc, RecordFormatError):
            raise
        raise RecordFormatError(f"{path}: damaged record file ({exc})") from exc


def iter_records(campaign_path: str | os.PathLike, *, dedupe: bool = True) -> Iterator[Record]:
    """Stream every record of a campaign folder, file by file, without loading it whole.

    With `dedupe` (the default) a key seen before is skipped, so a training job sees exactly
    one record per prompt sample even in the rare window where a crash left two.
    Usage from training code:

        from eagle_synth.records import iter_records
        for record in iter_records("out/my-campaign"):
            train_on(record.input_ids, record.loss_mask)
    """
    seen: set[str] = set()
    for path in record_files(campaign_path):
        for record in read_record_file(path):
            if dedupe:
                if record.key in seen:
                    continue
                seen.add(record.key)
            yield record


def write_manifest(campaign_path: str | os.PathLike, manifest: dict) -> Path:
    path = Path(campaign_path) / MANIFEST_NAME
    atomic_write_bytes(path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return path


def read_manifest(campaign_path: str | os.PathLike) -> dict | None:
    path = Path(campaign_path) / MANIFEST_NAME
    if not path.exists():
        return None
    return json.loads(path.read_text())
