"""Reservation: a worker takes a batch off the queue only while its in-flight pool needs one.

A worker runs `--concurrency` batch threads, eight open prompts per ticket by default: with
heavy-tailed outputs a batch with one straggler left holds its thread, and the pool's line must
never run dry (docs/workers.md "Keeping the GPU full"). Celery reserves one batch per thread
(prefetch multiplier 1), so the first worker to start used to take eight times the prompts it
could keep in flight, and at a campaign's end the other workers idled while it worked through
them (two workers on one vLLM ended 7.5 s apart, the last seconds at half the slots).

So the threads stay, but the consumer asks the broker for a further batch only while the
prompts waiting in the pool's line, plus a batch's worth for each batch taken but not yet handed
to the pool, are fewer than its free tickets plus a reserve (RESERVE_SHARE of its tickets, at
least one batch), or while a ticket is free that neither a waiting prompt nor a batch on its way
can take (a worker with servers of two models, one of whose campaigns fills the line). The line
never runs dry, and the rest of the queue stays in Redis for whichever worker frees a slot first. EAGLE_SYNTH_DEMAND_RESERVATION=0 restores one batch per
thread (for measuring what it changes).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import MethodType
from typing import Any, Protocol

from eagle_synth.payload import DEFAULT_BATCH_SIZE

# Prompts kept waiting in the pool's line beyond its free tickets, as a share of its tickets: a
# freed ticket finds its next prompt without waiting for a batch to be fetched and checked (a few
# ms), as the servers' own queue holds AUTO_INFLIGHT_FACTOR - 1 of their capacity.
RESERVE_SHARE = 0.25
# Seconds between the consumer loop's looks at the pool's demand: the loop otherwise sleeps up to
# a second between broker events, and a hungry pool must not wait that long for its next batch.
WAKE_INTERVAL = 0.05
# Environment variable turning demand-driven reservation off ("0").
RESERVATION_ENV = "EAGLE_SYNTH_DEMAND_RESERVATION"


def reservation_enabled() -> bool:
    """False only when EAGLE_SYNTH_DEMAND_RESERVATION is "0"."""
    return os.environ.get(RESERVATION_ENV, "1").strip() != "0"


class PoolLoad(Protocol):
    """What the reservation reads of the in-flight pool (workers/inflight.py InflightPool)."""

    def waiting(self) -> int: ...

    def free_tickets(self) -> int: ...

    def tickets(self) -> int: ...


@dataclass
class Demand:
    """Whether the worker should take one more batch now.

    Parameters:
        pool: the in-flight pool (waiting prompts, free and total tickets).
        held: batches the consumer holds (reserved or running: Celery's reserved requests).
        feeding: held batches whose prompts the pool already has (workers/batch.py BatchRunner).
        batch_size: prompts of a recent batch, counted for each batch not yet in the pool.
    """

    pool: PoolLoad
    held: Callable[[], int]
    feeding: Callable[[], int]
    batch_size: Callable[[], int] = lambda: DEFAULT_BATCH_SIZE

    def reserve(self) -> int:
        """Prompts to keep waiting beyond the free tickets."""
        size = max(1, self.batch_size())
        return max(size, math.ceil(RESERVE_SHARE * self.pool.tickets()))

    def wants_more(self) -> bool:
        size = max(1, self.batch_size())
        on_the_way = max(0, self.held() - self.feeding()) * size
        free = self.pool.free_tickets()
        if free > on_the_way:
            # A free ticket no waiting prompt may take (a server of another campaign's model)
            # and no batch coming for it: it would idle.
            return True
        return self.pool.waiting() + on_the_way < free + self.reserve()


def gate_consumption(qos: Any, wants_more: Callable[[], bool]) -> None:
    """Make the kombu channel `qos` (whose `can_consume` kombu's Redis transport asks before each
    BRPOP) consume only while Celery's own prefetch limit and `wants_more` both allow it."""
    allowed_by_celery = qos.can_consume

    def can_consume(self: Any) -> bool:
        return bool(allowed_by_celery()) and wants_more()

    qos.can_consume = MethodType(can_consume, qos)
