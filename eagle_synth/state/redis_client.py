"""One way to open a Redis connection from settings, with TLS and ACL users honoured; through
Sentinel (a `sentinel://` REDIS_URL) the client asks the sentinels for the current master on
every new connection, so it follows a failover."""

from __future__ import annotations

import redis
import redis.sentinel

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


# Seconds between PINGs of a connection idle that long (a dead peer shows before a command hangs).
HEALTH_CHECK_INTERVAL = 30


def connect(settings: BrokerSettings) -> redis.Redis:
    """A redis-py client for campaign state; users and passwords come from the URL."""
    if settings.uses_sentinel:
        return _master_through_sentinel(settings)
    return redis.Redis.from_url(
        settings.redis_url,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        health_check_interval=HEALTH_CHECK_INTERVAL,
        retry_on_timeout=True,
        **(settings.ssl_options() or {}),
    )


def _master_through_sentinel(settings: BrokerSettings) -> redis.Redis:
    """A client of the master the sentinels name now (asked again on each new connection; one
    to an old master that became a replica is dropped on its first READONLY reply)."""
    assert settings.sentinel_master is not None  # BrokerSettings.load refuses a Sentinel URL without it
    sentinels = redis.sentinel.Sentinel(settings.sentinel_addresses, sentinel_kwargs=settings.sentinel_kwargs())
    tls = {"ssl": True, **(settings.ssl_options() or {})} if settings.uses_tls else {}
    return sentinels.master_for(
        settings.sentinel_master,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        health_check_interval=HEALTH_CHECK_INTERVAL,
        retry_on_timeout=True,
        **settings.sentinel_master_auth,
        **tls,
    )


def pipelined(client: redis.Redis, *commands: tuple) -> list:
    """The replies of `commands` (each: a method name, then its arguments) sent in one round trip
    (a pipeline, not a transaction)."""
    pipe = client.pipeline(transaction=False)
    for name, *args in commands:
        getattr(pipe, name)(*args)
    return pipe.execute()
