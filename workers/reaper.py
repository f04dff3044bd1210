"""The reaper: puts back batches a dead worker was holding, within minutes instead of hours.

A dead host (SIGKILL, power loss) leaves its batches in kombu's `unacked` hash until the
visibility timeout (6 h). Each REAP_INTERVAL one worker (whoever takes the Redis lock) restores
every batch fetched over REAP_AFTER s ago whose lease lapsed (the rule and the atomic restore:
eagle_synth.state.stranded): back about LEASE_TTL + REAP_INTERVAL after the host died.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import KW_ONLY, dataclass
from typing import Any

import redis
from celery import bootsteps

from eagle_synth.queue import campaign_queue
from eagle_synth.settings import TIMINGS, broker_settings
from eagle_synth.state.keys import REAPER_LOCK
from eagle_synth.state.redis_client import connect
from eagle_synth.state.stranded import REAP_AFTER, restore, stranded_batches
from workers.background import every

log = logging.getLogger("eagle_synth.reaper")

# Seconds between sweeps (cluster-wide: the lock lives this long, so one worker sweeps per round).
REAP_INTERVAL = TIMINGS.reap_interval


def won_round(client: redis.Redis, lock: str, node: str, interval: float) -> bool:
    """Take a cluster-wide round's lock (it lives `interval` s, naming `node` for people looking)."""
    return bool(client.set(lock, node, nx=True, px=max(int(interval * 1000), 1)))


@dataclass
class Reaper:
    """Sweeps for stranded batches and restores them.

    Parameters:
        client, node: the broker's Redis; this worker's node name (held in the round's lock).
        queue: the base queue name (a campaign's queue, made from it, routes a message whose
            exchange binding is gone).
        interval: seconds between sweeps, and the lock's lifetime.
        reap_after: seconds since fetch before a message without a live lease is stranded.
    """

    client: redis.Redis
    _: KW_ONLY
    node: str
    queue: str
    interval: float = REAP_INTERVAL
    reap_after: float = REAP_AFTER

    def sweep(self) -> int:
        """One sweep if this worker wins the round's lock; returns how many batches it restored."""
        if not won_round(self.client, REAPER_LOCK, self.node, self.interval):
            return 0
        restored = 0
        for held in stranded_batches(self.client, reap_after=self.reap_after, with_entries=True):
            if restore(self.client, held, queue_name=campaign_queue(self.queue, held.campaign)):
                restored += 1
                log.warning(
                    "restored batch %s of campaign %s (%d prompts): its worker held it without a "
                    "live lease for over %.0f s",
                    held.batch,
                    held.campaign,
                    len(held.keys),
                    self.reap_after,
                )
        return restored


class SweepStep(bootsteps.StartStopStep):
    """Consumer step: `sweeper(c).sweep()` every `interval` s on a daemon thread of the worker's
    main process. It survives consumer restarts and stops with the worker; a Redis error or a
    bug waits for the next round, never ends the thread."""

    label = "sweeper"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweeper(self, c: Any) -> Any:
        raise NotImplementedError

    def start(self, c: Any) -> None:
        if self._thread is None or not self._thread.is_alive():
            sweeper = self.sweeper(c)
            self._thread = every(sweeper.interval, sweeper.sweep, stop=self._stop, what=self.label, level=logging.INFO)

    def shutdown(self, c: Any) -> None:
        self._stop.set()


class ReaperStep(SweepStep):
    label = "reaper"

    def sweeper(self, c: Any) -> Reaper:
        settings = broker_settings()
        return Reaper(connect(settings), node=c.hostname, queue=settings.queue)
