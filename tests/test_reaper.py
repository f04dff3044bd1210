"""A dead worker's batches come back within minutes, not after the 6 h visibility timeout:
the reaper restores messages held without a live batch lease (eagle_synth/state/stranded.py,
workers/reaper.py), exactly once, as kombu would; `status` shows them stranded meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from eagle_synth.priorities import DEFAULT_PRIORITY, message_priority
from eagle_synth.queue import campaign_queue, make_celery, queue_lists
from eagle_synth.settings import DEFAULT_QUEUE, broker_settings
from eagle_synth.state.keys import CampaignKeys
from eagle_synth.state.node_state import all_nodes
from eagle_synth.state.redis_client import connect
from eagle_synth.state.stranded import (
    UNACKED_INDEX_KEY,
    UNACKED_KEY,
    held_batches,
    restore,
    stranded_batches,
    stranded_prompts,
)
from eagle_synth.testing.harness import wait_for
from tests.conftest import chat_rows
from tests.helpers import (
    assert_exactly_once,
    campaign,
    cli,
    devserver_stats,
    enqueue_rows,
    queued,
    queued_payloads,
    status_now,
    wait_finished,
)
from workers.reaper import Reaper

# The default-ish visibility timeout (an hour: nothing comes back by it within a test), with a
# short lease and reap threshold so the reaper acts within seconds.
REAPER_ENV = {
    "EAGLE_SYNTH_VISIBILITY_TIMEOUT": "3600",
    "EAGLE_SYNTH_LEASE_TTL": "6",
    "EAGLE_SYNTH_REAP_AFTER": "8",
    "EAGLE_SYNTH_REAP_INTERVAL": "1",
    "EAGLE_SYNTH_BACKOFF_MAX": "0.5",
}

# Fetch one message the way a worker does (kombu's basic_get without ack puts it in `unacked`),
# then die without acknowledging or restoring it, as a SIGKILLed host would.
_FETCH_AND_DIE = """
import os, sys
from eagle_synth.priorities import DEFAULT_PRIORITY, message_priority
from eagle_synth.queue import campaign_queue, make_celery, queue_lists
from eagle_synth.settings import DEFAULT_QUEUE, broker_settings
app = make_celery(broker_settings(redis_url=sys.argv[1]))
with app.connection_for_read() as conn:
    message = conn.default_channel.basic_get(sys.argv[2])
    print(message.delivery_tag if message is not None else "", flush=True)
    os._exit(0)
