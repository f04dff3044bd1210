"""Fenced writes: campaign state changes made only while the writer's batch lease is its own.

A batch thread can lose its lease without knowing it (frozen by SIGSTOP, a GC pause, a swap
storm past the lease TTL) while a reaper gives its batch to another worker. Checking the
lease and then writing leaves a window; so every commit is one Redis transaction that checks
the lease and writes together: WATCH the lease, read it, and only if it still names this holder
run the write inside MULTI/EXEC. Any change of the lease between the read and EXEC aborts the
transaction (LeaseLost), so a write is applied only by the holder of a live lease.

Record files cannot be in that transaction; the order that keeps them right is in
workers/batch.py (`_commit`): `renew` just before the rename, the fenced mark after it, and
the file removed again if the mark finds the lease gone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from eagle_synth.errors import EagleSynthError
from eagle_synth.state.lua import script
from eagle_synth.state.redis_client import text


class LeaseLost(EagleSynthError):
    """The batch lease is no longer the writer's: nothing was written."""


@dataclass(frozen=True, slots=True)
class Fence:
    """The lease a batch's writes are fenced by: CampaignKeys.lease(batch), its holder id
    (BatchLease.holder), its lifetime that `renew` grants, and CampaignKeys.claims, from which
    the keys written are released in the same step."""

    lease_key: str
    holder: str
    ttl_ms: int
    claims_key: str

    def renew(self, client: redis.Redis) -> None:
        """Renew the lease now (a full TTL for what follows), or raise LeaseLost."""
        if not client.eval(script("renew"), 1, self.lease_key, self.holder, self.ttl_ms):
            raise LeaseLost(f"batch lease {self.lease_key} is not {self.holder} any more")

    def run(self, client: redis.Redis, write: Callable[[Any], None], *, release: Sequence[str] = ()) -> list:
        """Queue `write(pipe)` (commands on a transaction pipeline) and apply it only if the lease
        is still ours, releasing the claims of `release` with it; returns the results of the
        commands `write` queued (the claim release's last). Raises LeaseLost."""
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.lease_key)
                current = pipe.get(self.lease_key)
                if current is None or text(current) != self.holder:
                    raise LeaseLost(f"batch lease {self.lease_key} is not {self.holder} any more")
                pipe.multi()
                write(pipe)
                if release:
                    pipe.hdel(self.claims_key, *release)
                results = pipe.execute()
            except redis.WatchError as exc:
                raise LeaseLost(f"batch lease {self.lease_key} changed during the commit") from exc
        return results[:-1] if release else results

    def eval(self, client: redis.Redis, script: str, numkeys: int, *args: Any, release: Sequence[str] = ()) -> Any:
        """`client.eval(script, ...)`, fenced: the script's result, or LeaseLost."""
        return self.run(client, lambda pipe: pipe.eval(script, numkeys, *args), release=release)[0]
