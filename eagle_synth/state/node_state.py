"""A worker node's hash in Redis (expiring unless refreshed), for what other processes read
(`status`, the reaper, the metrics): the health gate writes server states, the batch threads'
in-flight pool counts prompts in flight. Within the worker process the gate and the batch threads
share server states, suspects and successes in memory (workers/servers/fleet.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

import msgspec
import redis

from eagle_synth.processes import holder_gone_here, holder_id, hostname
from eagle_synth.state.keys import WORKER_TTL, WORKERS_INDEX, worker_key
from eagle_synth.state.redis_client import text as as_text

HEALTHY = "healthy"
LOADING = "loading"  # connection refused: weights loading, restarting or dead
WARMING = "warming"  # listening, /health not yet 200
UNHEALTHY = "unhealthy"  # was healthy, then failed probes (timeouts, errors)
REFUSED = "refused"  # preflight refused its configuration; never used
UNKNOWN = "unknown"  # not probed yet
# Field kinds a node's hash held before suspects and successes stayed in the worker process
# (workers/servers/fleet.py): a hash an older worker wrote may still have them; never shown.
WITHDRAWN_FIELDS = ("ok", "suspect")


class ServerState(msgspec.Struct):
    """One server as this node sees it: `state` (above) `since` when, the last probe's `detail`,
    then what preflight learnt (None: not reported): provenance, draft-reserved slots, caps,
    sampling-seed support and `backend` (workers/backends/)."""

    state: str = UNKNOWN
    since: float = 0.0
    detail: str = ""
    context_length: int | None = None
    provenance: dict | None = None
    draft_reserved_tokens: int = 0
    max_req_input_len: int | None = None
    max_running_requests: int | None = None
    max_total_num_tokens: int | None = None
    deterministic_inference: bool | None = None
    sampling_seed_supported: bool | None = None
    backend: str | None = None


class NodeRouting(msgspec.Struct):
    """Which campaigns a worker takes (`campaigns`), those it is pinned to (`pins`, empty: any),
    and why a server of it does not take a campaign (`not_served`: campaign -> {url: why})."""

    campaigns: list[str] = []
    pins: list[str] = []
    not_served: dict[str, dict[str, str]] = {}

    @classmethod
    def parse(cls, raw: str | None) -> NodeRouting:
        """The routing a node published (empty when it published none, or garbage)."""
        try:
            return msgspec.json.decode(raw, type=cls) if raw else cls()
        except msgspec.DecodeError:
            return cls()


class _NodeView(msgspec.Struct):
    """A node's hash parsed (NodeState._read, the one place that knows its field names)."""

    states: dict[str, ServerState] = {}
    inflight: list[tuple[int, str, str, int]] = []
    fields: dict[str, str] = {}

    def inflight_by(self, index: int) -> dict[str, int]:
        """Prompts in flight summed per campaign (index 1) or server URL (index 2)."""
        totals: dict[str, int] = {}
        for entry in self.inflight:
            name = str(entry[index])
            totals[name] = totals.get(name, 0) + entry[3]
        return totals


