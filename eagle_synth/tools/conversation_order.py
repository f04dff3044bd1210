"""Records in conversation order (`ordered_records`) or row-group order (`grouped_records`), for `export`.

A conversation's turns land in files far apart. Records are streamed once into buckets by a hash
of their key (zstd spill files in a temporary folder, or memory for a small campaign), then each
bucket is sorted and read back: memory is bounded by one bucket. Records without a conversation
come first, as read. `grouped_records` groups every campaign by input row (filters.row_group) in
the order of its hash, buckets taking consecutive slices of the hash range: a tail split by index
(speculators' validation rows) then cuts at most one row group, and takes a random set of them.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import msgpack
import zstandard

from eagle_synth.records import RawRecord, iter_raw_records, scan_campaign
from eagle_synth.tools.filters import conversation_key, row_group, row_group_hash

# Bytes of records (ids as uint32 plus metadata) a bucket may hold in memory when sorted.
BUCKET_BYTES = 256 << 20
# Stored records are about this many times smaller than in memory (ids: 3 bytes + zstd vs 4).
EXPANSION_FACTOR = 4
# zstd level of spill files: written and read once.
SPILL_ZSTD_LEVEL = 1


def _bucket_count(campaign_path: Path) -> int:
    stored = 0
    for path in scan_campaign(campaign_path).live:
        with contextlib.suppress(FileNotFoundError):
            stored += path.stat().st_size
    return max(1, math.ceil(stored * EXPANSION_FACTOR / BUCKET_BYTES))


def _conversation_order(raw: RawRecord) -> tuple:
    return raw.meta["conversation"], int(raw.meta.get("turn", 0))


def _group_order(raw: RawRecord) -> tuple:
    meta = raw.meta
    return (row_group_hash(meta), row_group(meta), conversation_key(meta), int(meta.get("turn", 0)), raw.key)


def _records(
    campaign_path: str | os.PathLike,
    turns: str,
    dropped: Counter[str] | None,
    bucket_of: Callable[[RawRecord, int], int | None],
    key: Callable[[RawRecord], tuple],
) -> Iterator[RawRecord]:
    """Records `bucket_of` gives None first, as read; then each bucket (in memory when there is one,
    else a zstd spill file) sorted by `key`, with turns="last" (export checks `turns`) only each
    conversation's last turn, counting the others in `dropped`."""
    dropped = Counter() if dropped is None else dropped
    buckets = _bucket_count(Path(campaign_path))

    def in_order(records: list[RawRecord]) -> Iterator[RawRecord]:
        records.sort(key=key)
        for index, raw in enumerate(records):
            conversation = raw.meta.get("conversation")
            following = records[index + 1].meta.get("conversation") if index + 1 < len(records) else None
            if turns == "last" and conversation and following == conversation:
                dropped["earlier_turn"] += 1
                continue
            yield raw

    held: list[RawRecord] = []  # the bucket, when there is only one
    with tempfile.TemporaryDirectory(prefix="eagle-synth-export-") as folder:
        paths = [Path(folder) / f"bucket-{i:05d}.zst" for i in range(buckets)] if buckets > 1 else []
        packer = msgpack.Packer(use_bin_type=True)
        with ExitStack() as files:
            writers = [
                files.enter_context(zstandard.open(p, "wb", cctx=zstandard.ZstdCompressor(level=SPILL_ZSTD_LEVEL)))
                for p in paths
            ]
            for raw in iter_raw_records(campaign_path):
                bucket = bucket_of(raw, buckets)
                if bucket is None:
                    yield raw
                elif not writers:
                    held.append(raw)
                else:
                    writers[bucket].write(packer.pack([raw.meta, raw.prompt_u32, raw.output_u32]))
        yield from in_order(held)
        for path in paths:
            with zstandard.open(path, "rb") as reader:
                unpacked = msgpack.Unpacker(reader, raw=False)
                records = [
                    RawRecord(meta=meta, prompt_u32=prompt, output_u32=output) for meta, prompt, output in unpacked
                ]
            yield from in_order(records)


def ordered_records(
    campaign_path: str | os.PathLike, *, turns: str = "all", dropped: Counter[str] | None = None
) -> Iterator[RawRecord]:
    """Every record, conversations' turns together and in order; with turns="last" only each
    conversation's last turn (`dropped["earlier_turn"]` counts the ones left out)."""

    def bucket_of(raw: RawRecord, buckets: int) -> int | None:
        if not (conversation := raw.meta.get("conversation")):
            return None
        return int(conversation[:15], 16) % buckets if buckets > 1 else 0

    return _records(campaign_path, turns, dropped, bucket_of, _conversation_order)


def grouped_records(
    campaign_path: str | os.PathLike, *, turns: str = "all", dropped: Counter[str] | None = None
) -> Iterator[RawRecord]:
    """Every record, each input row's together (conversation by conversation, turns in order), rows
    in the order of their group's hash; turns as ordered_records'."""
    # Buckets are consecutive slices of the hash range, so reading them in turn keeps hash order.
    return _records(
        campaign_path, turns, dropped, lambda raw, buckets: (row_group_hash(raw.meta) * buckets) >> 64, _group_order
    )
