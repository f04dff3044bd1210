"""The servers a worker process drives, as that process knows them: the one place the health
gate's thread and the batch threads share what they learn about a server.

The gate (workers/servers/health.py) publishes each server's state here; the batch threads read
which servers may take prompts (`routable`), report a server that failed a request (`suspect`,
which the gate probes at once) and one that answered (`generated_ok`, as good as a probe). All of
it stays in the process: Redis holds only what other processes read, the node's hash that
`status` and the metrics show (eagle_synth/state/node_state.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgspec

from eagle_synth.errors import ServerDown
from eagle_synth.state.node_state import HEALTHY, ServerState
from workers.backends import Backend, backend_for_state
from workers.servers.client import ServerClient

# Keep-alive connections per server of the process's one client: the gate's probes, the model
# check's /tokenize and the batch threads' quick health checks, each short and seldom at once.
POOL_CONNECTIONS = 8
# Seconds a quick /health check may take when a request failed, to tell "down" from "blip".
QUICK_HEALTH_TIMEOUT = 5.0
# Seconds a quick health answer is reused for other prompts that failed on the same server.
QUICK_HEALTH_REUSE = 1.0

Servers = dict[str, tuple[ServerState, Backend]]  # url: its state and the backend its requests are built with


@dataclass(frozen=True, slots=True)
class Suspect:
    """A failure a batch reported for a server: when (`at`, epoch seconds) and what it saw (`detail`)."""

    at: float
    detail: str


class Fleet:
    """The servers of one worker process, shared by the health gate and the batch threads.

    Holds one ServerClient per server (`clients`, used by the gate's probes and preflight, the
    model check and the batch threads' quick health checks), each server's state as the gate last
    published it, the failures batches reported since the gate last looked, and when /generate
    last succeeded on each. Thread-safe; every read returns copies.

    Parameters:
        servers: the servers' base URLs (the worker's --server).
        api_key: the servers' --api-key, sent with every request (None: none).
        pool_connections: keep-alive connections kept per server.
    """

    def __init__(
        self, servers: Iterable[str], *, api_key: str | None = None, pool_connections: int = POOL_CONNECTIONS
    ) -> None:
        self.clients = {url: ServerClient(url, pool_connections=pool_connections, api_key=api_key) for url in servers}
        self._states: dict[str, ServerState] = {}
        self._suspects: dict[str, Suspect] = {}
        self._ok_at: dict[str, float] = {}
        self._health_seen: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    # written by the health gate ---------------------------------------------------------
    def publish(self, states: Mapping[str, ServerState]) -> None:
        """The servers' states as the gate sees them now (copied: the gate goes on changing its own)."""
        copies = {url: msgspec.structs.replace(state) for url, state in states.items()}
        with self._lock:
            self._states = copies

    def take_suspects(self) -> dict[str, Suspect]:
        """The failures batches reported since the last call, per server."""
        with self._lock:
            suspects = self._suspects
            self._suspects = {}
        return suspects

    def last_ok(self, url: str) -> float:
        """When a /generate to `url` last succeeded (epoch seconds; 0.0: never)."""
        with self._lock:
            return self._ok_at.get(url, 0.0)

    # read and reported by the batch threads ---------------------------------------------
    def state(self, url: str) -> ServerState | None:
        """The server's state as the gate last published it (None before it did)."""
        with self._lock:
            return self._states.get(url)

    def routable(self, servers: Iterable[str]) -> Servers:
        """Those of `servers` prompts may go to: healthy, not suspected since, and of a kind
        preflight found (the pool cannot route to one before)."""
        with self._lock:
            states = dict(self._states)
            suspects = dict(self._suspects)
        found = {}
        for url in servers:
            state = states.get(url)
            suspect = suspects.get(url)
            if state is None or state.state != HEALTHY or (suspect is not None and suspect.at > state.since):
                continue
            if (backend := backend_for_state(state)) is not None:
                found[url] = (state, backend)
        return found

    def suspect(self, url: str, detail: str) -> None:
        """A batch saw the server fail; the gate probes it at once."""
        with self._lock:
            self._suspects[url] = Suspect(at=time.time(), detail=detail)

    def generated_ok(self, url: str) -> None:
        """A /generate succeeded: as good as a health probe."""
        with self._lock:
            self._ok_at[url] = time.time()

    def server_down(self, url: str, detail: str) -> bool:
        """After a failed request: is the server itself down (True: it is reported a suspect
        with `detail`) or was it a blip? One quick /health answers for every prompt that failed
        on it within QUICK_HEALTH_REUSE s."""
        with self._lock:
            seen = self._health_seen.get(url)
        if seen and time.monotonic() - seen[0] < QUICK_HEALTH_REUSE:
            return not seen[1]
        try:
            ok, why = self.clients[url].health(timeout=QUICK_HEALTH_TIMEOUT)
        except ServerDown as exc:
            ok = False
            why = str(exc)
        with self._lock:
            self._health_seen[url] = (time.monotonic(), ok)
        if not ok:
            self.suspect(url, f"{detail}; health: {why}")
        return not ok