class NodeState:
    """Read and write one worker node's hash (`node`: the Celery node name, eagle-synth@gpu-host-1)."""

    def __init__(self, client: redis.Redis, node: str) -> None:
        self.client = client
        self.node = node
        self.key = worker_key(node)

    def _write(self, mapping: dict, *, transaction: bool = False, fresh: bool = False) -> None:
        """Set fields and refresh the heartbeat (hash TTL, WORKERS_INDEX) in one round trip."""
        pipe = self.client.pipeline(transaction=transaction)
        if fresh:
            pipe.delete(self.key)
        pipe.hset(self.key, mapping=mapping)
        pipe.expire(self.key, WORKER_TTL)
        pipe.zadd(WORKERS_INDEX, {self.node: time.time() + WORKER_TTL})
        pipe.execute()

    def reset(self, servers: list[str]) -> None:
        info = {
            "node": self.node,
            "host": hostname(),
            # Who writes this hash (host|pid|boot): a reader on the same boot knows at once that it died.
            "holder": holder_id(),
            "started": time.time(),
            "servers": json.dumps(servers),
        }
        self._write(info, transaction=True, fresh=True)

    def publish(
        self,
        states: dict[str, ServerState],
        *,
        consuming: bool,
        disk: str | None = None,
        redis: str | None = None,
        routing: NodeRouting | None = None,
    ) -> None:
        """Write every server's state and refresh the heartbeat; `disk` says why the output
        folder cannot take records, `redis` what is wrong with Redis ("" when nothing is);
        `routing`, which campaigns it takes."""
        server_states = {f"state:{url}": msgspec.json.encode(s) for url, s in states.items()}
        fields = {"updated": time.time(), "consuming": int(consuming), "disk": disk or "", "redis": redis or ""}
        if routing is not None:
            fields["routing"] = msgspec.json.encode(routing)
        self._write({**fields, **server_states})

    def _read(self) -> _NodeView:
        view = _NodeView()
        for raw_name, raw_value in self.client.hgetall(self.key).items():
            name = as_text(raw_name)
            value = as_text(raw_value)
            kind, _, rest = name.partition(":")
            if kind == "state":
                view.states[rest] = msgspec.json.decode(value, type=ServerState)
            elif kind == "inflight":
                pid, campaign, url = rest.split(":", 2)
                view.inflight.append((int(pid), campaign, url, int(value)))
            elif kind not in WITHDRAWN_FIELDS:
                view.fields[name] = value
        return view

    def states(self) -> dict[str, ServerState]:
        """The server states the node published."""
        return self._read().states

    def snapshot(self) -> dict:
        """Everything in the hash, decoded (for status)."""
        view = self._read()
        out: dict = dict(view.fields)
        if view.states:
            out["server_states"] = {url: msgspec.structs.asdict(state) for url, state in view.states.items()}
        if view.inflight:
            out["inflight_by_server"] = view.inflight_by(2)
            out["inflight_by_campaign"] = view.inflight_by(1)
        return out

    def publish_inflight(
        self, *, pid: int, counts: Mapping[tuple[str, str], int], previous: Mapping[tuple[str, str], int]
    ) -> None:
        """A worker process says how many prompts it has in flight per (campaign, server URL), in
        one round trip; entries that dropped to zero since `previous` are removed."""
        pipe = self.client.pipeline(transaction=False)
        for (campaign, url), prompts in counts.items():
            if prompts and previous.get((campaign, url)) != prompts:
                pipe.hset(self.key, f"inflight:{pid}:{campaign}:{url}", prompts)
        gone = [f"inflight:{pid}:{c}:{u}" for (c, u) in previous if not counts.get((c, u))]
        if gone:
            pipe.hdel(self.key, *gone)
        pipe.execute()

    def prune_dead_children(self, is_alive) -> None:
        """Drop in-flight counts of worker processes that died (SIGKILL leaves them behind)."""
        dead = [f"inflight:{pid}:{c}:{u}" for pid, c, u, _ in self._read().inflight if not is_alive(pid)]
        if dead:
            self.client.hdel(self.key, *dead)


def all_nodes(client: redis.Redis) -> list[dict]:
    """Snapshots of every live worker node, found through WORKERS_INDEX (entries whose
    heartbeat expired are pruned; a node in the index whose hash is gone is skipped, and so is
    one whose process is known dead: gone from this very boot, its heartbeat not lapsed yet)."""
    client.zremrangebyscore(WORKERS_INDEX, "-inf", time.time())
    nodes = []
    for raw in client.zrange(WORKERS_INDEX, 0, -1):
        node = raw.decode() if isinstance(raw, bytes) else str(raw)
        if client.exists(worker_key(node)):
            snapshot = NodeState(client, node).snapshot()
            if not holder_gone_here(snapshot.get("holder", "")):
                nodes.append(snapshot)
    return sorted(nodes, key=lambda n: n.get("node", ""))


def live_hosts(nodes: list[dict]) -> set[str]:
    """Hosts with at least one live worker node (all_nodes): a batch lease held from any other
    host has lost its holder, whatever the lease's remaining TTL says."""
    return {str(node["host"]) for node in nodes if node.get("host")}
