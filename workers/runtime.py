"""The worker process's shared pieces, built on its first batch: one in-flight pool, the output
folder's state, the batch runner, and the routing that tells the pool which servers may take
prompts and with which backend (SGLang or vLLM, as preflight found) to build their requests.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping

from eagle_synth.queue import make_celery, send_payload
from eagle_synth.settings import BrokerSettings, broker_settings
from eagle_synth.state.node_state import NodeState, ServerState
from eagle_synth.state.redis_client import connect
from workers.batch import BatchRunner, routable
from workers.config import WorkerConfig, auto_inflight
from workers.disk import DiskState
from workers.followups import FollowUps
from workers.inflight import InflightPool, Route

log = logging.getLogger("eagle_synth.worker")


class WorkerRuntime:
    """Builds and owns the process-wide pool, disk state and runner.

    Parameters:
        config, node: worker settings; this worker's Celery node name.
        stopping: set when the worker begins to shut down.
        disk: the output folder's state, shared with the health gate.
        broker: Redis and queue settings (default: from the environment).
        send: publishes one encoded TaskPayload (a conversation's next turns); default: a Celery
            app of its own for these broker settings.
    """

    def __init__(
        self,
        *,
        config: WorkerConfig,
        node: str,
        stopping: threading.Event | None = None,
        disk: DiskState | None = None,
        broker: BrokerSettings | None = None,
        send: Callable[[dict], None] | None = None,
    ) -> None:
        settings = broker or broker_settings()
        stopping = stopping or threading.Event()
        self.config = config
        self.node_state = NodeState(connect(settings), node)
        self._published: dict[tuple[str, str], int] = {}
        self._tickets_logged: dict[str, int] = {}
        self._backends: dict[str, tuple] = {}
        self.pool = InflightPool(servers=list(config.servers), on_tick=self.tick)
        self.followups = FollowUps(
            redis_client=connect(settings),
            send=send or functools.partial(send_payload, make_celery(settings), settings.queue),
            render_processes=config.render_processes,
            stopping=stopping,
            hungry=lambda: self.pool.waiting() == 0,
        )
        self.runner = BatchRunner(
            config=config,
            redis_client=connect(settings),
            node=node,
            task_budget=settings.task_budget_seconds,
            pool=self.pool,
            disk=disk or DiskState(folder=config.out),
            followups=self.followups,
            stopping=stopping,
            shutdown_grace=float(settings.soft_shutdown_timeout),
        )

    def close(self) -> None:  # stops the pool's event loop (tests; a worker process just exits)
        self.pool.close()

    def tickets(self, url: str, state: ServerState) -> int:
        """In-flight tickets for one healthy server: --inflight, else its capacity x 1.25."""
        capacity = state.max_running_requests  # preflight keeps only a positive int (positive_int)
        tickets = self.config.inflight or auto_inflight(capacity)
        if self._tickets_logged.get(url) != tickets:
            self._tickets_logged[url] = tickets
            source = f"1.25 x the server's max_running_requests {capacity}" if capacity else "the default"
            if self.config.inflight:
                source = "--inflight"
            elif not capacity:
                source += ": the server does not report its capacity"
            log.warning("server %s: keeping %d prompts in flight (%s)", url, tickets, source)
        return tickets

    def tick(self, counts: Mapping[tuple[str, str], int]) -> dict[str, Route]:
        """The pool's periodic call: publish prompts in flight, return each server's route
        (tickets, and the backend preflight found; no tickets while its kind is unknown)."""
        if counts != self._published:
            self.node_state.publish_inflight(pid=os.getpid(), counts=counts, previous=self._published)
            self._published = dict(counts)
        routes = {url: Route(0) for url in self.config.servers}
        for url, (state, backend) in routable(self.node_state, self.config.servers).items():
            # Said once: which endpoint (and model) a server's prompts go to.
            identity = (backend.name, model := getattr(backend, "model", None))
            if self._backends.get(url) != identity:
                self._backends[url] = identity
                log.warning(
                    "server %s: sending prompts to %s%s", url, backend.path, f" (model {model})" if model else ""
                )
            routes[url] = Route(self.tickets(url, state), backend)
        return routes
