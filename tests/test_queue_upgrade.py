"""Upgrading mid-campaign from a version with one queue for every campaign: the batches left in
that queue move to their campaign's queue and are generated exactly once
(eagle_synth/state/queue_upgrade.py). Real redis-server, devserver and Celery worker."""

from __future__ import annotations

import json

from eagle_synth.priorities import message_priority
from eagle_synth.queue import campaign_queue, queue_lists
from eagle_synth.settings import DEFAULT_QUEUE, broker_settings
from eagle_synth.state.keys import CampaignKeys
from eagle_synth.state.redis_client import connect
from tests.conftest import chat_rows
from tests.helpers import assert_exactly_once, campaign, enqueue_rows, queued, wait_finished

# The reconciler looks every second; a batch would count as lost only after ten minutes, so what
# moves the old queue's batches here is the adoption, not the republishing of lost batches.
UPGRADE_ENV = {"EAGLE_SYNTH_RECONCILE_INTERVAL": "1", "EAGLE_SYNTH_RECONCILE_AFTER": "600"}


def as_earlier_version_left_it(client, campaign_name: str) -> int:
    """Move the campaign's queued messages to the single base queue, addressed to it, at kombu's
    default priority, as the workers of a version before per-campaign queues put them back."""
    moved = 0
    for source in queue_lists(campaign_queue(DEFAULT_QUEUE, campaign_name)):
        for raw in reversed(client.lrange(source, 0, -1)):
            message = json.loads(raw)
            message["properties"]["priority"] = 0
            message["properties"]["delivery_info"]["exchange"] = DEFAULT_QUEUE
            message["properties"]["delivery_info"]["routing_key"] = DEFAULT_QUEUE
            client.lrem(source, 1, raw)
            client.lpush(DEFAULT_QUEUE, json.dumps(message))
            moved += 1
    return moved


def test_batches_left_in_the_single_queue_of_an_earlier_version_are_generated_once(
    tmp_path, redis_server, stack, tokenizer_path
):
    enqueue_rows(tmp_path, redis_server.url, "upgraded", chat_rows(16), tokenizer=tokenizer_path, batch_size=4)
    client = connect(broker_settings(redis_url=redis_server.url))
    assert as_earlier_version_left_it(client, "upgraded") == 4
    client.lpush(DEFAULT_QUEUE, b"not a kombu message")  # someone else's: it stays where it is
    assert queued(client, "upgraded") == 0
    client.set(CampaignKeys("upgraded").priority, 7)  # set after the upgrade: the moved batches get it

    _, url = stack.devserver("--token-latency", "0.002")
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=UPGRADE_ENV)
    wait_finished(redis_server.url, "upgraded", expected=16, stack=stack, timeout=120)
    assert_exactly_once(redis_server.url, "upgraded", out / "upgraded", expected=16)
    assert campaign(redis_server.url, "upgraded").progress().failed == 0
    assert client.lrange(DEFAULT_QUEUE, 0, -1) == [b"not a kombu message"]


def test_an_adopted_message_is_addressed_to_its_campaigns_queue_at_its_priority(tmp_path, redis_server, tokenizer_path):
    """A restore after a worker takes it routes by the message's delivery_info: it must name the
    campaign's queue, not the old one, and sit in the list of the campaign's priority."""
    from eagle_synth.state.queue_upgrade import adopt_base_queue

    enqueue_rows(tmp_path, redis_server.url, "moved", chat_rows(8), tokenizer=tokenizer_path, batch_size=4)
    client = connect(broker_settings(redis_url=redis_server.url))
    as_earlier_version_left_it(client, "moved")
    assert adopt_base_queue(client, DEFAULT_QUEUE) == {"moved": 2}
    assert adopt_base_queue(client, DEFAULT_QUEUE) == {}, "a second round finds nothing"
    queue = campaign_queue(DEFAULT_QUEUE, "moved")
    messages = [json.loads(raw) for raw in client.lrange(queue_lists(queue)[message_priority(5)], 0, -1)]
    assert len(messages) == 2
    for message in messages:
        assert message["properties"]["delivery_info"]["routing_key"] == queue
        assert message["properties"]["delivery_info"]["exchange"] == queue
        assert message["properties"]["priority"] == message_priority(5)
