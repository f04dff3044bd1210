"""workers/memory.py: the batch threads start up front, not one by one as the queue fills."""

from __future__ import annotations

from celery.concurrency.thread import TaskPool

from workers.memory import start_pool_threads


def test_every_batch_thread_starts_at_once() -> None:
    pool = TaskPool(limit=6)
    try:
        assert len(pool.executor._threads) == 0  # ThreadPoolExecutor starts threads lazily
        assert start_pool_threads(pool) == 6
        assert start_pool_threads(pool) == 6  # idempotent: never past the limit
    finally:
        pool.executor.shutdown(wait=True)


def test_other_pools_are_left_alone() -> None:
    assert start_pool_threads(None) == 0
    assert start_pool_threads(object()) == 0
