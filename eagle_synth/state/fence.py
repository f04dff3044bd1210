"""Writes under a live batch lease: fenced commits and per-key claims.

A batch thread can lose its lease unknowingly (SIGSTOP, GC pause, swap storm) while a reaper
hands its batch on, so a check-then-write leaves a window: every commit is one transaction that
WATCHes the lease, reads it and writes in MULTI/EXEC only if it still names this holder (else
LeaseLost). Record files are ordered around it in workers/batch.py (`_commit`).

A commit whose reply never came (connection reset, a reply later than the socket timeout, an
EXEC delivered late after a partition) may or may not have applied; redis-py reports it as a
WatchError like a changed lease, so it is told apart here and raised as CommitUnsure. Each
commit writes, in its transaction, a receipt (a fresh token under the holder, in the batch's
receipts hash); `settle` reads it back, and if the try did not apply, changes the lease so that
a try still on its way can apply nothing any more. The outcome is then known for sure.

A key can also sit in two batches at once (a republished slow batch, `retry-failed` of a key a
late batch holds), so a batch first claims its open keys in one script: a claim maps the key to
the batch's lease (key and holder) and counts only while that lease names its holder. A key
another live batch holds is skipped; the fenced commit of a key, or the batch's end, releases it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from eagle_synth.errors import ClaimLeaseLost, CommitUnsure, LeaseLost
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.redis_client import text

_CLAIM = LuaScript("claim_lib", "claim")
_RELEASE = LuaScript("claim_release")
_LIVE = LuaScript("claim_lib", "claims_live")
_SETTLE = LuaScript("commit_settle")
_RENEW = LuaScript("renew")
# How long a batch's commit receipts outlive its last commit, ms: longer than any Redis outage
# a batch waits through before it reads back whether its commit applied (a day; they are small).
RECEIPT_TTL_MS = 24 * 3600 * 1000
# Keys per claim script call (a script blocks Redis while it runs; a batch rarely has more).
CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Fence:
    """The lease a batch's writes are fenced by: CampaignKeys.lease(batch), its holder id
    (BatchLease.holder), its lifetime that `renew` grants, CampaignKeys.claims, from which
    the keys written are released in the same step, and CampaignKeys.receipts(batch), where each
    commit leaves its receipt for `settle`."""

    lease_key: str
    holder: str
    ttl_ms: int
    claims_key: str
    receipts_key: str

    def renew(self, client: redis.Redis) -> None:
        """Renew the lease now (a full TTL for what follows), or raise LeaseLost."""
        if not _RENEW(client, (self.lease_key,), (self.holder, self.ttl_ms)):
            raise LeaseLost(f"batch lease {self.lease_key} is not {self.holder} any more")

    def run(self, client: redis.Redis, write: Callable[[Any], None], *, release: Sequence[str] = ()) -> list:
        """Queue `write(pipe)` (commands on a transaction pipeline) and apply it only if the lease
        is still ours, releasing the claims of `release` with it; returns the results of the
        commands `write` queued (the claim release's last). Raises LeaseLost, or CommitUnsure
        when the transaction was sent and no reply came."""
        receipt = secrets.token_hex(8)
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
                pipe.hset(self.receipts_key, self.holder, receipt)
                pipe.pexpire(self.receipts_key, RECEIPT_TTL_MS)
                results = pipe.execute()
            except redis.WatchError as exc:
                # redis-py turns a connection error on a watched pipeline into a WatchError too.
                if isinstance(exc.__context__, (redis.ConnectionError, redis.TimeoutError)):
                    raise CommitUnsure(f"no reply to the commit under {self.lease_key}", receipt) from exc
                raise LeaseLost(f"batch lease {self.lease_key} changed during the commit") from exc
        written = results[:-2]  # without the receipt's two replies
        return written[:-1] if release else written

    def settle(self, client: redis.Redis, receipts: Sequence[str]) -> bool:
        """Whether one of the commit tries named by `receipts` (CommitUnsure.receipt) applied.
        False means none did and none can any more, and the lease is still ours (renewed); a lease
        lost meanwhile raises LeaseLost. Raises redis errors while Redis does not answer."""
        outcome = int(_SETTLE(client, (self.lease_key, self.receipts_key), (self.holder, self.ttl_ms, *receipts)))
        if outcome < 0:
            raise LeaseLost(f"batch lease {self.lease_key} is not {self.holder} any more; its commit did not apply")
        return outcome == 1

    def run_script(
        self,
        client: redis.Redis,
        script: LuaScript,
        keys: Sequence[Any],
        args: Sequence[Any],
        *,
        release: Sequence[str] = (),
    ) -> Any:
        """`script(client, keys, args)`, fenced: the script's result, or LeaseLost."""
        return self.run(client, lambda pipe: script(pipe, keys, args), release=release)[0]


def _each_chunk(client: redis.Redis, script: LuaScript, names: list[str], args: list[str], keys: list[str]) -> Iterator:
    """The script's reply for each CHUNK of `keys` (KEYS `names`, ARGV `args` then the chunk)."""
    for start in range(0, len(keys), CHUNK):
        yield script(client, names, [*args, *keys[start : start + CHUNK]])


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
