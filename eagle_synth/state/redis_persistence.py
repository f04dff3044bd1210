"""Redis must keep the campaign across a restart: the check `enqueue` and `worker` run first.

The campaign (its enqueued, done and failed sets, the stored batches) lives only in Redis. A
Redis with neither an append-only file nor RDB snapshots comes back empty after a restart:
every prompt not yet done is silently gone, and the reconciler cannot bring back what Redis no
longer knows. So both commands read `appendonly` and `save` (CONFIG GET, else INFO
persistence) and refuse such a Redis unless the operator accepts the risk
(`--allow-volatile-redis`). `appendonly yes` is what to run (an RDB snapshot alone loses the
writes since the last one); a snapshot schedule is accepted with a warning-free pass, since
what it loses on a crash the reconciler and `enqueue`'s rerun bring back.
"""

from __future__ import annotations

import redis

from eagle_synth.errors import UserError

# The flag that accepts a Redis that keeps nothing across a restart; named in every refusal.
OVERRIDE_FLAG = "--allow-volatile-redis"


class VolatileRedisError(UserError, RuntimeError):
    """Redis persists nothing (no AOF, no RDB save schedule); the message says how to fix or override."""


def read_persistence(client: redis.Redis) -> tuple[bool | None, str]:
    """(persists, how): True/False when known, None (with why) when CONFIG and INFO are refused."""
    try:
        config = client.config_get("appendonly")
        config.update(client.config_get("save"))
        aof = str(config.get("appendonly", "")).lower() == "yes"
        save = str(config.get("save", "")).strip()
        if aof:
            return True, "appendonly yes"
        if save:
            return True, f"save {save!r}"
        return False, "appendonly no and save ''"
    except redis.ResponseError as exc:  # NOPERM (ACL) or CONFIG renamed/disabled
        refused = f"CONFIG GET refused: {exc}"
    try:
        info = client.info("persistence")
    except redis.ResponseError as exc:
        return None, f"{refused}; INFO refused: {exc}"
    if int(info.get("aof_enabled", 0)):
        return True, "aof_enabled"
    # INFO does not show the save schedule: without CONFIG we cannot tell.
    return None, f"{refused}; INFO persistence shows no append-only file and not the save schedule"


def check_persistence(client: redis.Redis, *, allow_volatile: bool = False) -> str | None:
    """Raise VolatileRedisError if Redis would lose the campaign on restart (unless allow_volatile).

    Returns a warning when persistence could not be read or a volatile Redis was accepted."""
    persists, how = read_persistence(client)
    if persists:
        return None
    if persists is None:
        return f"could not tell whether Redis persists its data ({how}); run it with `appendonly yes`"
    message = (
        f"Redis persists nothing ({how}): a restart would silently lose the campaign's queue and state; "
        f"run it with `--appendonly yes` (or `CONFIG SET appendonly yes` and `CONFIG REWRITE`), "
        f"or pass {OVERRIDE_FLAG} to accept the risk"
    )
    if not allow_volatile:
        raise VolatileRedisError(message)
    return f"{OVERRIDE_FLAG}: Redis persists nothing; a restart loses the campaign"
