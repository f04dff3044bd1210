"""The batch lease against a real Redis: one holder at a time, and a holder that cannot renew
knows it may have lost the batch."""

from __future__ import annotations

import pytest

from eagle_synth.harness import wait_for
from eagle_synth.settings import broker_settings
from eagle_synth.state.redis_client import connect
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
