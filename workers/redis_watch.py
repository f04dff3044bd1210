"""Redis as a resource the worker depends on, like its servers and its output folder.

`enqueue` and `worker` refuse an evicting or non-persisting Redis at start
(eagle_synth/state/redis_policy.py), but an operator can change either while a campaign runs
(`CONFIG SET maxmemory-policy allkeys-lru`): keys then vanish silently (the queue, `unacked`,
settings). So the health gate (workers/servers/health.py) reads both again every REDIS_CHECK_INTERVAL
s and takes no batches while either is unsafe, saying why in `status` and the log; it takes
batches again once both are safe. Batch threads add what they find: replicas that do not
acknowledge their marks (eagle_synth/state/replicas.py), shown but not closing the gate.
"""

from __future__ import annotations

import threading
import time

import redis

from eagle_synth.state.redis_policy import OVERRIDE_FLAG, REQUIRED_POLICY, read_eviction_policy, read_persistence

# Seconds between reads of the policy and persistence: a change is seen within seconds, for one
# CONFIG GET and one INFO-sized reply per worker each time.
REDIS_CHECK_INTERVAL = 2.0


class RedisWatch:
    """Whether the campaign's Redis is safe to take batches on (`unsafe`: why not, or None)
    and what batch threads reported about its replicas (`replicas`). Thread-safe.

    Parameters:
        client: the campaign's Redis.
        allow_evicting, allow_volatile: the worker's --allow-evicting-redis and
            --allow-volatile-redis: the risk they accept does not close the gate.
    """

    def __init__(self, client: redis.Redis, *, allow_evicting: bool = False, allow_volatile: bool = False) -> None:
        self.client = client
        self.allow_evicting = allow_evicting
        self.allow_volatile = allow_volatile
        self._lock = threading.Lock()
        self.unsafe: str | None = None
        self.replicas: str | None = None
        self._next_check = 0.0

    def _problem(self) -> str | None:
        """Why Redis is unsafe now (None also when CONFIG and INFO both refuse to tell: the
        start check warned about that already)."""
        policy, _ = read_eviction_policy(self.client)
        if policy is not None and policy != REQUIRED_POLICY and not self.allow_evicting:
            return (
                f"Redis's maxmemory-policy is {policy}: it may evict campaign keys; not taking batches "
                f"until it is {REQUIRED_POLICY} again (or restart the worker with {OVERRIDE_FLAG})"
            )
        persists, how = read_persistence(self.client)
        if persists is False and not self.allow_volatile:
            return f"Redis persists nothing now ({how}): a restart would lose the campaign; not taking batches"
        return None

    def check(self) -> bool:
        """Read policy and persistence again if due; returns whether Redis is safe. A Redis
        error goes to the caller (the gate's loop logs it and keeps its last answer)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + REDIS_CHECK_INTERVAL
            problem = self._problem()
            with self._lock:
                self.unsafe = problem
        return self.unsafe is None

    def report_replicas(self, problem: str | None) -> None:
        """A batch thread's finding about the replicas (None: they acknowledged)."""
        with self._lock:
            self.replicas = problem

    @property
    def detail(self) -> str | None:
        """What `status` shows for Redis on this worker, or None."""
        with self._lock:
            return "; ".join(filter(None, (self.unsafe, self.replicas))) or None
