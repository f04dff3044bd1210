"""A batch lease: at most one batch thread, on any host, generates a given batch at a time.

Redis can hold two copies of one batch message (after a broker connection loss Celery restores
unacked messages while their tasks still run). One thread per process renews every lease the
process holds (a thread per batch costs more CPU than the rest of the lease when servers answer
quickly); a dead holder's lease expires within LEASE_TTL, or is taken over at once on its own
host. A copy on another thread of a live process waits (BatchBusy) until the holder is done.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time

import redis

from eagle_synth.errors import BatchBusy
from eagle_synth.processes import holder_dead, holder_id
from eagle_synth.settings import TIMINGS
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.redis_client import text

log = logging.getLogger("eagle_synth.lease")

# Seconds a lease lives without renewal: how long a batch whose holder died stays blocked.
LEASE_TTL = TIMINGS.lease_ttl
# Renew this often (a third of the TTL leaves two chances to renew before it lapses).
RENEW_EVERY = LEASE_TTL / 3
# Share of the TTL without a successful renewal after which the holder must assume the lease
# may lapse (and another host's reaper give the batch away): it stops and writes nothing.
LOST_AFTER_SHARE = 0.75

_RELEASE = LuaScript("lease_release")
_TAKEOVER = LuaScript("lease_takeover")
_RENEW = LuaScript("renew")  # as Fence.renew


class _Renewer:
    """The process's renewal thread: renews each lease RENEW_EVERY s (read at each turn: tests
    change it) after it was taken or renewed; started with the first lease, again after a fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._leases: dict[BatchLease, float] = {}  # lease -> when it is due
        self._sleep_until = float("inf")
        self._thread: threading.Thread | None = None

    def add(self, lease: BatchLease) -> None:
        due = time.monotonic() + RENEW_EVERY
        with self._lock:
            self._leases[lease] = due
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="eagle-synth-lease", daemon=True)
                self._thread.start()
            elif due < self._sleep_until:
                self._changed.notify()  # only when it sleeps past the new lease's turn

    def remove(self, lease: BatchLease) -> None:
        with self._lock:
            self._leases.pop(lease, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                due = [lease for lease, at in self._leases.items() if at <= now]
                if not due:
                    self._sleep_until = min(self._leases.values(), default=now + RENEW_EVERY)
                    self._changed.wait(self._sleep_until - now)
                    self._sleep_until = float("inf")
                    continue
            for lease in due:
                try:
                    lease._renew()
                except Exception:  # one lease's surprise must not stop the renewal of the others
                    log.exception("renewing batch lease %s failed", lease.key)
                with self._lock:
                    if lease in self._leases:
                        self._leases[lease] = time.monotonic() + RENEW_EVERY


_renewer = _Renewer()


class BatchLease:
    """Hold `key` (CampaignKeys.lease(batch)) while a batch runs; `ttl`: seconds it lives unrenewed."""

    def __init__(self, client: redis.Redis, key: str, *, ttl: float = LEASE_TTL) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = int(ttl * 1000)
        # Unique per lease: batch threads of one process must not mistake each other's leases.
        self.holder = holder_id(secrets.token_hex(4))
        self.took_over = False  # the previous holder died mid-batch: it may have left files
        self._renewed_at = time.monotonic()
        self._refused = False

    @property
    def lost(self) -> bool:
        """A renewal found the lease gone, or renewals failed for most of a TTL: it may be someone
        else's now, so the batch stops and writes nothing."""
        return self._refused or time.monotonic() - self._renewed_at > self.ttl_ms / 1000 * LOST_AFTER_SHARE

    def __enter__(self) -> BatchLease:
        if not self._acquire():
            raise BatchBusy(f"batch lease {self.key} is held by {self.client.get(self.key)!r}")
        _renewer.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        # A renewal still under way when the lease is released finds it gone and does nothing.
        _renewer.remove(self)
        with contextlib.suppress(redis.RedisError):  # else it expires by itself
            _RELEASE(self.client, (self.key,), (self.holder,))

    def _acquire(self) -> bool:
        self._renewed_at = time.monotonic()
        if self.client.set(self.key, self.holder, nx=True, px=self.ttl_ms):
            return True
        current = self.client.get(self.key)
        if current is None:
            return bool(self.client.set(self.key, self.holder, nx=True, px=self.ttl_ms))
        current_text = text(current)
        if holder_dead(current_text):
            self.took_over = bool(_TAKEOVER(self.client, (self.key,), (current_text, self.holder, self.ttl_ms)))
            return self.took_over
        return False

    def _renew(self) -> None:
        try:
            renewed = _RENEW(self.client, (self.key,), (self.holder, self.ttl_ms))
        except redis.RedisError:
            return  # Redis away: try again next turn; `lost` turns true if it lasts
        if renewed:
            self._renewed_at = time.monotonic()
        else:
            self._refused = True
