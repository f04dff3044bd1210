"""Demand-driven reservation (workers/reservation.py): a worker holds little more work than it
keeps in flight, so a campaign's last batches spread over the workers with free slots and two
workers end together. Real redis-server, devserver and Celery worker processes."""

from __future__ import annotations

import time
from dataclasses import dataclass

from eagle_synth.state.redis_client import connect
from eagle_synth.state.stranded import UNACKED_KEY
from tests.conftest import chat_rows
from tests.helpers import assert_exactly_once, enqueue_rows, queued, wait_finished
from workers.reservation import RESERVE_SHARE, Demand

# Batch threads per worker: eight per ticket, as the run had (16 batches for 2 x 4 tickets).
THREADS = 32
TICKETS = 4
BATCH = 4
# 48 batches: with one batch per thread reserved, the first worker to start took 32 of them, the
# second 16, and the first ran on alone for about 6 s.
PROMPTS = 192
# Each prompt holds a slot MAX_NEW x TOKEN_LATENCY = 0.4 s (the devserver's natural lengths are
# far longer, so every answer stops at the cap).
MAX_NEW = 20
TOKEN_LATENCY = 0.02
# Seconds the two workers' last records may lie apart: one prompt and a commit, with room for a
# loaded machine.
END_GAP = 3.0
# Batches both workers may hold at once while others wait: per worker, the in-flight ones, the
# reserve's, and one being fetched.
HELD_MOST = 10


@dataclass
class _Pool:
    waiting_prompts: int = 0
    free: int = 0
    total: int = 0

    def waiting(self) -> int:
        return self.waiting_prompts

    def free_tickets(self) -> int:
        return self.free

    def tickets(self) -> int:
        return self.total


def test_demand_asks_for_a_batch_only_while_the_line_is_short():
    pool = _Pool(total=64)
    held = [0]
    feeding = [0]
    demand = Demand(pool=pool, held=lambda: held[0], feeding=lambda: feeding[0], batch_size=lambda: 16)
    reserve = int(RESERVE_SHARE * 64)
    assert demand.reserve() == reserve == 16
    pool.free = 64
    assert demand.wants_more(), "an idle pool asks for work"
    # Four batches taken, none handed to the pool yet: 64 prompts on their way fill 64 free tickets,
    # the reserve still wants one more batch.
    held[0] = 4
    assert demand.wants_more()
    held[0] = 5
    assert not demand.wants_more(), "80 prompts coming cover 64 free tickets and a reserve of 16"
    # All in the pool: every ticket busy, 16 waiting: the reserve is full.
    feeding[0] = 5
    pool.free = 0
    pool.waiting_prompts = 16
    assert not demand.wants_more()
    pool.waiting_prompts = 15
    assert demand.wants_more(), "the line fell below its reserve"
    # A free ticket the waiting prompts cannot take (another model's server) asks for work.
    pool.free = 8
    pool.waiting_prompts = 100
    assert demand.wants_more()
    held[0] = 6  # ... until a batch is on its way for it
    assert not demand.wants_more()
    pool.free = 0
    held[0] = 5
    # Stragglers hold batches (and threads) but no waiting prompt: they do not stop a fetch.
    held[0] = feeding[0] = 40
    pool.waiting_prompts = 0
    assert demand.wants_more()


def test_two_workers_started_one_after_the_other_end_together(tmp_path, redis_server, stack, tokenizer_path):
    """The first worker to start takes no more than it keeps in flight; the second takes the rest
    as it frees slots; both end within END_GAP s, exactly once."""
    enqueue_rows(
        tmp_path,
        redis_server.url,
        "tail",
        chat_rows(PROMPTS),
        tokenizer=tokenizer_path,
        batch_size=BATCH,
        max_new_tokens=MAX_NEW,
    )
    _, url = stack.devserver("--token-latency", str(TOKEN_LATENCY), "--mean-output-tokens", "1000", "--slots", "8")
    out = tmp_path / "out"
    client = connect(_broker(redis_server))
    options = {"servers": [url], "out": out, "redis_url": redis_server.url, "concurrency": THREADS}
    stack.worker(name="first@test", args=["--inflight", str(TICKETS)], **options)
    held_most = 0
    deadline = time.monotonic() + 120
    while not client.hlen(UNACKED_KEY) and time.monotonic() < deadline:
        time.sleep(0.05)
    stack.worker(name="second@test", args=["--inflight", str(TICKETS)], **options)
    # While batches wait in the queue, the workers hold only what they keep in flight plus the
    # reserve: two or three batches each, where one per thread would be all 48.
    while queued(client, "tail") > 0 and time.monotonic() < deadline:
        held_most = max(held_most, client.hlen(UNACKED_KEY))
        time.sleep(0.05)
    wait_finished(redis_server.url, "tail", expected=PROMPTS, stack=stack, timeout=180)
    records = assert_exactly_once(redis_server.url, "tail", out / "tail", expected=PROMPTS)
    ends = {}
    for record in records.values():
        ends[record.worker] = max(ends.get(record.worker, 0.0), record.created_at)
    first_record = min(record.created_at for record in records.values())
    print("last record per worker, s after the first record:", {w: round(t - first_record, 2) for w, t in ends.items()})
    print("most batches held at once while the queue was not empty:", held_most)
    assert set(ends) == {"first@test", "second@test"}, ends
    assert abs(ends["first@test"] - ends["second@test"]) <= END_GAP, ends
    assert held_most <= HELD_MOST, f"{held_most} batches held while others waited in the queue"


def _broker(redis_server):
    from eagle_synth.settings import broker_settings

    return broker_settings(redis_url=redis_server.url)
