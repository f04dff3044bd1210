"""The batch lease against a real Redis: one holder at a time, and a holder that cannot renew
knows it may have lost the batch."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import redis

import workers.batch as batch_module
from eagle_synth.harness import wait_for
from eagle_synth.settings import broker_settings
from eagle_synth.state.campaign import Campaign
from eagle_synth.state.fence import Fence, LeaseLost
from eagle_synth.state.redis_client import connect
from workers.batch import _Run
from workers.lease import BatchBusy, BatchLease


def test_second_holder_in_the_same_process_waits(redis_server):
    client = connect(broker_settings(redis_url=redis_server.url))
    with BatchLease(client, "lease:a"), pytest.raises(BatchBusy):
        BatchLease(client, "lease:a").__enter__()
    with BatchLease(client, "lease:a") as again:
        assert not again.took_over


def test_a_lease_taken_away_is_lost(redis_server, monkeypatch):
    import workers.lease as lease_module

    monkeypatch.setattr(lease_module, "RENEW_EVERY", 0.05)
    client = connect(broker_settings(redis_url=redis_server.url))
    with BatchLease(client, "lease:b", ttl=5) as lease:
        assert not lease.lost
        client.set("lease:b", "someone-else")  # the key lapsed and another host took the batch
        wait_for(lambda: lease.lost, timeout=5, what="the holder to notice")


def test_renewals_failing_for_most_of_a_ttl_count_as_lost(redis_server, monkeypatch):
    import workers.lease as lease_module

    monkeypatch.setattr(lease_module, "RENEW_EVERY", 0.05)
    client = connect(broker_settings(redis_url=redis_server.url))
    with BatchLease(client, "lease:c", ttl=1.0) as lease:
        redis_server.stop()  # renewals now fail
        wait_for(lambda: lease.lost, timeout=5, what="the lease to count as lost")


def _fenced_mark(campaign, payload, records, *, fence):
    return campaign.mark_done([record.key for record in records], tokens_in=1, tokens_out=1, fence=fence)


@pytest.mark.parametrize("applied", [True, False], ids=["applied-before-redis-went-away", "never-applied"])
def test_a_mark_whose_reply_was_lost_stands_only_if_redis_applied_it(redis_server, monkeypatch, applied):
    """Redis stops right after a try of the mark (no reply) and the lease lapses while it is
    down, so the next try's fence fails. If the lost try applied, the keys are done and the
    batch's file is their only record: the mark stands. If not, LeaseLost (the file goes)."""
    monkeypatch.setattr(batch_module, "MARK_RETRY_DELAY", 0.01)
    client = connect(broker_settings(redis_url=redis_server.url))
    campaign = Campaign(client, "lost-reply")
    keys = ["k1", "k2"]
    tries: list[str] = []

    def commit(campaign, payload, records, *, fence):
        tries.append("try")
        if len(tries) == 1:
            if applied:
                _fenced_mark(campaign, payload, records, fence=fence)
            client.delete(fence.lease_key)  # the lease lapsed while Redis was down
            raise redis.ConnectionError("Connection closed by server.")
        return _fenced_mark(campaign, payload, records, fence=fence)

    with BatchLease(client, campaign.keys.lease("b1")) as lease:
        run = SimpleNamespace(
            runner=SimpleNamespace(followups=SimpleNamespace(commit=commit), stopping=threading.Event()),
            campaign=campaign,
            payload=SimpleNamespace(batch="b1"),
            fence=Fence(lease.key, lease.holder, lease.ttl_ms, campaign.keys.claims),
        )
        records = [SimpleNamespace(key=key) for key in keys]
        if applied:
            _Run.mark(run, records)  # type: ignore[arg-type]
        else:
            with pytest.raises(LeaseLost):
                _Run.mark(run, records)  # type: ignore[arg-type]
    assert len(tries) == 2
    assert campaign.all_done(keys) is applied
