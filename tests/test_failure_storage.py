"""Failures at scale, on a real Redis: stored compactly, read in both layouts, retried in batches
of the campaign's size with each prompt's own seed, and the backlog's byte cap."""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from eagle_synth.payload import PromptItem
from eagle_synth.queue import make_celery
from eagle_synth.sampling import SamplingParams
from eagle_synth.settings import broker_settings
from eagle_synth.state.campaign import FAILURE_MAGIC, Campaign, CampaignSettings, Failure
from eagle_synth.state.keys import WORKERS_INDEX, worker_key
from eagle_synth.state.node_state import NodeState, all_nodes
from eagle_synth.state.redis_client import connect
from eagle_synth.tools.failures import failure_summary, write_failures_json
from tests.helpers import cli, queued_payloads

SAMPLING = SamplingParams(max_new_tokens=32, temperature=0.7, seed=11)


def _campaign(redis_url: str, name: str, *, batch_size: int = 16) -> Campaign:
    c = Campaign(connect(broker_settings(redis_url=redis_url)), name)
    c.register(
        CampaignSettings(
            name=name,
            tokenizer_path="/tok",
            tokenizer_fingerprint="f",
            chat_template_hash="h",
            sampling=SAMPLING.to_dict(),
            batch_size=batch_size,
        )
    )
    return c


def _item(i: int, *, tokens: int = 50) -> PromptItem:
    return PromptItem(
        key=f"{i:032x}",
        row_id=f"row{i}",
        sample=0,
        ids=[(i * 7919 + t * 104729) % 150_000 for t in range(tokens)],
        seed=1_000_003 * i + 17,  # distinct per prompt, as sample_seed makes them
        source=f"in.jsonl:{i + 1}",
    )


def _fail(c: Campaign, item: PromptItem, reason: str = "server-error") -> None:
    sampling = {**SAMPLING.for_server(), "sampling_seed": item.seed}
    c.record_failure(item, reason=reason, message="boom", sampling=sampling, worker="w1")


def test_a_failure_is_stored_compactly_and_reads_back_whole(redis_server):
    c = _campaign(redis_server.url, "compact")
    item = _item(1, tokens=2000)
    _fail(c, item)
    raw = c.client.hget(c.keys.failed, item.key)
    assert raw.startswith(FAILURE_MAGIC + b"server-error\n")
    old = Failure.decode(raw)
    assert old.item["ids"] == item.ids and old.item["seed"] == item.seed and old.message == "boom"
    as_json = len(json.dumps(msgspec.structs.asdict(old)))  # the layout older versions stored
    assert len(raw) * 2 < as_json, f"compact {len(raw)} B is not well under JSON's {as_json} B"
    assert c.failure_reasons([item.key, "absent"]) == ["server-error", None]
    # The Lua reason reader: marking it done drops its count.
    c.mark_done([item.key], tokens_in=1, tokens_out=1)
    assert c.failure_counts() == {} and c.progress().failed == 0


def test_old_json_failures_are_listed_retried_and_counted(redis_server):
    """A campaign whose failures were stored as JSON before the compact layout still works."""
    c = _campaign(redis_server.url, "legacy", batch_size=4)
    items = [_item(i) for i in range(6)]
    for item in items:
        failure = Failure(
            reason="bad-request",
            message="old",
            item=item.to_replay(),
            sampling={**SAMPLING.for_server(), "sampling_seed": item.seed},
            at=time.time(),
        )
        c.client.hset(c.keys.failed, item.key, json.dumps(msgspec.structs.asdict(failure)))
        c.client.hincrby(c.keys.failed_reasons, "bad-request", 1)
    _fail(c, _item(99), reason="server-error")  # one in the new layout beside them
    report = failure_summary(c, examples=2)
    assert report["failed"] == 7 and report["by_reason"]["bad-request"]["count"] == 6
    assert [p["key"] for p in report["by_reason"]["bad-request"]["prompts"]] == [items[0].key, items[1].key]
    listing = json.loads(cli("failed", "legacy", "--json", "--redis", redis_server.url).stdout)
    assert listing["failed"] == 7
    assert sorted(p["key"] for p in listing["by_reason"]["bad-request"]["prompts"]) == [i.key for i in items]
    out = cli("retry-failed", "legacy", "--reason", "bad-request", "--redis", redis_server.url).stdout.decode()
    assert "re-enqueued 6 failed" in out
    payloads = queued_payloads(redis_server.url)
    assert sorted(len(p.items) for p in payloads) == [2, 4]  # the campaign's batch size, 4
    assert c.failure_counts() == {"server-error": 1}