"""


def queue_of(campaign_name: str) -> str:
    return campaign_queue(DEFAULT_QUEUE, campaign_name)


def default_list(campaign_name: str) -> str:
    """The list a message of a campaign of the default priority waits in."""
    return queue_lists(queue_of(campaign_name))[message_priority(DEFAULT_PRIORITY)]


def fetch_and_die(redis_url: str, queue: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _FETCH_AND_DIE, redis_url, queue], capture_output=True, text=True, timeout=60, check=True
    )
    tag = out.stdout.strip()
    assert tag, f"no message to fetch: {out.stderr}"
    return tag


def test_dead_worker_batches_come_back_long_before_the_visibility_timeout(
    tmp_path, redis_server, stack, tokenizer_path
):
    enqueue_rows(tmp_path, redis_server.url, "reap", chat_rows(24), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--token-latency", "0.01", "--mean-output-tokens", "60", "--slots", "8")
    out = tmp_path / "out"
    first = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=REAPER_ENV, name="first@test")
    c = campaign(redis_server.url, "reap")

    def busy() -> bool:
        return any(n.get("inflight_by_campaign", {}).get("reap") for n in all_nodes(c.client))

    wait_for(busy, timeout=60, what="a batch in flight")
    first.kill()  # the whole worker, main process and pool: nothing is acked or put back
    killed_at = time.monotonic()
    held = held_batches(c.client, fetched_before=time.time() + 1)
    assert held and {h.campaign for h in held} == {"reap"}
    assert c.progress().done < 24

    # With no worker alive, status shows the held prompts as stranded once leases lapse.
    def status() -> dict:
        return json.loads(cli("status", "reap", "--json", "--redis", redis_server.url, env=REAPER_ENV).stdout)

    reap_after = float(REAPER_ENV["EAGLE_SYNTH_REAP_AFTER"])
    wait_for(
        lambda: status_now(redis_server.url, "reap", reap_after=reap_after)["stranded"],
        timeout=60,
        interval=0.2,
        what="status to show stranded prompts",
    )
    shown = status()  # the CLI, once they are there: they stay stranded while no worker runs
    pending_in_held = sum(len(set(h.keys) - c.finished_keys(list(h.keys))) for h in held)
    assert shown["stranded"] == pending_in_held
    assert shown["queued"] + shown["inflight"] + shown["stranded"] + shown["done"] + shown["failed"] == 24

    second = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=REAPER_ENV, name="second@test")
    wait_finished(redis_server.url, "reap", expected=24, stack=stack, timeout=120)
    assert time.monotonic() - killed_at < 300, "well before the 3600 s visibility timeout"
    records = assert_exactly_once(redis_server.url, "reap", out / "reap", expected=24)
    assert c.progress().failed == 0
    assert {r.worker for r in records.values()} >= {"second@test"}
    assert "restored batch" in second.log()
    wait_for(lambda: c.client.hlen(UNACKED_KEY) == 0, timeout=30, what="no message left unacked")
    assert status()["stranded"] == 0


def test_restore_is_exactly_once_and_as_kombu_would(tmp_path, redis_server, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "once", chat_rows(8), tokenizer=tokenizer_path, batch_size=4)
    client = connect(broker_settings(redis_url=redis_server.url))
    before = {p.batch: p for p in queued_payloads(redis_server.url)}
    tag = fetch_and_die(redis_server.url, queue_of("once"))
    assert queued(client, "once") == 1 and client.hexists(UNACKED_KEY, tag)

    assert stranded_batches(client, reap_after=120) == [], "a message fetched just now is not stranded"
    (held,) = stranded_batches(client, reap_after=0, with_entries=True)
    assert held.tag == tag and held.campaign == "once" and len(held.keys) == 4

    # A live lease keeps it where it is, even for a caller that saw it stranded a moment ago.
    lease = CampaignKeys("once").lease(held.batch)
    client.set(lease, "somehost|1", px=5000)
    assert stranded_batches(client, reap_after=0) == []
    assert not restore(client, held, queue_name=queue_of("once"))
    client.delete(lease)

    # Two reapers that both saw it stranded: one restores, the other finds nothing to do.
    assert restore(client, held, queue_name=queue_of("once"))
    assert not restore(client, held, queue_name=queue_of("once"))
    assert not client.hexists(UNACKED_KEY, tag) and client.zscore(UNACKED_INDEX_KEY, tag) is None
    after = queued_payloads(redis_server.url)
    assert len(after) == 2
    restored = next(p for p in after if p.batch == held.batch)
    assert [i.key for i in restored.items] == [i.key for i in before[held.batch].items]
    assert [i.ids for i in restored.items] == [i.ids for i in before[held.batch].items]
    # Back at the consuming end (as kombu's own restore), marked redelivered.
    message = json.loads(client.lindex(default_list("once"), -1))
    assert message["headers"]["redelivered"] and message["properties"]["delivery_info"]["redelivered"]


def test_acknowledged_meanwhile_is_not_restored(tmp_path, redis_server, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "acked", chat_rows(4), tokenizer=tokenizer_path, batch_size=4)
    client = connect(broker_settings(redis_url=redis_server.url))
    tag = fetch_and_die(redis_server.url, queue_of("acked"))
    (held,) = stranded_batches(client, reap_after=0, with_entries=True)
    client.zrem(UNACKED_INDEX_KEY, tag)  # what kombu's ack does
    client.hdel(UNACKED_KEY, tag)
    assert not restore(client, held, queue_name=queue_of("acked"))
    assert queued(client, "acked") == 0


def test_priority_message_goes_back_to_its_priority_list(redis_server):
    from eagle_synth.payload import TASK_NAME, PromptItem, TaskPayload

    settings = broker_settings(redis_url=redis_server.url)
    payload = TaskPayload(
        campaign="pri",
        batch="b1",
        sampling={"max_new_tokens": 4},
        items=[PromptItem(key="k1", row_id="r", sample=0, ids=[1, 2, 3])],
    )
    make_celery(settings).send_task(
        TASK_NAME, args=[payload.encode()], queue=queue_of("pri"), serializer="msgpack", priority=7
    )
    client = connect(settings)
    priority_list = queue_of("pri") + "\x06\x167"  # kombu's list for message priority 7
    assert client.llen(priority_list) == 1
    fetch_and_die(redis_server.url, queue_of("pri"))
    assert client.llen(priority_list) == 0
    (held,) = stranded_batches(client, reap_after=0, with_entries=True)
    assert restore(client, held, queue_name=queue_of("pri"))
    assert client.llen(priority_list) == 1 and client.llen(queue_of("pri")) == 0


def test_one_reaper_sweeps_per_round(tmp_path, redis_server, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "lock", chat_rows(8), tokenizer=tokenizer_path, batch_size=4)
    client = connect(broker_settings(redis_url=redis_server.url))
    fetch_and_die(redis_server.url, queue_of("lock"))
    fetch_and_die(redis_server.url, queue_of("lock"))
    assert queued(client, "lock") == 0
    first = Reaper(client, node="a@test", queue=DEFAULT_QUEUE, interval=30, reap_after=0)
    second = Reaper(client, node="b@test", queue=DEFAULT_QUEUE, interval=30, reap_after=0)
    assert first.sweep() == 2
    fetch_and_die(redis_server.url, queue_of("lock"))
    assert second.sweep() == 0, "the round's lock is held: only one reaper sweeps"
    assert queued(client, "lock") == 1
    assert stranded_prompts(client, reap_after=0) == {"lock": 4}


def test_restored_copy_of_a_finished_batch_does_nothing(tmp_path, redis_server, stack, tokenizer_path):
    """The window where a finishing task released its lease but did not ack yet: a restored
    copy finds every key done; nothing is sent, no record file is written."""
    enqueue_rows(tmp_path, redis_server.url, "late-ack", chat_rows(8), tokenizer=tokenizer_path, batch_size=4)
    client = connect(broker_settings(redis_url=redis_server.url))
    pending = queued_payloads(redis_server.url)  # copies of the real messages, as published
    _, url = stack.devserver()
    out = tmp_path / "out"
    worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=REAPER_ENV)
    wait_finished(redis_server.url, "late-ack", expected=8, stack=stack)
    prompts_before = devserver_stats(url)["prompts"]
    files_before = sorted((out / "late-ack" / "records").iterdir())

    worker.stop()

    # The same batch, held (unacked, no lease) by a worker that died before acking it.
    make_celery(broker_settings(redis_url=redis_server.url)).send_task(
        "eagle_synth.generate_batch", args=[pending[0].encode()], queue=queue_of("late-ack"), serializer="msgpack"
    )
    tag = fetch_and_die(redis_server.url, queue_of("late-ack"))
    # Fetched a minute ago: past REAP_AFTER, far inside the visibility timeout (kombu leaves it).
    client.zadd(UNACKED_INDEX_KEY, {tag: time.time() - 60}, xx=True)
    again = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=REAPER_ENV)
    wait_for(lambda: "restored batch" in again.log(), timeout=60, what="the reaper to restore the copy")
    wait_for(lambda: "0 written, 4 already done" in again.log(), timeout=60, what="the copy to be skipped")
    # The ack follows the log line: wait for the state, the copy's message gone from `unacked`.
    wait_for(lambda: not client.hexists(UNACKED_KEY, tag), timeout=30, what="the skipped copy to be acked")
    assert devserver_stats(url)["prompts"] == prompts_before
    assert sorted((out / "late-ack" / "records").iterdir()) == files_before
    assert_exactly_once(redis_server.url, "late-ack", out / "late-ack", expected=8)


def test_status_shows_a_dead_holders_batches_stranded_at_once(tmp_path, redis_server, stack, tokenizer_path):
    """With the default lease (60 s) and reap threshold (120 s), a SIGKILLed worker's batches
    read `stranded` in `status` within seconds: its process is gone on this host."""
    enqueue_rows(tmp_path, redis_server.url, "dead", chat_rows(24), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--token-latency", "0.05", "--mean-output-tokens", "200", "--slots", "8")
    worker = stack.worker(servers=[url], out=tmp_path / "out", redis_url=redis_server.url)
    c = campaign(redis_server.url, "dead")
    wait_for(
        lambda: any(n.get("inflight_by_campaign", {}).get("dead") for n in all_nodes(c.client)),
        timeout=60,
        what="a batch in flight",
    )
    worker.kill()
    killed_at = time.monotonic()
    held = held_batches(c.client, fetched_before=time.time() + 1)
    pending_in_held = sum(len(set(h.keys) - c.finished_keys(list(h.keys))) for h in held)
    assert pending_in_held > 0
    wait_for(
        lambda: status_now(redis_server.url, "dead")["stranded"] == pending_in_held,
        timeout=20,
        interval=0.2,
        what="status to show the dead worker's prompts stranded",
    )
    assert time.monotonic() - killed_at < 20, "long before the 60 s lease lapses"
    shown = status_now(redis_server.url, "dead")
    assert shown["inflight"] == 0, "a dead node's in-flight count is not shown"
    assert shown["queued"] + shown["stranded"] + shown["done"] + shown["failed"] == 24


def test_a_lease_of_a_host_without_a_live_worker_is_stranded(tmp_path, redis_server, tokenizer_path, monkeypatch):
    """A holder on another host is dead once no worker heartbeat lives there; a fetched message
    without a lease is stranded at once while no worker is alive anywhere."""
    from eagle_synth.state.node_state import NodeState

    enqueue_rows(tmp_path, redis_server.url, "far", chat_rows(4), tokenizer=tokenizer_path, batch_size=4)
    client = connect(broker_settings(redis_url=redis_server.url))
    fetch_and_die(redis_server.url, queue_of("far"))
    assert stranded_prompts(client) == {"far": 4}, "no lease and no worker alive: no one can hold it"
    (held,) = held_batches(client, fetched_before=time.time() + 1)
    client.set(held.lease_key, "gpu-far|4242|otherboot|abcd", px=60_000)
    assert stranded_prompts(client) == {"far": 4}, "no heartbeat on gpu-far"
    monkeypatch.setenv("EAGLE_SYNTH_HOSTNAME", "gpu-far")
    NodeState(client, "eagle-synth@gpu-far").reset(["http://127.0.0.1:1"])
    assert stranded_prompts(client) == {}, "gpu-far's worker is alive: its lease stands"
    # A holder of this very boot whose process is gone is dead whatever its host's heartbeat.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    client.set(held.lease_key, holder_id_of(int(gone.stdout), host="gpu-far"), px=60_000)
    assert stranded_prompts(client) == {"far": 4}


def holder_id_of(pid: int, *, host: str) -> str:
    from eagle_synth.processes import pid_space

    return f"{host}|{pid}|{pid_space()}|test"
