"""Which campaigns a worker takes, and which of its servers each campaign's prompts may reach.

On a shared fleet one Redis holds the campaigns of several models, each in a queue of its own
(eagle_synth/queue.py). A worker consumes a campaign's queue only while one of its healthy
servers serves that campaign's model (workers/servers/model_check.py), so a batch never reaches a
server of another model by the broker's doing; the batch threads ask `servers_for` which of
the worker's servers its prompts may go to, so a worker with servers of two models sends each
campaign to its own. `PoolRouting` tells the in-flight pool how many prompts each routable
server takes and which backend builds its requests. A server that cannot say what it serves takes only campaigns the worker is
pinned to (`worker --campaign`). docs/operations.md "Sharing a fleet" tells the whole story.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping

import msgspec
import redis

from eagle_synth.queue import campaign_queue
from eagle_synth.state.campaign import CampaignSettings, campaign_names
from eagle_synth.state.keys import CampaignKeys
from eagle_synth.state.node_state import HEALTHY, ServerState
from eagle_synth.state.redis_client import pipelined
from workers.config import auto_inflight
from workers.inflight import Route
from workers.servers.fleet import Fleet
from workers.servers.model_check import ModelCheck

log = logging.getLogger("eagle_synth.routing")

# Seconds between looks at the campaigns in Redis (a new campaign is taken within this).
REFRESH_INTERVAL = 2.0


class CampaignRouter:
    """Decides the campaign queues this worker consumes and the servers of each campaign.

    A campaign is served when it is open (not closed, not cancelled), this worker is pinned to
    it or to none, and a healthy server of the worker serves its model (or cannot say, and the
    worker is pinned to it). Learned at every `refresh` (the health gate's thread, at most every
    REFRESH_INTERVAL s or when a server's state changed); read by the batch threads.

    Parameters:
        client: the campaigns' Redis.
        base_queue: the queue name campaign queues are made from (BrokerSettings.queue).
        check: the process's ModelCheck (one /tokenize per server, model and server restart).
        pins: campaign names given with `worker --campaign` (empty: any campaign).
    """

    def __init__(self, *, client: redis.Redis, base_queue: str, check: ModelCheck, pins: Iterable[str] = ()) -> None:
        self.client = client
        self.base_queue = base_queue
        self.check = check
        self.pins = frozenset(pins)
        self._settings: dict[str, CampaignSettings] = {}
        self._servers: dict[str, frozenset[str]] = {}
        self._not_served: dict[str, dict[str, str]] = {}
        self._said: set[tuple[str, str, str]] = set()
        self._refreshed_at = 0.0
        self._last_states: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    # read by the batch threads ------------------------------------------------------
    def servers_for(self, campaign: str) -> frozenset[str]:
        """The servers this campaign's prompts may go to (empty: none, the batch goes back)."""
        with self._lock:
            return self._servers.get(campaign, frozenset())

    def refuse(self, campaign: str, url: str, line: str) -> None:
        """A batch found `url` serving another model (swapped behind its address): not for this
        campaign until the server changes state again."""
        with self._lock:
            self._servers[campaign] = self._servers.get(campaign, frozenset()) - {url}
            self._not_served.setdefault(campaign, {})[url] = line
        self._say(campaign, url, line)

    # the gate's thread ----------------------------------------------------------------
    def due(self, states: Mapping[str, ServerState]) -> bool:
        """Whether `refresh` has something to learn: time passed, or a server changed state."""
        seen = {url: (state.state, state.since) for url, state in states.items()}
        return seen != self._last_states or time.monotonic() - self._refreshed_at >= REFRESH_INTERVAL

    def refresh(self, states: Mapping[str, ServerState]) -> set[str]:
        """Learn again which campaigns the healthy servers among `states` serve; returns the
        queues to consume."""
        self._refreshed_at = time.monotonic()
        self._last_states = {url: (state.state, state.since) for url, state in states.items()}
        healthy = {url: state for url, state in states.items() if state.state == HEALTHY}
        servers: dict[str, frozenset[str]] = {}
        not_served: dict[str, dict[str, str]] = {}
        for name, settings in self._open_campaigns().items():
            if settings is None:
                # Settings gone (evicted) or unreadable: its batches record their prompts as
                # failures without sending an id anywhere (workers/batch.py), on any server.
                servers[name] = frozenset(healthy)
                continue
            serving = set()
            for url, state in healthy.items():
                verdict = self.check.verdict(url, state, settings)
                if verdict.serves or (verdict.serves is None and name in self.pins):
                    serving.add(url)
                elif verdict.line is not None:
                    not_served.setdefault(name, {})[url] = verdict.line
                    self._say(name, url, verdict.line)
            servers[name] = frozenset(serving)
        with self._lock:
            self._servers = servers
            self._not_served = not_served
        return {campaign_queue(self.base_queue, name) for name, urls in servers.items() if urls}

    def served(self) -> list[str]:
        """The campaigns this worker takes now."""
        with self._lock:
            return sorted(name for name, urls in self._servers.items() if urls)

    def not_served(self) -> dict[str, dict[str, str]]:
        """campaign -> {server: why it does not take that campaign} (for `status`)."""
        with self._lock:
            return {name: dict(why) for name, why in self._not_served.items()}

    def _open_campaigns(self) -> dict[str, CampaignSettings | None]:
        """Every campaign this worker may take that is neither closed nor cancelled, with its
        settings (None when they are gone or unreadable: looked for again next time)."""
        names = [name for name in campaign_names(self.client) if not self.pins or name in self.pins]
        if not names:
            return {}
        keys = [CampaignKeys(name) for name in names]
        # One round trip: which are closed or cancelled, and the settings not cached yet.
        ended = pipelined(self.client, *(("exists", k.ended, k.cancelled) for k in keys))
        missing = [name for name in names if name not in self._settings]
        raw = self.client.mget([CampaignKeys(name).settings for name in missing]) if missing else []
        for name, blob in zip(missing, raw, strict=True):
            try:  # settings never change once written, so they are read once
                if blob:
                    self._settings[name] = CampaignSettings.from_json(blob)
            except msgspec.DecodeError:
                log.warning("campaign %s: its settings in Redis cannot be read; its batches fail their prompts", name)
        return {name: self._settings.get(name) for name, gone in zip(names, ended, strict=True) if not gone}

    def _say(self, campaign: str, url: str, line: str) -> None:
        """Log why a server does not take a campaign, once per reason."""
        if (campaign, url, line) not in self._said:
            self._said.add((campaign, url, line))
            log.warning("%s", line)


class PoolRouting:
    """What the in-flight pool may send to each server, asked at every pool tick (`routes`): a
    server `fleet` finds routable gets tickets (`inflight`, else 1.25 x the capacity preflight
    found, else the default) and the backend preflight found; any other gets none. Logs each
    server's tickets and endpoint when they start or change (not every tick).

    Parameters:
        fleet: the process's servers (workers/servers/fleet.py).
        servers: the worker's servers, in order.
        inflight: --inflight (None: sized from each server's capacity).
    """

    def __init__(self, fleet: Fleet, servers: Iterable[str], *, inflight: int | None) -> None:
        self.fleet = fleet
        self.servers = tuple(servers)
        self.inflight = inflight
        self._said: dict[tuple[str, str], object] = {}

    def routes(self) -> dict[str, Route]:
        """Each server's route (tickets, and the backend preflight found; no tickets while its kind is unknown)."""
        routes = {url: Route(0) for url in self.servers}
        for url, (state, backend) in self.fleet.routable(self.servers).items():
            # Tickets: --inflight, else the server's capacity x 1.25 (preflight keeps only a positive int).
            capacity = state.max_running_requests
            tickets = self.inflight or auto_inflight(capacity)
            source = "--inflight" if self.inflight else f"1.25 x the server's max_running_requests {capacity}"
            if not (self.inflight or capacity):
                source = "the default: the server does not report its capacity"
            self._say_once(url, "tickets", tickets, "keeping %d prompts in flight (%s)", tickets, source)
            model = getattr(backend, "model", None)
            model_words = f" (model {model})" if model else ""
            self._say_once(url, "backend", (backend.name, model), "sending prompts to %s%s", backend.path, model_words)
            routes[url] = Route(tickets, backend)
        return routes

    def _say_once(self, url: str, topic: str, value: object, message: str, *args: object) -> None:
        """Log what the routing does with a server when it starts or changes (not every tick)."""
        if self._said.get((url, topic)) != value:
            self._said[(url, topic)] = value
            log.info("server %s: " + message, url, *args)  # routine: what the worker does, not a problem
