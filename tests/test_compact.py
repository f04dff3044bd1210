"""compact: merges batch files into shards without losing or doubling a record, even when
stopped midway, while workers write, and while a reader streams."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from eagle_synth.errors import CompactBusy
from eagle_synth.records import (
    Record,
    ShardWriter,
    batch_files,
    is_shard,
    iter_records,
    read_file_header,
    record_files,
    scan_campaign,
    write_record_file,
)
from eagle_synth.tools import compact as compact_module
from eagle_synth.tools.compact import compact
from tests.export_helpers import plain_record


def rec(key: str, output=None) -> Record:
    prompt = [248045, 846, 198] + [1000 + len(key)] * 20
    output = output if output is not None else [(hash(key) % 200_000) + 7] * 30 + [248046]
    return plain_record(key, key, prompt, output, finish_matched=248046)


def fill(folder: Path, batches: int, per_batch: int = 4) -> dict[str, Record]:
    written = {}
    for b in range(batches):
        records = [rec(f"b{b:03d}k{i}") for i in range(per_batch)]
        write_record_file(folder, campaign="c", batch=f"{b:016x}", records=records)
        written.update({r.key: r for r in records})
    return written


def contents(folder: Path, *, dedupe: bool = True) -> list[tuple]:
    return sorted((r.key, tuple(r.prompt_ids), tuple(r.output_ids)) for r in iter_records(folder, dedupe=dedupe))


def test_compact_merges_deletes_sources_and_keeps_every_record(tmp_path):
    written = fill(tmp_path, batches=30)
    before = contents(tmp_path)
    result = compact(tmp_path, min_age=0)
    files = record_files(tmp_path)
    assert len(files) == 1 and is_shard(files[0]) and result.shards == files
    assert result.files_compacted == 30 and result.records == 120 and result.duplicates_dropped == 0
    assert result.bytes_after < result.bytes_before
    assert contents(tmp_path, dedupe=False) == before
    assert len(before) == len(written)
    # Shards are invisible to a worker adopting its batch's files.
    assert batch_files(tmp_path, f"{3:016x}") == []
    assert {r.batch for r in iter_records(tmp_path)} == {f"{b:016x}" for b in range(30)}
    assert len(read_file_header(files[0])["sources"]) == 30


def test_repeated_keys_are_dropped_while_compacting(tmp_path):
    write_record_file(tmp_path, campaign="c", batch="aa", records=[rec("k1"), rec("k2")])
    write_record_file(tmp_path, campaign="c", batch="aa", records=[rec("k2"), rec("k3")])
    result = compact(tmp_path, min_age=0)
    assert result.duplicates_dropped == 1 and result.records == 3
    assert sorted(r.key for r in iter_records(tmp_path, dedupe=False)) == ["k1", "k2", "k3"]


def test_stopped_after_the_shard_before_deleting_sources(tmp_path, monkeypatch):
    fill(tmp_path, batches=6)
    before = contents(tmp_path)
    real_unlink = Path.unlink
    calls = []

    def stop_after_two(self, missing_ok=False):
        calls.append(self)
        if len(calls) > 2:
            raise KeyboardInterrupt("killed")
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        compact(tmp_path, min_age=0)
    monkeypatch.setattr(Path, "unlink", real_unlink)
    scan = scan_campaign(tmp_path)
    assert len(scan.shards) == 1 and len(scan.absorbed) == 4 and scan.batch_files == []
    # Readers skip the leftovers the shard already holds: nothing doubled, even without dedupe.
    assert contents(tmp_path, dedupe=False) == before
    result = compact(tmp_path, min_age=0)
    assert result.leftovers_deleted == 4 and result.shards == []
    assert len(record_files(tmp_path)) == 1
    assert contents(tmp_path, dedupe=False) == before


def test_stopped_while_writing_the_shard_leaves_sources_and_no_shard(tmp_path, monkeypatch):
    fill(tmp_path, batches=5)
    before = contents(tmp_path)
    real_add = ShardWriter.add
    added = []

    def fail_midway(self, record):
        if len(added) == 7:
            raise KeyboardInterrupt("killed")
        real_add(self, record)
        added.append(record)

    monkeypatch.setattr(ShardWriter, "add", fail_midway)
    with pytest.raises(KeyboardInterrupt):
        compact(tmp_path, min_age=0)
    assert not any(is_shard(p) for p in record_files(tmp_path))
    assert not list((tmp_path / "records").glob(".tmp-shard-*"))
    assert contents(tmp_path, dedupe=False) == before


def test_a_temporary_shard_of_a_killed_run_is_ignored_then_removed(tmp_path):
    fill(tmp_path, batches=3)
    stale = tmp_path / "records" / ".tmp-shard-deadbeef.zst"
    stale.write_bytes(b"\x28\xb5\x2f\xfd partial")
    before = contents(tmp_path)
    assert contents(tmp_path) == before
    compact(tmp_path, min_age=0)
    assert not stale.exists()
    assert contents(tmp_path, dedupe=False) == before


def test_young_files_wait_and_a_second_run_is_refused(tmp_path):
    fill(tmp_path, batches=4)
    old = time.time() - 3600
    for path in record_files(tmp_path)[:3]:
        os.utime(path, (old, old))
    result = compact(tmp_path, min_age=300)
    assert result.files_compacted == 3 and result.young_skipped == 1
    with (
        compact_module.exclusive(tmp_path / "records"),
        pytest.raises(CompactBusy, match="another `eagle-synth compact`"),
    ):
        compact(tmp_path, min_age=0)


def test_a_damaged_batch_file_stays_in_place(tmp_path):
    fill(tmp_path, batches=3)
    bad = record_files(tmp_path)[1]
    bad.write_bytes(bad.read_bytes()[:-20])
    result = compact(tmp_path, min_age=0)
    assert result.damaged == [bad.name] and result.files_compacted == 2
    assert bad.exists() and bad.name not in read_file_header(result.shards[0])["sources"]


def test_a_batch_redone_after_compaction_is_read_once_and_compacted_away(tmp_path):
    write_record_file(tmp_path, campaign="c", batch="aa", records=[rec("k1"), rec("k2")])
    write_record_file(tmp_path, campaign="c", batch="bb", records=[rec("k3")])
    compact(tmp_path, min_age=0)
    # The first attempt crashed before marking its keys done; the redo regenerates k2.
    write_record_file(tmp_path, campaign="c", batch="aa", records=[rec("k2"), rec("k4")])
    write_record_file(tmp_path, campaign="c", batch="cc", records=[rec("k5")])
    assert sorted(r.key for r in iter_records(tmp_path)) == ["k1", "k2", "k3", "k4", "k5"]
    result = compact(tmp_path, min_age=0)
    assert result.duplicates_dropped == 1
    assert sorted(r.key for r in iter_records(tmp_path, dedupe=False)) == ["k1", "k2", "k3", "k4", "k5"]


def test_a_reader_mid_stream_survives_a_compaction(tmp_path):
    fill(tmp_path, batches=8)
    before = contents(tmp_path)
    reader = iter_records(tmp_path, dedupe=False)
    seen = [next(reader)]
    compact(tmp_path, min_age=0)  # the files the reader listed vanish into a shard it never listed
    seen.extend(reader)
    assert sorted((r.key, tuple(r.prompt_ids), tuple(r.output_ids)) for r in seen) == before


def test_compaction_while_a_worker_writes_loses_and_doubles_nothing(tmp_path):
    stop = threading.Event()
    written: list[str] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            n = 0
            while not stop.is_set() or n < 40:
                keys = [f"w{n:04d}k{i}" for i in range(3)]
                batch = f"{n:016x}"
                write_record_file(tmp_path, campaign="c", batch=batch, records=[rec(k) for k in keys])
                written.extend(keys)
                # What a redelivered batch does: its own files only, never a shard.
                assert all(not is_shard(p) for p in batch_files(tmp_path, batch))
                n += 1
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    (tmp_path / "records").mkdir()
    thread = threading.Thread(target=worker)
    thread.start()
    shards = 0
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            shards += len(compact(tmp_path, min_age=0).shards)
            # A reader in the middle of it all sees each record at most once.
            keys = [r.key for r in iter_records(tmp_path, dedupe=False)]
            assert len(keys) == len(set(keys))
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    compact(tmp_path, min_age=0)
    keys = [r.key for r in iter_records(tmp_path, dedupe=False)]
    assert shards >= 2
    assert sorted(keys) == sorted(written) and len(keys) == len(set(keys))
