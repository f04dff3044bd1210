"""Redis must never evict: checks both sides run before they touch the queue.

A Redis that evicts keys when full (any `maxmemory-policy` but `noeviction`) silently drops
queue lists, kombu's bindings or a campaign's `enqueued` set: work is lost or done twice
with no error anywhere. So `enqueue` and `worker` read the policy first and refuse such a
Redis unless the operator accepts the risk (`--allow-evicting-redis`). Managed Redis often
forbids CONFIG; the policy is then read from INFO, and if that is forbidden too the check
becomes a warning. With `noeviction` a full Redis refuses writes instead
(redis.exceptions.OutOfMemoryError): `out_of_memory_message` explains that in one line.
"""

from __future__ import annotations

import redis

from eagle_synth.errors import UserError

# The only eviction policy under which Redis never drops a key on its own.
REQUIRED_POLICY = "noeviction"
# The flag that accepts an evicting Redis; named in every refusal.
OVERRIDE_FLAG = "--allow-evicting-redis"
# Text of Redis's OOM reply, which kombu wraps into its own OperationalError.
_OOM_REPLY = "used memory > 'maxmemory'"


class EvictingRedisError(UserError, RuntimeError):
    """Redis may evict keys; the message says which policy and how to fix or override it."""


def read_eviction_policy(client: redis.Redis) -> tuple[str | None, str | None]:
    """(policy, None), or (None, why it could not be read) when CONFIG and INFO are both refused.

    CONFIG GET comes first (it is what operators set); ACL users without `config` and
    managed services that rename or disable CONFIG get the same field from INFO memory.
    """
    problems = []
    try:
        value = client.config_get("maxmemory-policy").get("maxmemory-policy")
        if value:
            return str(value), None
        problems.append("CONFIG GET maxmemory-policy returned nothing")
    except redis.ResponseError as exc:  # NOPERM (ACL) and "unknown command" (renamed/disabled)
        problems.append(f"CONFIG GET refused: {exc}")
    try:
        value = client.info("memory").get("maxmemory_policy")
        if value:
            return str(value), None
        problems.append("INFO memory has no maxmemory_policy")
    except redis.ResponseError as exc:
        problems.append(f"INFO refused: {exc}")
    return None, "; ".join(problems)


def check_eviction_policy(client: redis.Redis, *, allow_evicting: bool = False) -> str | None:
    """Raise EvictingRedisError if Redis may evict keys (unless allow_evicting).

    Returns a warning to show when the policy could not be read or an evicting policy was
    accepted; None when Redis is set up right.
    """
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


def check_redis_ready(client: redis.Redis, *, allow_evicting: bool = False, allow_volatile: bool = False) -> str | None:
    """Ping (which authenticates), check the eviction policy and that Redis persists its data
    (eagle_synth.state.redis_persistence); returns a warning or None.

    Raises redis.AuthenticationError / ConnectionError for bad credentials or an unreachable
    Redis, EvictingRedisError and VolatileRedisError, so a command can stop with one line
    before doing anything.
    """
    from eagle_synth.state.redis_persistence import check_persistence

    client.ping()
    warnings = [
        check_eviction_policy(client, allow_evicting=allow_evicting),
        check_persistence(client, allow_volatile=allow_volatile),
    ]
    return "; ".join(w for w in warnings if w) or None


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
    """What to tell the user when Redis is full (with noeviction it refuses writes)."""
    return (
        "Redis is full (used memory > maxmemory) and refuses writes; nothing was lost. Let workers "
        "drain the queue, lower `enqueue --max-backlog`, or raise Redis's maxmemory, then rerun the "
        "command (reruns are safe: enqueue resumes where it stopped)."
    )
