"""A mark counts once a replica holds it: Redis WAIT after the writes exactly-once depends on.

A Sentinel failover promotes a replica; whatever the old master acknowledged that the replica
had not received yet is gone (marks, acks, pops), so batches run again and, on another host,
write second records. So after a batch's keys are marked done (workers/batch.py) the worker
waits until a replica holds that write: one SET on the same connection as the WAITs, as Redis
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
from typing import Any

import redis

from eagle_synth.state.keys import KEY_PREFIX

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
    """The master's connected replicas; 0 where INFO is refused (an ACL user without it), as
    they cannot be counted then (EAGLE_SYNTH_MIN_REPLICAS sets the number instead)."""
    try:
        return int(client.info("replication").get("connected_slaves", 0))
    except redis.ResponseError:
        return 0


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

    def needed(self) -> int:
        """Replicas a mark must reach now."""
        if self.min_replicas is not None:
            return self.min_replicas
        now = time.monotonic()
        if now - self._counted_at >= REPLICA_COUNT_REFRESH:
            self._connected = connected_replicas(self.client)
            self._counted_at = now
        return min(self._connected, 1)

    def confirm(self) -> None:
        """Return once enough replicas hold this process's writes so far; a Redis error (the
        master went away: whether the replica got the write is unknown) goes to the caller."""
        if self.needed() == 0:
            self.report(None)
            return
        # One connection throughout: each WAIT counts against this connection's SET, so a
        # replica catching up slowly is waited for, not outrun by a new SET each round.
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            self._wait_on(connection)
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)

    def _wait_on(self, connection: Any) -> None:
        connection.send_command("SET", PROBE_KEY, "1")
        connection.read_response()
        while (needed := self.needed()) > 0:
            connection.send_command("WAIT", needed, WAIT_TIMEOUT_MS)
            try:
                acked = int(connection.read_response())
            except redis.ResponseError as exc:  # WAIT refused (an ACL): nothing to wait with
                self.report(f"cannot wait for replicas: {exc}")
                return
            if acked >= needed:
                break
            problem = (
                f"replica not acknowledging: {acked} of {needed} held our marks after "
                f"{WAIT_TIMEOUT_MS / 1000:g} s (a failover now would forget them)"
            )
            log.warning("%s; waiting again", problem)
            self.report(problem)
            if self.stopping.is_set():
                return
            self._counted_at = -REPLICA_COUNT_REFRESH  # count the replicas again: one may have left
        self.report(None)
