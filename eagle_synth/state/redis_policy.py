"""Redis must neither evict nor forget: the checks `enqueue` and `worker` run first.

An evicting Redis silently drops queue lists or key sets; one with neither AOF nor RDB comes
back empty after a restart. Both are refused unless the operator accepts the risk (the flags
below); an RDB schedule passes, as the reconciler and a rerun bring back what a crash loses.
Where CONFIG is forbidden the values come from INFO, else the check becomes a warning. A full
`noeviction` Redis refuses writes (OutOfMemoryError): `out_of_memory_message` says so.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from eagle_synth.errors import EvictingRedisError, VolatileRedisError

# The only eviction policy under which Redis never drops a key on its own.
REQUIRED_POLICY = "noeviction"
# The flags that accept an evicting / a non-persisting Redis.
OVERRIDE_FLAG = "--allow-evicting-redis"
VOLATILE_FLAG = "--allow-volatile-redis"
# Text of Redis's OOM reply, which kombu wraps into its own OperationalError.
_OOM_REPLY = "used memory > 'maxmemory'"


def read_eviction_policy(client: redis.Redis) -> tuple[str | None, str | None]:
    """(policy, None), or (None, why) when CONFIG and INFO are both refused."""
    problems = []
    try:
        if value := client.config_get("maxmemory-policy").get("maxmemory-policy"):
            return str(value), None
        problems.append("CONFIG GET maxmemory-policy returned nothing")
    except redis.ResponseError as exc:  # NOPERM (ACL) and "unknown command" (renamed/disabled)
        problems.append(f"CONFIG GET refused: {exc}")
    try:
        if value := client.info("memory").get("maxmemory_policy"):
            return str(value), None
        problems.append("INFO memory has no maxmemory_policy")
    except redis.ResponseError as exc:
        problems.append(f"INFO refused: {exc}")
    return None, "; ".join(problems)


def check_eviction_policy(client: redis.Redis, *, allow_evicting: bool = False) -> str | None:
    """Raise EvictingRedisError if Redis may evict (unless allow_evicting); else a warning or None."""
    policy, problem = read_eviction_policy(client)
    if policy is None:
        return (
            f"could not read Redis's maxmemory-policy ({problem}); make sure it is "
            f"{REQUIRED_POLICY}, or evicted keys will lose or double work"
        )
    if policy == REQUIRED_POLICY:
        return None
    message = (
        f"Redis runs with maxmemory-policy {policy}: when full it evicts keys and silently "
        f"loses or doubles queued work; set `maxmemory-policy {REQUIRED_POLICY}` "
        f"(or pass {OVERRIDE_FLAG} to accept the risk)"
    )
    if not allow_evicting:
        raise EvictingRedisError(message)
    return f"{OVERRIDE_FLAG}: {message.split(':', 1)[0]}; going on at your own risk"


def read_persistence(client: redis.Redis) -> tuple[bool | None, str]:
    """(persists, how): True/False when known, None (with why) when CONFIG and INFO are refused."""
    try:
        config = client.config_get("appendonly")
        config.update(client.config_get("save"))
        save = str(config.get("save", "")).strip()
        if str(config.get("appendonly", "")).lower() == "yes":
            return True, "appendonly yes"
        return (True, f"save {save!r}") if save else (False, "appendonly no and save ''")
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
    """Raise VolatileRedisError if Redis persists nothing (unless allow_volatile); else a warning or None."""
    persists, how = read_persistence(client)
    if persists:
        return None
    if persists is None:
        return f"could not tell whether Redis persists its data ({how}); run it with `appendonly yes`"
    if not allow_volatile:
        raise VolatileRedisError(
            f"Redis persists nothing ({how}): a restart would silently lose the campaign's queue and state; "
            "run redis-server with `--appendonly yes --dir DIR`, or on this one `CONFIG SET appendonly yes` "
            "(its file goes to the server's working directory, `CONFIG GET dir`; `CONFIG SET dir` first to "
            "choose) then `CONFIG REWRITE` if it was started from a config file (else it fails: keep "
            f"`--appendonly yes` for the next start), or pass {VOLATILE_FLAG} to accept the risk"
        )
    return f"{VOLATILE_FLAG}: Redis persists nothing; a restart loses the campaign"


def check_redis_ready(
    client: redis.Redis, *, warn: Callable[[str], None], allow_evicting: bool = False, allow_volatile: bool = False
) -> None:
    """Ping (authenticating), then both checks; passes any warning to `warn`, raises the checks' and redis's errors."""
    client.ping()
    warnings = [
        check_eviction_policy(client, allow_evicting=allow_evicting),
        check_persistence(client, allow_volatile=allow_volatile),
    ]
    if warning := "; ".join(w for w in warnings if w):
        warn(warning)


def is_out_of_memory(exc: BaseException) -> bool:
    """True if exc (or what it wraps, as kombu does) is Redis refusing a write because it is full."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, redis.exceptions.OutOfMemoryError) or _OOM_REPLY in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def out_of_memory_message() -> str:
    return (
        "Redis is full (used memory > maxmemory) and refuses writes; nothing was lost. Let workers "
        "drain the queue, lower `enqueue --max-backlog`, or raise Redis's maxmemory, then rerun the "
        "command (reruns are safe: enqueue resumes where it stopped)."
    )