def test_retry_failed_batches_keep_each_seed_and_leave_no_liveness_keys(redis_server):
    c = _campaign(redis_server.url, "seeds", batch_size=16)
    items = [_item(i) for i in range(40)]
    for item in items:
        _fail(c, item)
    out = cli("retry-failed", "seeds", "--redis", redis_server.url).stdout.decode()
    assert "re-enqueued 40 failed" in out
    payloads = queued_payloads(redis_server.url)
    assert sorted(len(p.items) for p in payloads) == [8, 16, 16]
    by_key = {item.key: item for item in items}
    for payload in payloads:
        assert payload.sampling == SAMPLING.for_server()  # the batch's: no per-sample seed in it
        for queued in payload.items:
            assert queued.seed == by_key[queued.key].seed and queued.ids == by_key[queued.key].ids
            assert payload.sampling_for(queued)["sampling_seed"] == by_key[queued.key].seed
    assert list(c.client.scan_iter(match=c.keys.producer("*"))) == []
    assert c.progress().failed == 0 and c.failure_counts() == {}
    assert c.client.hlen(c.keys.outbox) == 0


def test_failed_lists_stream_every_failure(redis_server, tmp_path):
    c = _campaign(redis_server.url, "many")
    failed: dict[str, list[str]] = {}
    for i in range(1200):  # more than one HSCAN step
        item, reason = _item(i, tokens=5), "bad-request" if i % 3 else "server-error"
        _fail(c, item, reason=reason)
        failed.setdefault(reason, []).append(item.key)
    with open(tmp_path / "out.json", "w") as out:
        write_failures_json(c, out, examples=3)
    streamed = json.loads((tmp_path / "out.json").read_text())
    assert streamed["failed"] == 1200
    for reason, keys in failed.items():
        assert streamed["by_reason"][reason]["count"] == len(keys)
        assert sorted(p["key"] for p in streamed["by_reason"][reason]["prompts"]) == sorted(keys)
    summary = failure_summary(c, examples=3)
    assert {r: g["count"] for r, g in summary["by_reason"].items()} == {"bad-request": 800, "server-error": 400}
    lowest = sorted(streamed["by_reason"]["server-error"]["prompts"], key=lambda p: p["key"])[:3]
    assert summary["by_reason"]["server-error"]["prompts"] == lowest


class _Waited(Exception):
    pass


def test_enqueue_waits_while_the_backlog_holds_more_bytes_than_its_cap(redis_server):
    from producer.publisher import Publisher

    c = _campaign(redis_server.url, "bytes")
    settings = broker_settings(redis_url=redis_server.url)
    seen: list[dict] = []

    def on_wait(pending, **held):
        seen.append(held)
        raise _Waited

    publisher = Publisher(
        campaign=c,
        app=make_celery(settings),
        queue=settings.queue,
        sampling=SAMPLING.for_server(),
        batch_size=8,
        max_backlog_bytes=200_000,
        on_wait=on_wait,
    )
    publisher.claim([_item(i, tokens=2000) for i in range(16)])  # ~2 batches: under the cap
    assert not seen
    with pytest.raises(_Waited):
        publisher.claim([_item(i, tokens=2000) for i in range(100, 400)])
    assert seen and seen[0]["held_bytes"] > seen[0]["max_bytes"] == 200_000
    assert publisher.backlog_bytes() > 200_000
    publisher.close()


def test_status_finds_workers_through_the_index_and_drops_expired_ones(redis_server):
    client = connect(broker_settings(redis_url=redis_server.url))
    NodeState(client, "w1@a").reset(["http://a"])
    NodeState(client, "w2@b").reset(["http://b"])
    client.zadd(WORKERS_INDEX, {"gone@c": time.time() - 1})  # its heartbeat expired
    client.delete(worker_key("w2@b"))  # stopped: its hash went before its index entry
    assert [n["node"] for n in all_nodes(client)] == ["w1@a"]
    assert client.zscore(WORKERS_INDEX, "gone@c") is None
