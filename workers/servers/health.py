"""The health gate: a worker takes batches only while a server it serves is healthy.

A thread in the worker's main process probes each server's /health and preflights it when it
first answers (workers/servers/preflight.py); it shares what it finds with the batch threads in
the process's Fleet (workers/servers/fleet.py) and publishes it in the node's hash for `status`.
docs/workers.md "Health gate" tells the behaviour.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from eagle_synth.errors import PreflightError, ServerDown, TransientError, Unauthorized
from eagle_synth.processes import process_alive
from eagle_synth.state.node_state import (
    HEALTHY,
    LOADING,
    REFUSED,
    UNHEALTHY,
    UNKNOWN,
    WARMING,
    NodeRouting,
    NodeState,
    ServerState,
)
from workers import metrics
from workers.backends import BACKENDS
from workers.background import every
from workers.config import WorkerConfig
from workers.disk import DiskState
from workers.redis_watch import RedisWatch
from workers.servers.client import ServerClient
from workers.servers.fleet import Fleet
from workers.servers.model_check import REFUSE_PREFIX
from workers.servers.preflight import preflight_server
from workers.servers.routing import CampaignRouter

log = logging.getLogger("eagle_synth.health")

# Consecutive failed probes (a refused connection counts at once) before a healthy server counts as
# unhealthy: SGLang's /health answers 503 on a healthy server busy with a long prefill.
FAILURES_TO_UNHEALTHY = 3
# Seconds between probes of a healthy server (skipped while /generate keeps succeeding).
HEALTHY_PROBE_INTERVAL = 5.0
# Wait between probes of a server that is not healthy: first, longest, growth per failure.
BACKOFF_START = 0.2
BACKOFF_MAX = 1.0
BACKOFF_FACTOR = 1.5
# Seconds between: heartbeat refreshes of the node's hash when nothing changed (its thread wakes
# twice as often, also sweeping in-flight counts left by worker processes that died), gate loop
# wake-ups (batch threads' hints).
HEARTBEAT_INTERVAL = 10.0
TICK = 0.1
# While no server is healthy the worker says so again after this many seconds, then at doubling
# intervals up to the longest: a worker pointed at a dead URL stays visible in its log without
# filling it (30 s, 1 min, 2 min, ... every 15 min).
STILL_CLOSED_FIRST = 30.0
STILL_CLOSED_MAX = 900.0


@dataclass(slots=True)
class _Tracked:
    client: ServerClient
    state: ServerState = field(default_factory=ServerState)
    failures: int = 0
    wait: float = BACKOFF_START
    next_probe: float = 0.0
    preflighted: bool = False
    # The last failure a batch reported, and how it went down while serving: in the detail until healthy.
    last_cause: str | None = None
    went_down: str | None = None


class HealthGate:
    """Probe the servers of `config` (with its probe timeout, and what its preflight options
    accept), publish their states in `node_state`, open and close the gate: while a server is
    healthy (and `disk` can take records, and `redis_watch` finds Redis safe: no evicting policy,
    persistence on, though either may be changed while running) the worker consumes the queues
    of the campaigns `router` finds its healthy servers serve, none otherwise. `on_consume(queue)`
    and `on_stop(queue)` are called from the gate thread for each queue it starts and stops
    consuming; `on_all_refused` once when preflight refused every server. `fleet` holds the
    servers' clients and carries their states to the batch threads, and their reports back
    (default: one of its own)."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        node_state: NodeState,
        router: CampaignRouter,
        on_consume: Callable[[str], None],
        on_stop: Callable[[str], None],
        disk: DiskState | None = None,
        on_all_refused: Callable[[], None] | None = None,
        redis_watch: RedisWatch | None = None,
        fleet: Fleet | None = None,
    ) -> None:
        self.config = config
        self.fleet = fleet or Fleet(config.servers, api_key=config.api_key)
        self.node_state = node_state
        self.router = router
        self.disk = disk
        self.on_consume = on_consume
        self.on_stop = on_stop
        self.on_all_refused = on_all_refused
        self.consumed: set[str] = set()
        self._preflight = partial(
            preflight_server,
            allow_server_parsers=config.allow_server_parsers,
            allowed_settings=frozenset(config.allow_server_settings),
        )
        self._disk_detail: str | None = None
        self.redis_watch = redis_watch
        self._redis_detail: str | None = None
        self.tracked = {url: _Tracked(client=client) for url, client in self.fleet.clients.items()}
        self.is_open = False
        # Since when the gate is closed, when to say so again, and the wait after that.
        self._closed_since = time.monotonic()
        self._next_reminder = self._closed_since + STILL_CLOSED_FIRST
        self._reminder_wait = STILL_CLOSED_FIRST
        self._last_publish = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # The heartbeat has its own thread: a probe or preflight that takes long (a slow or
        # trickling server, vLLM's probe request) must not make the worker vanish from status.
        # After a failure each waits a second more: the gate keeps its state and tries again.
        self._thread = every(TICK, self.tick, stop=self._stop, what="health", cooldown=1.0)
        every(HEARTBEAT_INTERVAL / 2, self._beat, stop=self._stop, what="heartbeat", cooldown=1.0)

    def _beat(self) -> None:
        if time.time() - self._last_publish >= HEARTBEAT_INTERVAL / 2:
            self._publish()
        self.node_state.prune_dead_children(process_alive)

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def tick(self) -> None:
        now = time.time()
        changed = False
        for url, suspect in self.fleet.take_suspects().items():
            tracked = self.tracked.get(url)
            reported = suspect.detail
            if not tracked or tracked.state.state == REFUSED:
                continue
            if reported.startswith(REFUSE_PREFIX):
                # A batch found it serving another model than the campaign's (workers/servers/model_check.py).
                changed = self._set(tracked, REFUSED, reported[len(REFUSE_PREFIX) :]) or changed
            else:
                log.info("server %s reported failing by a batch (%s): probing now", url, suspect.detail)
                tracked.next_probe = 0.0
                tracked.last_cause = reported or tracked.last_cause
        for url, tracked in self.tracked.items():
            if tracked.state.state == REFUSED or now < tracked.next_probe:
                continue
            if tracked.state.state == HEALTHY and now - self.fleet.last_ok(url) < HEALTHY_PROBE_INTERVAL:
                tracked.failures = 0
                tracked.next_probe = now + HEALTHY_PROBE_INTERVAL
                continue
            changed |= self._probe(url, tracked)
        if self.on_all_refused is not None and all(t.state.state == REFUSED for t in self.tracked.values()):
            callback, self.on_all_refused = self.on_all_refused, None
            callback()
        if changed or now - self._last_publish > HEARTBEAT_INTERVAL:
            self._publish()
        self._update_gate()

    def _set(self, tracked: _Tracked, state: str, detail: str) -> bool:
        """Set a server's state and detail; True when the state changed (and was logged)."""
        tracked.state.detail = detail
        if tracked.state.state == state:
            return False
        # Turning healthy, or warming up at start, is routine; anything else is worth a warning.
        routine = state == HEALTHY or (tracked.state.state == UNKNOWN and state == WARMING)
        level = logging.INFO if routine else logging.WARNING
        log.log(level, "server %s: %s -> %s (%s)", tracked.client.url, tracked.state.state, state, detail)
        tracked.state.state, tracked.state.since = state, time.time()
        metrics.server_state(tracked.client.url, state)
        return True

    def _probe(self, url: str, tracked: _Tracked) -> bool:
        now = time.time()
        try:
            ok, detail = tracked.client.health(timeout=self.config.probe_timeout)
        except Unauthorized as exc:  # SGLang and vLLM leave /health open; a proxy in front may not
            log.error("%s", exc)
            return self._set(tracked, REFUSED, str(exc))
        except ServerDown as exc:
            # Nothing listens: certain, no hysteresis; it must pass preflight again when back. One
            # that was serving says when it went down and the last failure a batch saw (a server
            # killed by a request shows as such, not as one still loading).
            tracked.preflighted = False
            if tracked.state.state in (HEALTHY, UNHEALTHY):
                cause = f" (last error a batch saw: {tracked.last_cause})" if tracked.last_cause else ""
                tracked.went_down = f"went down at {time.strftime('%H:%M:%S')} right after serving our requests{cause}"
            detail = f"{tracked.went_down}; now: {exc}" if tracked.went_down else str(exc)
            return self._failed(tracked, LOADING, detail, certain=True, now=now)
        if not ok:
            state = WARMING if tracked.state.state in (UNKNOWN, LOADING, WARMING) else UNHEALTHY
            return self._failed(tracked, state, detail, certain=False, now=now)
        if not tracked.preflighted:
            try:
                checked = self._preflight(tracked.client, forced=self.config.backend_for(url))
            except (PreflightError, Unauthorized) as exc:
                log.error("%s", exc)
                return self._set(tracked, REFUSED, str(exc))
            except (ServerDown, TransientError) as exc:
                return self._failed(tracked, WARMING, f"preflight: {exc}", certain=False, now=now)
            for problem in checked.accepted:
                log.warning("server %s accepted despite %s", url, problem)
            facts = checked.facts
            model = facts.model_info.get("id") or facts.server_info.get("model_path") or "?"
            version = facts.version or "(version unknown)"
            log.info(
                "server %s is %s %s serving %s (context %s; kind from %s)",
                *(url, checked.kind, version, model, facts.context_length, checked.how),
            )
            BACKENDS[checked.kind].apply_facts(tracked.state, facts, accepted=checked.accepted)
            tracked.preflighted = True
        tracked.failures = 0
        tracked.wait = BACKOFF_START
        tracked.next_probe = now + HEALTHY_PROBE_INTERVAL
        tracked.went_down = tracked.last_cause = None
        return self._set(tracked, HEALTHY, "ok")

    def _failed(self, tracked: _Tracked, state: str, detail: str, *, certain: bool, now: float) -> bool:
        tracked.failures += 1
        if tracked.state.state == HEALTHY and not certain and tracked.failures < FAILURES_TO_UNHEALTHY:
            # One slow probe on a busy server: look again soon, keep serving meanwhile.
            tracked.next_probe = now + BACKOFF_START
            url, failures = tracked.client.url, tracked.failures
            log.info("server %s: probe failed (%d/%d): %s", url, failures, FAILURES_TO_UNHEALTHY, detail)
            return False
        tracked.next_probe = now + tracked.wait
        tracked.wait = min(tracked.wait * BACKOFF_FACTOR, BACKOFF_MAX)
        return self._set(tracked, state, detail)

    def _publish(self) -> None:
        self._last_publish = time.time()
        routing = NodeRouting(
            campaigns=self.router.served(), pins=sorted(self.router.pins), not_served=self.router.not_served()
        )
        states = {url: tracked.state for url, tracked in self.tracked.items()}
        # The batch threads read the states here; `status` and other processes, in Redis.
        self.fleet.publish(states)
        self.node_state.publish(
            states,
            consuming=self.is_open,
            disk=self._disk_detail,
            redis=self._redis_detail,
            routing=routing,
        )

    def _disk_ok(self) -> bool:
        ok = self.disk is None or self.disk.check()
        detail = None if ok or self.disk is None else self.disk.detail
        if detail != self._disk_detail:
            log.warning("output folder: %s", "writable again" if ok else detail)
            self._disk_detail = detail
            self._publish()
        return ok

    def _redis_ok(self) -> bool:
        ok = self.redis_watch is None or self.redis_watch.check()
        detail = None if self.redis_watch is None else self.redis_watch.detail
        if detail != self._redis_detail:
            log.warning("redis: %s", detail or "safe again")
            self._redis_detail = detail
            self._publish()
        return ok

    def _update_gate(self) -> None:
        redis_ok = self._redis_ok()  # first: its status line is kept current even with no server up
        any_healthy = any(t.state.state == HEALTHY for t in self.tracked.values()) and self._disk_ok() and redis_ok
        if any_healthy != self.is_open:
            self.is_open = any_healthy
            self._closed_since = time.monotonic()
            self._next_reminder = self._closed_since + STILL_CLOSED_FIRST
            self._reminder_wait = STILL_CLOSED_FIRST
            if any_healthy:
                log.info("a server is healthy: taking batches")
            else:
                log.warning("no healthy server, no writable output folder or an unsafe Redis: not taking batches")
            self._publish()
        elif not any_healthy:
            self._remind_closed()
        states = {url: tracked.state for url, tracked in self.tracked.items()}
        if self.is_open and not self.router.due(states):
            return
        wanted = self.router.refresh(states) if self.is_open else set()
        self._consume(wanted)

    def _consume(self, wanted: set[str]) -> None:
        """Start and stop consuming queues until the worker consumes exactly `wanted`."""
        started, stopped = wanted - self.consumed, self.consumed - wanted
        for queue in sorted(stopped):
            self.on_stop(queue)
        for queue in sorted(started):
            self.on_consume(queue)
        self.consumed = set(wanted)
        if started or stopped:
            log.info("taking batches of %s", ", ".join(self.router.served()) or "no campaign")
            self._publish()

    def _remind_closed(self) -> None:
        """While the gate stays closed, say so again at growing intervals (STILL_CLOSED_*), with
        each server's state, since when, and why."""
        now = time.monotonic()
        if now < self._next_reminder:
            return
        self._reminder_wait = min(self._reminder_wait * 2, STILL_CLOSED_MAX)
        self._next_reminder = now + self._reminder_wait
        waited = now - self._closed_since
        servers = "; ".join(
            f"{url} {t.state.state} since {time.strftime('%H:%M:%S', time.localtime(t.state.since))} ({t.state.detail})"
            if t.state.since
            else f"{url} {t.state.state} ({t.state.detail})"
            for url, t in self.tracked.items()
        )
        disk = f"; output folder: {self._disk_detail}" if self._disk_detail else ""
        redis = f"; redis: {self._redis_detail}" if self._redis_detail else ""
        log.warning("still not taking batches after %.0f s: %s%s%s", waited, servers, disk, redis)
