"""Damaged record files: `repair` moves them aside and gives their prompts back, so a flipped
byte loses nothing for good; `compact` deletes sources only after its shard reads back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eagle_synth.records import (
    Record,
    ShardWriter,
    iter_records,
    record_files,
    scan_campaign,
    write_record_file,
)
from eagle_synth.tools import compact as compact_module
from eagle_synth.tools.compact import compact
from eagle_synth.tools.repair import RECORD_DAMAGED, salvage_records
from eagle_synth.tools.verify import verify_campaign
from tests.conftest import chat_rows, write_jsonl
from tests.export_helpers import plain_record
from tests.helpers import (
    assert_exactly_once,
    campaign,
    cli,
    queued_items,
    wait_finished,
)

ROWS = 24
BATCH = 4


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def run_campaign(tmp_path: Path, redis_url: str, stack, tokenizer_path: Path, name: str) -> tuple[Path, list[str], str]:
    """Enqueue with the CLI (its command is rerun later), generate with a real worker, stop it."""
    inputs = write_jsonl(tmp_path / f"{name}.jsonl", chat_rows(ROWS))
    command = [
        "enqueue",
        str(inputs),
        "--campaign",
        name,
        "--tokenizer",
        str(tokenizer_path),
        "--batch-size",
        str(BATCH),
        "--max-new-tokens",
        "48",
        "--redis",
        redis_url,
    ]
    cli(*command)
    _, url = stack.devserver("--mean-output-tokens", "40")
    out = tmp_path / "out"
    worker = stack.worker(servers=[url], out=out, redis_url=redis_url)
    wait_finished(redis_url, name, expected=ROWS, stack=stack)
    worker.stop()
    return out / name, command, url


def repair(folder: Path, redis_url: str, *extra: str, check: bool = True) -> dict:
    result = cli("repair", str(folder), "--redis", redis_url, "--json", *extra, check=check)
    return (
        json.loads(result.stdout)
        if result.stdout.strip()
        else {"stderr": result.stderr.decode(), "code": result.returncode}
    )


def test_flipped_byte_in_a_batch_file_loses_nothing(tmp_path, redis_server, stack, tokenizer_path):
    folder, command, url = run_campaign(tmp_path, redis_server.url, stack, tokenizer_path, "flip")
    files = record_files(folder)
    assert len(files) == ROWS // BATCH
    victim = files[2]
    flip_byte(victim, 0)  # the frame's magic number: nothing of this file reads back
    report = verify_campaign(folder)
    assert report["checks"]["damaged_file"]["count"] == 1

    # A folder holding only part of the campaign (other hosts' files elsewhere) is refused.
    elsewhere = tmp_path / "other-host"
    elsewhere.mkdir()
    for path in files[3:]:
        shutil.move(path, elsewhere / path.name)
    refused = repair(folder, redis_server.url, check=False)
    assert refused["refusal"] and "does not seem to hold the whole campaign" in refused["refusal"]
    assert victim.exists() and campaign(redis_server.url, "flip").progress().done == ROWS
    for path in elsewhere.iterdir():
        shutil.move(path, folder / "records" / path.name)

    plan = repair(folder, redis_server.url, "--dry-run")
    assert (plan["lost"], plan["recoverable"], plan["unrecoverable"], plan["moved"]) == (BATCH, 0, BATCH, [])
    assert victim.exists()

    done = repair(folder, redis_server.url)
    assert done["lost"] == BATCH and done["requeued"] == 0 and done["record_damaged"] == BATCH
    assert not victim.exists() and (folder / "damaged" / victim.name).exists()
    c = campaign(redis_server.url, "flip")
    assert c.failure_counts() == {RECORD_DAMAGED: BATCH}
    assert_exactly_once(redis_server.url, "flip", folder, expected=ROWS)  # accounted for, nothing stuck
    assert verify_campaign(folder)["ok"]
    assert "re-enqueued 0 failed" in cli("retry-failed", "flip", "--redis", redis_server.url).stdout.decode()

    # Rerunning the original command re-enqueues exactly the prompts whose records were lost.
    rerun = cli(*command).stdout.decode()
    assert f"re-enqueued after `repair` {BATCH}" in rerun and f"duplicate {ROWS}" in rerun
    stack.worker(servers=[url], out=folder.parent, redis_url=redis_server.url)
    wait_for_done(redis_server.url, "flip", stack)
    records = assert_exactly_once(redis_server.url, "flip", folder, expected=ROWS)
    assert len(records) == ROWS and c.progress().failed == 0
    assert verify_campaign(folder)["ok"]
    assert "nothing to repair" in cli("repair", str(folder), "--redis", redis_server.url).stdout.decode()


def wait_for_done(redis_url: str, name: str, stack) -> None:
    from eagle_synth.testing.harness import wait_for

    c = campaign(redis_url, name)
    wait_for(lambda: c.progress().done == ROWS, timeout=120, interval=0.2, what=f"{name} done again")


def test_damaged_shard_prompts_read_back_go_straight_to_the_queue(tmp_path, redis_server, stack, tokenizer_path):
    folder, _command, url = run_campaign(tmp_path, redis_server.url, stack, tokenizer_path, "shard")
    compact(folder, min_age=0)
    (shard,) = record_files(folder)
    flip_byte(shard, shard.stat().st_size - 1)  # the frame checksum: contents decode, the file fails
    assert len(list(salvage_records(shard))) == ROWS

    done = repair(folder, redis_server.url)
    assert done["lost"] == ROWS and done["requeued"] == ROWS and done["record_damaged"] == 0
    c = campaign(redis_server.url, "shard")
    assert c.progress().done == 0
    enqueued = sorted(key.decode() for key in c.client.smembers(c.keys.enqueued))
    assert sorted(item.key for item in queued_items(redis_server.url)) == enqueued  # every prompt, once
    stack.worker(servers=[url], out=folder.parent, redis_url=redis_server.url)
    wait_finished(redis_server.url, "shard", expected=ROWS, stack=stack)
    records = assert_exactly_once(redis_server.url, "shard", folder, expected=ROWS)
    assert len(records) == ROWS and c.progress().failed == 0
    assert verify_campaign(folder)["ok"]


def _record(key: str) -> Record:
    prompt = [248045, 846, 198, 1000 + len(key)]
    output = [7, 8, 9, 248046]
    return plain_record(key, key, prompt, output, finish_matched=248046)


def test_compact_keeps_sources_when_its_shard_does_not_read_back(tmp_path, monkeypatch):
    for b in range(4):
        write_record_file(tmp_path, campaign="c", batch=f"{b:016x}", records=[_record(f"k{b}{i}") for i in range(3)])
    before = sorted(r.key for r in iter_records(tmp_path))
    real_commit = ShardWriter.commit

    def commit_then_rot(self):
        path = real_commit(self)
        flip_byte(path, path.stat().st_size // 2)  # the disk returns something else than was written
        return path

    monkeypatch.setattr(compact_module.ShardWriter, "commit", commit_then_rot)
    result = compact(tmp_path, min_age=0)
    assert result.unverified_shards and result.shards == [] and result.files_compacted == 0
    scan = scan_campaign(tmp_path)
    assert scan.shards == [] and len(scan.batch_files) == 4
    assert sorted(r.key for r in iter_records(tmp_path)) == before

    monkeypatch.setattr(compact_module.ShardWriter, "commit", real_commit)
    result = compact(tmp_path, min_age=0)
    assert len(result.shards) == 1 and result.files_compacted == 4 and not result.unverified_shards
    assert sorted(r.key for r in iter_records(tmp_path)) == before


def test_a_truncated_files_readable_records_are_lost_keys_too(tmp_path):
    """The whole damaged file is moved aside, so the records before its damage are lost as well:
    each goes back on the queue (read back intact) or to record-damaged, none stays done."""
    import random
    import types

    from eagle_synth.ids import pack_ids
    from eagle_synth.payload import prompt_key
    from eagle_synth.tools.repair import plan_repair

    def big(n: int) -> Record:
        rng = random.Random(n)
        prompt, output = ([rng.randrange(100_000) for _ in range(3000)] for _ in range(2))
        key = prompt_key(prompt_ids=pack_ids(prompt), sampling={}, sample=0)
        return plain_record(key, str(n), prompt, output, finish_reason="length")

    records = [big(n) for n in range(200)]
    folder = tmp_path / "c"
    write_record_file(folder, campaign="c", batch="aaaa", records=records[:100])
    write_record_file(folder, campaign="c", batch="bbbb", records=records[100:])
    victim = next(path for path in record_files(folder) if path.name.startswith("aaaa-"))
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # the first records still read
    assert 0 < len(list(salvage_records(victim))) < 100
    stub = types.SimpleNamespace(
        name="c", settings=lambda: types.SimpleNamespace(sampling={}), done_keys=lambda: {r.key for r in records}
    )
    plan = plan_repair(folder, stub, force=True)
    assert sorted(plan.lost) == sorted(r.key for r in records[:100])
    assert len(plan.recoverable) == len(list(salvage_records(victim)))
    assert len(plan.recoverable) + len(plan.unrecoverable) == 100 and plan.healthy_records == 100
