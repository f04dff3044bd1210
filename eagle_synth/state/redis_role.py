"""Which role the Redis at REDIS_URL plays: eagle-synth writes campaign state, so a read-only
replica there is a mistake to name, not an outage to retry (a worker restarted against it would
fail again, and again). Read at start by `status`, `enqueue` and the worker, and again when a
write is refused with READONLY (a master demoted by a failover).
"""

from __future__ import annotations

import redis

from eagle_synth.errors import ReadOnlyReplica

# Roles (ROLE's first item, INFO's `role:`) of a server that refuses writes.
REPLICA_ROLES = frozenset({"slave", "replica"})
# Redis's reply to a write on a replica: `READONLY You can't write against a read only replica.`
# (redis-py raises ReadOnlyError without the code; kombu wraps it, quoting the words).
READONLY_WORDS = "write against a read only replica"


def address_of(client: redis.Redis) -> str:
    """host:port (or the socket path) the client connects to; never its password."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def master_of(client: redis.Redis) -> str | None:
    """The master's host:port if this Redis is a replica, else None. ROLE, else INFO replication
    (an ACL user without ROLE); neither readable: None (the writes will say)."""
    try:
        role = client.execute_command("ROLE")
        if _text(role[0]) not in REPLICA_ROLES:
            return None
        return f"{_text(role[1])}:{role[2]}"
    except redis.ResponseError:
        pass
    try:
        info = client.info("replication")
    except redis.ResponseError:
        return None
    if str(info.get("role")) not in REPLICA_ROLES:
        return None
    return f"{info.get('master_host')}:{info.get('master_port')}"


def refuse_replica(client: redis.Redis) -> None:
    """Raise ReadOnlyReplica if the client's Redis is a replica."""
    if (master := master_of(client)) is not None:
        raise ReadOnlyReplica(address_of(client), master)


def is_read_only(exc: BaseException) -> bool:
    """True if exc (or what it wraps, as kombu does) is Redis refusing a write as a replica."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, redis.ReadOnlyError) or READONLY_WORDS in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def read_only_message(client: redis.Redis) -> str:
    """The line for a write refused as READONLY: the replica and its master if Redis says."""
    try:
        refuse_replica(client)
    except ReadOnlyReplica as exc:
        return str(exc)
    except redis.RedisError:
        pass
    return (
        f"the Redis at {address_of(client)} refused a write as a read-only replica (READONLY): point "
        "REDIS_URL (or --redis) at the master"
    )
