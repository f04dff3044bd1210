"""The batch lease against a real Redis: one holder at a time, and a holder that cannot renew
knows it may have lost the batch."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace

import pytest
import redis

import eagle_synth.state.fence as fence_module
import workers.batch as batch_module
from eagle_synth.errors import BatchBusy, CommitUnsure, LeaseLost
from eagle_synth.settings import broker_settings
from eagle_synth.state.campaign import Campaign
from eagle_synth.state.fence import Fence
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import free_port, wait_for
from tests.tcp_forward import TcpForward
from workers.batch import _Run
from workers.lease import BatchLease


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


def _first_commit() -> Callable[[bytes], bool]:
    """Picks the first fenced commit a client sends (its MULTI ... EXEC holds the receipt)."""
    picked: list[bytes] = []

    def pick(chunk: bytes) -> bool:
        if not picked and b":receipts:" in chunk and chunk.endswith(b"EXEC\r\n"):
            picked.append(chunk)
            return True
        return False

    return pick


def _fence(campaign: Campaign, lease: BatchLease, batch: str) -> Fence:
    return Fence(lease.key, lease.holder, lease.ttl_ms, campaign.keys.claims, campaign.keys.receipts(batch))


@pytest.mark.parametrize("lost", ["reply", "request"])
def test_a_commit_without_a_reply_is_settled_by_reading_redis_back(redis_server, lost):
    """Through a proxy that loses the reply to the first fenced commit (Redis applied it) or the
    commit itself: redis-py reports either as a WatchError, which the fence tells apart from a
    changed lease (CommitUnsure), and `settle` says whether it applied. A try still on its way
    when `settle` found it unapplied can never apply after (the lease key changed under it)."""
    forward = TcpForward(free_port(), redis_server.port, **{f"lose_{lost}": _first_commit()})
    direct = connect(broker_settings(redis_url=redis_server.url))
    proxied = connect(broker_settings(redis_url=f"redis://127.0.0.1:{forward.port}"))
    keys = ["k1", "k2"]
    try:
        with BatchLease(direct, Campaign(direct, "lost").keys.lease("b1")) as lease:
            campaign = Campaign(proxied, "lost")
            fence = _fence(campaign, lease, "b1")
            with pytest.raises(CommitUnsure) as unsure:
                campaign.mark_done(keys, tokens_in=1, tokens_out=1, fence=fence)
            applied = lost == "reply"
            assert Campaign(direct, "lost").all_done(keys) is applied
            assert fence.settle(proxied, [unsure.value.receipt]) is applied
            # A late EXEC: watched and queued before the settle, sent after it.
            late = direct.pipeline(transaction=True)
            late.watch(lease.key)
            late.multi()
            late.sadd("late", "1")
            assert fence.settle(direct, ["another-try"]) is False
            with pytest.raises(redis.WatchError):
                late.execute()
            assert not direct.exists("late")
            # A changed lease is still LeaseLost, never CommitUnsure.
            direct.set(lease.key, "someone-else")
            with pytest.raises(LeaseLost):
                campaign.mark_done(["k3"], tokens_in=1, tokens_out=1, fence=fence)
            with pytest.raises(LeaseLost):
                fence.settle(proxied, ["not-applied"])
            # The receipt answers whoever holds the lease now: the lost try applied, or LeaseLost.
            if applied:
                assert fence.settle(proxied, [unsure.value.receipt]) is True
            else:
                with pytest.raises(LeaseLost):
                    fence.settle(proxied, [unsure.value.receipt])
    finally:
        forward.close()


@pytest.mark.parametrize(
    ("applied", "receipt_ttl_ms"),
    [(True, None), (False, None), (True, 1)],
    ids=["applied-before-the-reply-was-lost", "never-applied", "applied-and-its-receipt-expired"],
)
def test_a_mark_whose_reply_was_lost_stands_only_if_redis_applied_it(
    redis_server, monkeypatch, applied, receipt_ttl_ms
):
    """The batch's mark (workers/batch.py) through a proxy that loses the first commit's reply
    (Redis applied it) or the commit itself; the lease lapses before Redis is asked again. An
    applied mark stands (its record file stays); an unapplied one is LeaseLost (the file goes).
    Past the receipt's lifetime (Redis away longer than a day; here 1 ms), keys all done stand."""
    monkeypatch.setattr(batch_module, "MARK_RETRY_DELAY", 0.01)
    if receipt_ttl_ms is not None:
        monkeypatch.setattr(fence_module, "RECEIPT_TTL_MS", receipt_ttl_ms)
        monkeypatch.setattr(batch_module, "RECEIPT_TTL_MS", receipt_ttl_ms)
    lost = {"lose_reply" if applied else "lose_request": _first_commit()}
    forward = TcpForward(free_port(), redis_server.port, **lost)
    direct = connect(broker_settings(redis_url=redis_server.url))
    proxied = connect(broker_settings(redis_url=f"redis://127.0.0.1:{forward.port}"))
    campaign = Campaign(proxied, "lost-reply")
    keys = ["k1", "k2"]
    tries: list[str] = []

    def commit(campaign, payload, records, *, fence):
        tries.append("try")
        try:
            return _fenced_mark(campaign, payload, records, fence=fence)
        except CommitUnsure:
            direct.delete(fence.lease_key)  # the lease lapsed while Redis was out of reach
            raise

    try:
        with BatchLease(direct, campaign.keys.lease("b1")) as lease:
            run = SimpleNamespace(
                runner=SimpleNamespace(
                    followups=SimpleNamespace(commit=commit), stopping=threading.Event(), redis_client=proxied
                ),
                campaign=campaign,
                payload=SimpleNamespace(batch="b1"),
                fence=_fence(campaign, lease, "b1"),
            )
            run.settled = partial(_Run.settled, run)
            records = [SimpleNamespace(key=key) for key in keys]
            if applied:
                _Run.mark(run, records)  # type: ignore[arg-type]
            else:
                with pytest.raises(LeaseLost):
                    _Run.mark(run, records)  # type: ignore[arg-type]
    finally:
        forward.close()
    assert len(tries) == 1, "settled by reading back, not by a blind second try"
    assert Campaign(direct, "lost-reply").all_done(keys) is applied
