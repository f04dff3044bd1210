"""A mark counts once a replica holds it: Redis WAIT after the writes exactly-once depends on.

A Sentinel failover promotes a replica; whatever the old master acknowledged that the replica
had not received yet is gone (marks, acks, pops), so batches run again and, on another host,
write second records. So after a batch's keys are marked done (workers/batch.py) the worker
waits until a replica holds that write: one SET on the same connection as a WAIT, as Redis
counts the WAIT against that connection's last write and its replication stream is ordered,
so a replica holding the SET holds the mark before it.

How many replicas: `min_replicas` (EAGLE_SYNTH_MIN_REPLICAS), else one whenever the master has
one connected (none: no WAIT, no cost). A WAIT gives up after WAIT_TIMEOUT_MS; the batch then
reports "replica not acknowledging" (the worker's line in `status`, and the log) and waits
again, for as long as the replica stays connected: Redis drops a replica that stops answering
after its repl-timeout (60 s by default), and then no replica is needed (with `min_replicas`
set, the batch waits until enough are back).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from eagle_synth.state.keys import KEY_PREFIX
from eagle_synth.state.redis_client import pipelined

log = logging.getLogger("eagle_synth.replicas")

# Milliseconds one WAIT may block: far above a healthy replica's lag (milliseconds), so a wait
# that runs out means a replica in trouble, and short enough that the batch says so within
# seconds instead of going silent.
WAIT_TIMEOUT_MS = 2000
# Seconds the master's count of connected replicas is reused before INFO is read again.
REPLICA_COUNT_REFRESH = 5.0
# The key each confirmation writes (see the module's docstring); its value is never read.
PROBE_KEY = f"{KEY_PREFIX}:replica-probe"


def connected_replicas(client: redis.Redis) -> int:
    return int(client.info("replication").get("connected_slaves", 0))


class ReplicaWait:
    """Confirms that replicas hold what this process wrote so far.

    Parameters:
        client: the campaign's Redis (the master).
        min_replicas: replicas that must hold each mark; None: one when the master has any.
        report: called with why replicas do not acknowledge, and with None once they do
            again (the worker's status line).
        stopping: set when the worker shuts down; a wait that runs out then gives up.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        min_replicas: int | None = None,
        report: Callable[[str | None], None] | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        self.client = client
        self.min_replicas = min_replicas
        self.report = report or (lambda problem: None)
        self.stopping = stopping or threading.Event()
        self._connected = 0
        self._counted_at = -REPLICA_COUNT_REFRESH

    def needed(self, *, fresh: bool = False) -> int:
        """Replicas a mark must reach now."""
        if self.min_replicas is not None:
            return self.min_replicas
        now = time.monotonic()
        if fresh or now - self._counted_at >= REPLICA_COUNT_REFRESH:
            self._connected = connected_replicas(self.client)
            self._counted_at = now
        return min(self._connected, 1)

    def confirm(self) -> None:
        """Return once enough replicas hold this process's writes so far; a Redis error (the
        master went away: whether the replica got the write is unknown) goes to the caller."""
        fresh = False
        while (needed := self.needed(fresh=fresh)) > 0:
            _, acked = pipelined(self.client, ("set", PROBE_KEY, "1"), ("wait", needed, WAIT_TIMEOUT_MS))
            if int(acked) >= needed:
                break
            problem = (
                f"replica not acknowledging: {acked} of {needed} held our marks after "
                f"{WAIT_TIMEOUT_MS / 1000:g} s (a failover now would forget them)"
            )
            log.warning("%s; waiting again", problem)
            self.report(problem)
            if self.stopping.is_set():
                return
            fresh = True
        self.report(None)
