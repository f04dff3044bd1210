"""Writes under a live batch lease: fenced commits and per-key claims.

A batch thread can lose its lease unknowingly (SIGSTOP, GC pause, swap storm) while a reaper
hands its batch on, so a check-then-write leaves a window: every commit is one transaction that
WATCHes the lease, reads it and writes in MULTI/EXEC only if it still names this holder (else
LeaseLost). Record files are ordered around it in workers/batch.py (`_commit`).

A key can also sit in two batches at once (a republished slow batch, `retry-failed` of a key a
late batch holds), so a batch first claims its open keys in one script: a claim maps the key to
the batch's lease (key and holder) and counts only while that lease names its holder. A key
another live batch holds is skipped; the fenced commit of a key, or the batch's end, releases it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from eagle_synth.errors import EagleSynthError
from eagle_synth.state.lua import script
from eagle_synth.state.redis_client import text

_CLAIM = script("claim_lib", "claim")
_RELEASE = script("claim_release")
_LIVE = script("claim_lib", "claims_live")
# Keys per claim script call (a script blocks Redis while it runs; a batch rarely has more).
CHUNK = 1000


class LeaseLost(EagleSynthError):
    """The batch lease is no longer the writer's: nothing was written."""


class ClaimLeaseLost(EagleSynthError):
    """The batch's own lease was gone when it tried to claim its keys."""


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


def _each_chunk(client: redis.Redis, script: str, names: list[str], args: list[str], keys: list[str]) -> Iterator:
    """The script's reply for each CHUNK of `keys` (KEYS `names`, ARGV `args` then the chunk)."""
    for start in range(0, len(keys), CHUNK):
        yield client.eval(script, len(names), *names, *args, *keys[start : start + CHUNK])


def claim(client: redis.Redis, claims_key: str, lease_key: str, holder: str, keys: list[str]) -> set[str]:
    """Claim `keys` for the batch holding `lease_key` as `holder`; returns the keys another live
    batch holds (not claimed). Raises ClaimLeaseLost if our own lease is gone."""
    busy: set[str] = set()
    for found in _each_chunk(client, _CLAIM, [claims_key, lease_key], [holder], keys):
        if found == -1:
            raise ClaimLeaseLost(f"batch lease {lease_key} is not {holder}")
        busy.update(text(k) for k in found)
    return busy


def release(client: redis.Redis, claims_key: str, lease_key: str, holder: str, keys: list[str]) -> int:
    """Release what is left of the batch's claims (keys another batch claimed since stay its)."""
    value = f"{lease_key}\n{holder}"  # a claim's value (claim_lib.lua); neither part holds a newline
    return sum(int(n) for n in _each_chunk(client, _RELEASE, [claims_key], [value], keys))


def live_claims(client: redis.Redis, claims_key: str, keys: list[str]) -> set[str]:
    """The keys among these that a live batch holds."""
    return {text(k) for found in _each_chunk(client, _LIVE, [claims_key], [], keys) for k in found}
