"""Cluster-wide sweeps run in a daemon thread of every worker's main process.

The reaper (workers/reaper.py) and the reconciler (workers/reconciler.py) are both a `sweep()`
that one worker per round runs (whoever takes the round's Redis lock). This module holds what
they share: the loop that runs a sweep every interval and survives Redis outages and bugs, and
the Celery consumer step that starts that loop once per worker process.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

import redis
from celery import bootsteps


class Sweeper(Protocol):
    """What a sweep loop runs: `sweep()` once per `interval` seconds."""

    interval: float

    def sweep(self) -> int: ...


def run_sweeps(sweeper: Sweeper, stop: threading.Event, *, name: str, log: logging.Logger) -> None:
    """Call `sweeper.sweep()` every interval until `stop` is set; a Redis error or a bug is
    logged and waits for the next round, so the thread never ends silently."""
    while not stop.wait(sweeper.interval):
        try:
            sweeper.sweep()
        except redis.RedisError as exc:
            log.info("%s: Redis not answering (%s); trying again in %.0f s", name, exc, sweeper.interval)
        except Exception:
            log.exception("%s: round failed; trying again in %.0f s", name, sweeper.interval)


class SweepStep(bootsteps.StartStopStep):
    """Consumer step: run one sweeper's loop in a daemon thread of the worker's main process.

    Started once; it survives consumer restarts (broker reconnections) and stops with the
    worker. Subclasses name the sweep (`sweep_name`, used in the thread name and logs) and build
    the sweeper from the consumer (`make_sweeper`).
    """

    sweep_name = "sweep"
    log = logging.getLogger("eagle_synth.sweeps")

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def make_sweeper(self, c: Any) -> Sweeper:
        raise NotImplementedError

    def start(self, c: Any) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        sweeper = self.make_sweeper(c)
        self._thread = threading.Thread(
            target=run_sweeps,
            args=(sweeper, self._stop),
            kwargs={"name": self.sweep_name, "log": self.log},
            name=f"eagle-synth-{self.sweep_name}",
            daemon=True,
        )
        self._thread.start()

    def shutdown(self, c: Any) -> None:
        self._stop.set()
