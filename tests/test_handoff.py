"""Host queues (workers/handoff.py): the worker that commits a conversation's turn k takes turn
k+1 while it lives; a dead worker's host queue goes to the others. Real redis-server,
devservers and Celery worker processes, two "hosts" = two workers with distinct node names and
a server each."""

from __future__ import annotations

import json

from eagle_synth.queue import campaign_queue, host_queue, queue_lists, queued_count
from eagle_synth.settings import DEFAULT_QUEUE, broker_settings
from eagle_synth.state.keys import HOST_QUEUES
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import wait_for
from tests.conftest import chat_rows
from tests.helpers import assert_exactly_once, enqueue_rows, wait_finished
from tests.test_conversations import affinity_rows, assert_conversations_accounted, wait_conversations_finished

# Share of a conversation's later turns that must run on the worker of the turn before: all of
# them but a few a saturated worker handed on after the delay on a loaded machine (by load alone,
# two workers would share about half).
SAME_HOST_SHARE = 0.9


def test_each_later_turn_runs_on_the_worker_of_the_turn_before(tmp_path, redis_server, stack, tokenizer_path):
    rows = affinity_rows(16)
    enqueue_rows(tmp_path, redis_server.url, "hosts", rows, tokenizer=tokenizer_path, batch_size=4, history="own")
    out = tmp_path / "out"
    for host in ("a", "b"):
        _, url = stack.devserver("--token-latency", "0.002", "--mean-output-tokens", "24")
        args = ["--render-processes", "1", "--inflight", "16"]
        stack.worker(servers=[url], out=out, redis_url=redis_server.url, name=f"{host}@test", args=args)
    wait_conversations_finished(redis_server.url, "hosts", stack=stack)
    records = assert_conversations_accounted(redis_server.url, "hosts", out / "hosts", rows)
    turns = sorted(records.values(), key=lambda r: (r.conversation, r.turn))
    pairs = [(a, b) for a, b in zip(turns, turns[1:]) if a.conversation == b.conversation]
    assert len(pairs) >= 2 * len(rows)
    same = sum(later.worker == earlier.worker for earlier, later in pairs) / len(pairs)
    print(f"later turns on the worker of the turn before: {same:.2f} of {len(pairs)}")
    assert {r.worker for r in turns} == {"a@test", "b@test"}, "conversations spread over both workers"
    assert same >= SAME_HOST_SHARE, same
    # Each worker's host queue was used and is empty now.
    client = connect(broker_settings(redis_url=redis_server.url))
    for node in ("a@test", "b@test"):
        assert queued_count(client, host_queue(DEFAULT_QUEUE, "hosts", node)) == 0


def test_a_dead_workers_host_queue_goes_to_the_live_ones(tmp_path, redis_server, stack, tokenizer_path):
    """Batches left in the host queue of a worker with no heartbeat (it died) are handed to the
    campaign's queue at once and generated elsewhere, exactly once."""
    enqueue_rows(tmp_path, redis_server.url, "orphans", chat_rows(24), tokenizer=tokenizer_path, batch_size=4)
    client = connect(broker_settings(redis_url=redis_server.url))
    # Every queued batch moved to the host queue of a worker that is gone, as its follow-ups would be.
    dead = host_queue(DEFAULT_QUEUE, "orphans", "gone@test")
    for source, target in zip(queue_lists(campaign_queue(DEFAULT_QUEUE, "orphans")), queue_lists(dead), strict=True):
        while client.lmove(source, target, "RIGHT", "LEFT") is not None:
            pass
    client.hset(HOST_QUEUES, dead, json.dumps([campaign_queue(DEFAULT_QUEUE, "orphans"), "gone@test"]))
    assert queued_count(client, dead) == 6
    _, url = stack.devserver("--token-latency", "0.002")
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, name="alive@test")
    wait_finished(redis_server.url, "orphans", expected=24, stack=stack, timeout=120)
    records = assert_exactly_once(redis_server.url, "orphans", out / "orphans", expected=24)
    assert {r.worker for r in records.values()} == {"alive@test"}
    wait_for(lambda: not client.hexists(HOST_QUEUES, dead), timeout=10, what="the empty dead host queue forgotten")
    assert queued_count(client, dead) == 0


def test_a_live_workers_own_host_queue_is_handed_on_after_the_delay(tmp_path, redis_server, tokenizer_path):
    """A next turn its live worker did not take within the delay goes to the campaign's queue,
    at the end taken next, addressed to it (a later restore returns it there)."""
    from eagle_synth.queue import make_celery, send_payload
    from eagle_synth.state.node_state import NodeState
    from workers.handoff import Handoff

    enqueue_rows(tmp_path, redis_server.url, "late", chat_rows(8), tokenizer=tokenizer_path, batch_size=4)
    settings = broker_settings(redis_url=redis_server.url)
    client = connect(settings)
    shared = campaign_queue(DEFAULT_QUEUE, "late")
    # The first queued batch again, as worker busy@test's next turns: on its host queue.
    from tests.helpers import queued_payloads

    payload = queued_payloads(redis_server.url, "late")[0]
    send_payload(make_celery(settings), DEFAULT_QUEUE, payload.encode(), host="busy@test")
    mine = host_queue(DEFAULT_QUEUE, "late", "busy@test")
    mine_list = next(name for name in queue_lists(mine) if client.llen(name))
    shared_list = queue_lists(shared)[queue_lists(mine).index(mine_list)]
    raw = client.lindex(mine_list, 0)
    assert json.loads(raw)["properties"]["delivery_info"]["routing_key"] == mine
    NodeState(client, "busy@test").reset([])  # alive: a heartbeat
    handoff = Handoff(client, node="busy@test", delay=0.5)
    assert handoff.sweep() == 0 and queued_count(client, mine) == 1, "handed on before the delay"
    wait_for(lambda: handoff.sweep() == 1, timeout=5, interval=0.1, what="the hand-off after the delay")
    assert queued_count(client, mine) == 0
    moved = json.loads(client.lindex(shared_list, -1))  # the end BRPOP takes next
    assert moved["properties"]["delivery_info"]["routing_key"] == shared
    assert moved["body"] == json.loads(raw)["body"]
    # Another live worker leaves it alone: only its owner (or, once dead, anyone) hands it on.
    send_payload(make_celery(settings), DEFAULT_QUEUE, payload.encode(), host="busy@test")
    NodeState(client, "other@test").reset([])
    other = Handoff(client, node="other@test", delay=0.0)
    assert other.sweep() == 0 and queued_count(client, mine) == 1
