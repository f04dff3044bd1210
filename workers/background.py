"""A background loop for the worker's periodic threads: the health gate, the heartbeat, the
reaper and reconciler sweeps, and the follow-ups' liveness key."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis


def every(
    pause: float,
    step: Callable[[], object],
    *,
    stop: threading.Event,
    what: str,
    level: int = logging.WARNING,
    cooldown: float = 0.0,
) -> threading.Thread:
    """Start a daemon thread that runs `step` now and every `pause` s after until `stop` is set.
    A Redis or OS error is logged at `level` and any other with its traceback, then the thread
    waits `cooldown` s more and goes on: neither ends it."""

    def rounds() -> None:
        log = logging.getLogger(f"eagle_synth.{what}")
        while True:
            try:
                step()
            except (redis.RedisError, OSError) as exc:
                log.log(level, "%s: %s (trying again)", what, exc)
                stop.wait(cooldown)
            except Exception:
                log.exception("%s failed (trying again)", what)
                stop.wait(cooldown)
            if stop.wait(pause):
                return

    thread = threading.Thread(target=rounds, name=f"eagle-synth-{what}", daemon=True)
    thread.start()
    return thread
