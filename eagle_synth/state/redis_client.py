"""One way to open a Redis connection from settings, with TLS and ACL users honoured."""

from __future__ import annotations

import redis

from eagle_synth.settings import BrokerSettings

# Seconds a Redis command may block before the caller sees an error instead of hanging.
SOCKET_TIMEOUT = 30
# Seconds to wait for a TCP connection to Redis.
CONNECT_TIMEOUT = 10
# Errors that mean the campaign state cannot be read or written right now (restarting, loading,
# full, a replica mid-failover): a worker waits for Redis, however long that takes, and they
# never count against a batch.
STATE_UNAVAILABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
)


def text(raw: bytes | str) -> str:
    """A Redis reply as str. Our clients return bytes (no decode_responses), but redis-py types
    replies as bytes | str, since which one depends on that runtime switch."""
    return raw.decode() if isinstance(raw, bytes) else raw


def connect(settings: BrokerSettings) -> redis.Redis:
    """A redis-py client for campaign state; users and passwords come from the URL."""
    return redis.Redis.from_url(
        settings.redis_url,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        health_check_interval=30,
        retry_on_timeout=True,
        **(settings.ssl_options() or {}),
    )


def pipelined(client: redis.Redis, *commands: tuple) -> list:
    """The replies of `commands` (each: a method name, then its arguments) sent in one round trip
    (a pipeline, not a transaction)."""
    pipe = client.pipeline(transaction=False)
    for name, *args in commands:
        getattr(pipe, name)(*args)
    return pipe.execute()
