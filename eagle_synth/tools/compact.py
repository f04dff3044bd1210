"""`eagle-synth compact`: merge many small batch files into large shards, safely while workers write.

A shard is written under a dot name, fsynced and renamed, read back from disk, and only then are
the batch files its header lists deleted; readers skip listed files, so a stop at any point loses
and repeats no record (docs/records.md, `eagle-synth compact`). A run takes only the batch files
that existed, and were old enough, when it started.
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from eagle_synth.errors import CompactBusy, CompactWriteFailed, NotACampaignFolder, RecordFormatError
from eagle_synth.records import (
    SHARD_PREFIX,
    TMP_PREFIX,
    CampaignFiles,
    ShardWriter,
    batch_of_file,
    fsync_dir,
    read_file_header,
    read_raw_file,
    records_dir,
    remove_stale_temporaries,
    scan_campaign,
)

# Compressed bytes of batch files gathered into one shard (the shard comes out ~25% smaller).
DEFAULT_SHARD_BYTES = 256 << 20
# Batch files younger than this (seconds) are left alone, so a worker re-reading its own
# batch's files after a redelivery does not see them vanish under it.
DEFAULT_MIN_AGE = 300.0
# A run that finds fewer batch files than this writes no shard: nothing worth merging.
MIN_FILES = 2
# zstd level of the shards `compact` writes, measured by benchmarks/compact_level.py: level 9
# gives 0.940 B/token at 5.2M tokens per CPU-second, level 19 (SHARD_ZSTD_LEVEL, the level
# before) 0.869 B/token at 0.28M: 8 % more bytes for 1/19 of the CPU (20B tokens: ~1 CPU-hour
# instead of ~20). Levels 12-18 save at most 1-7 % more at 2-15x the CPU.
SHARD_LEVEL = 9
# zstd worker threads `eagle-synth compact` uses by default: one per core (1.4x the wall-clock
# rate of one thread on 2 cores, measured); compaction runs beside little else.
DEFAULT_THREADS = os.cpu_count() or 1
# Lock file (a dot name readers ignore) that keeps compactions and repairs of one folder apart.
LOCK_NAME = ".compact.lock"


@dataclass(slots=True)
class CompactResult:
    """What one run did: shards written, batch files merged (and deleted), their records, repeated
    keys left out, bytes before and after; batch files an earlier stopped run had merged
    (`leftovers_deleted`), newer than min_age (`young_skipped`) or unreadable (`damaged`, left in
    place); shards that did not read back (`unverified_shards`: deleted, batch files kept)."""

    shards: list[Path] = field(default_factory=list)
    files_compacted: int = 0
    records: int = 0
    duplicates_dropped: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    leftovers_deleted: int = 0
    young_skipped: int = 0
    damaged: list[str] = field(default_factory=list)
    unverified_shards: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"shards": [str(p) for p in self.shards]}


@contextmanager
def exclusive(folder: Path) -> Iterator[None]:
    """Hold a records folder against other `compact` and `repair` runs (CompactBusy if held)."""
    with open(folder / LOCK_NAME, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CompactBusy(
                f"another `eagle-synth compact` or `repair` is running on {folder.parent}; wait for it to finish"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _plan(files: list[tuple[Path, int]], *, shard_bytes: int) -> list[list[tuple[Path, int]]]:
    """Groups of (file, size) of about shard_bytes; files of one batch never straddle two groups,
    so a key repeated within a batch is dropped inside one shard."""
    groups: list[list[tuple[Path, int]]] = []
    size = 0
    # Sorted by name, so one batch's files are adjacent: groupby hands each batch over whole.
    for _, same_batch in itertools.groupby(files, key=lambda entry: batch_of_file(entry[0])):
        if not groups or size >= shard_bytes:
            groups.append([])
            size = 0
        for entry in same_batch:
            groups[-1].append(entry)
            size += entry[1]
    return groups


def _reads_back(shard: Path, keys: list[str]) -> bool:
    """True if the shard on disk holds exactly these keys, in order, and every record decodes."""
    if hasattr(os, "posix_fadvise"):  # forget the fsynced file's cached pages: read the disk
        with open(shard, "rb") as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        return [raw.key for raw in read_raw_file(shard)] == keys
    except RecordFormatError:
        return False


def _keys_already_sharded(scan: CampaignFiles, batches: set[str]) -> set[str]:
    """Keys of these batches that existing shards hold (a batch redone after an earlier compaction)."""
    keys: set[str] = set()
    for shard, names in scan.shard_sources.items():
        if batches & {batch_of_file(name) for name in names}:
            try:
                keys.update(r.key for r in read_raw_file(shard) if r.meta.get("batch") in batches)
            except RecordFormatError:
                continue  # a damaged shard: readers still drop a repeat of what it holds
    return keys


def compact(
    campaign_path: str | os.PathLike,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    min_age: float = DEFAULT_MIN_AGE,
    threads: int = 0,
    on_shard: Callable[[Path, int], None] | None = None,
) -> CompactResult:
    """Merge a campaign folder's batch files at least `min_age` seconds old into shards of
    about `shard_bytes` compressed bytes (see the module docstring), at zstd SHARD_LEVEL on
    `threads` worker threads (0: the calling thread); `on_shard(path, records)` after each."""
    folder = records_dir(campaign_path)
    if not folder.is_dir():
        raise NotACampaignFolder(folder, campaign_path)
    result = CompactResult()
    with exclusive(folder):
        # Our own temporary shards: only a stopped run (we hold the lock) can have left them.
        remove_stale_temporaries(campaign_path, prefix=f"{TMP_PREFIX}{SHARD_PREFIX}", older_than=0)
        scan = scan_campaign(campaign_path)
        for path in scan.absorbed:
            path.unlink(missing_ok=True)
            result.leftovers_deleted += 1
        if scan.absorbed:
            fsync_dir(folder)
        cutoff = time.time() - min_age
        candidates = []
        for path in scan.batch_files:
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            if stat.st_mtime <= cutoff:
                candidates.append((path, stat.st_size))
            else:
                result.young_skipped += 1
        if len(candidates) < MIN_FILES:
            return result
        for group in _plan(candidates, shard_bytes=shard_bytes):
            try:
                _compact_group(
                    campaign_path, scan, group, result, level=SHARD_LEVEL, threads=threads, on_shard=on_shard
                )
            except OSError as exc:  # ENOSPC, EDQUOT, EROFS, EIO: the writer left no file behind
                raise CompactWriteFailed(folder, exc, len(result.shards)) from exc
    return result


def _compact_group(campaign_path, scan: CampaignFiles, group: list[tuple[Path, int]], result: CompactResult, **options):
    sources = []
    for path, size in group:
        try:
            for _ in read_raw_file(path):
                pass
            sources.append((path, size))
        except RecordFormatError:
            result.damaged.append(path.name)
    if not sources:
        return
    campaign = read_file_header(sources[0][0]).get("campaign", "")
    batches = {batch_of_file(path) for path, _ in sources}
    seen = _keys_already_sharded(scan, batches & scan.repeated_batches)
    dropped = 0
    written_keys: list[str] = []
    on_shard = options.pop("on_shard")
    with ShardWriter(campaign_path, campaign=campaign, sources=[p.name for p, _ in sources], **options) as writer:
        for index, (path, _) in enumerate(sources):
            for raw in read_raw_file(path):
                if raw.key in seen:
                    dropped += 1
                    continue
                seen.add(raw.key)
                raw.src = index
                writer.add(raw)
                written_keys.append(raw.key)
        shard = writer.commit()
    if not _reads_back(shard, written_keys):
        # Readers would skip the sources this shard lists: it must go before anything else.
        shard.unlink(missing_ok=True)
        fsync_dir(shard.parent)
        result.unverified_shards.append(shard.name)
        return
    written = len(written_keys)
    # The shard is durable and reads back; from here on a stop only leaves absorbed files readers skip.
    for path, _ in sources:
        path.unlink(missing_ok=True)
    fsync_dir(shard.parent)
    result.shards.append(shard)
    result.files_compacted += len(sources)
    result.records += written
    result.duplicates_dropped += dropped
    result.bytes_before += sum(size for _, size in sources)
    result.bytes_after += shard.stat().st_size
    if on_shard is not None:
        on_shard(shard, written)
