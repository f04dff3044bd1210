"""Where settings come from: flags, then the environment, then these defaults.

Both sides read connection and queue settings here; `celeryconfig.py` turns them into
Celery's configuration. The CLI writes flags into the environment before starting a worker
process, so one precedence rule covers the CLI, `celery -A workers.app worker` and tests.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, parse_qsl, urlencode, urlparse, urlunparse

from eagle_synth.errors import UserError

# Where Redis is when nothing says otherwise: the local development instance.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# The Celery queue every campaign's batches travel on.
DEFAULT_QUEUE = "eagle-synth"
# Seconds an unacknowledged message stays reserved before Redis hands it to another worker.
# It must exceed the longest task including its in-task retries; tasks stop themselves at
# TASK_BUDGET_SHARE of it and requeue, so the limit is never overrun.
DEFAULT_VISIBILITY_TIMEOUT = 6 * 3600
# Seconds between kombu's sweeps that return expired unacked messages to the queue.
DEFAULT_RESTORE_INTERVAL = 10
# Seconds a SIGTERMed worker may spend finishing batches before it puts the rest back.
DEFAULT_SOFT_SHUTDOWN = 30
# Share of the visibility timeout a task may use before it requeues itself instead.
TASK_BUDGET_SHARE = 0.8

ENV_REDIS_URL = "REDIS_URL"
ENV_QUEUE = "EAGLE_SYNTH_QUEUE"
ENV_VISIBILITY_TIMEOUT = "EAGLE_SYNTH_VISIBILITY_TIMEOUT"
ENV_RESTORE_INTERVAL = "EAGLE_SYNTH_RESTORE_INTERVAL"
ENV_SOFT_SHUTDOWN = "EAGLE_SYNTH_SOFT_SHUTDOWN_TIMEOUT"
ENV_REDIS_CA = "EAGLE_SYNTH_REDIS_CA"
ENV_REDIS_CERT = "EAGLE_SYNTH_REDIS_CERT"
ENV_REDIS_KEY = "EAGLE_SYNTH_REDIS_KEY"


class SettingsError(UserError, ValueError):
    """A setting has a value that cannot work; the message says which and how to fix it."""


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Connection to Redis (broker and campaign state) and the queue's timing.

    Parameters:
        redis_url: `redis://[user:password@]host:port/db` or `rediss://...` for TLS.
        queue: Celery queue name shared by producer and workers.
        visibility_timeout: seconds before an unacked message is redelivered.
        restore_interval: seconds between kombu's redelivery sweeps.
        soft_shutdown_timeout: seconds a SIGTERMed worker finishes batches before requeueing.
        ssl_ca, ssl_cert, ssl_key: optional certificate files for `rediss://`.
    """

    redis_url: str = DEFAULT_REDIS_URL
    queue: str = DEFAULT_QUEUE
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT
    restore_interval: int = DEFAULT_RESTORE_INTERVAL
    soft_shutdown_timeout: int = DEFAULT_SOFT_SHUTDOWN
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None

    @property
    def uses_tls(self) -> bool:
        return self.redis_url.startswith("rediss://")

    @property
    def task_budget_seconds(self) -> float:
        """How long one task may run before it must hand its batch back to the queue."""
        return self.visibility_timeout * TASK_BUDGET_SHARE

    @property
    def url_without_ssl_query(self) -> str:
        """The URL minus its `ssl_*` query parameters: kombu lets those replace the whole
        `broker_use_ssl` dict (dropping the CA file), so they travel in ssl_options instead."""
        parts = urlparse(self.redis_url)
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not k.startswith("ssl_")]
        return urlunparse(parts._replace(query=urlencode(query)))

    def ssl_options(self) -> dict | None:
        """Options for Celery's `broker_use_ssl` and redis-py, or None for plain TCP."""
        if not self.uses_tls:
            return None
        query = parse_qs(urlparse(self.redis_url).query)
        reqs = (query.get("ssl_cert_reqs") or ["required"])[0].lower()
        cert_reqs = {
            "required": ssl.CERT_REQUIRED,
            "cert_required": ssl.CERT_REQUIRED,
            "optional": ssl.CERT_OPTIONAL,
            "cert_optional": ssl.CERT_OPTIONAL,
            "none": ssl.CERT_NONE,
            "cert_none": ssl.CERT_NONE,
        }.get(reqs, ssl.CERT_REQUIRED)
        options: dict = {"ssl_cert_reqs": cert_reqs}
        if self.ssl_ca:
            options["ssl_ca_certs"] = self.ssl_ca
        if self.ssl_cert:
            options["ssl_certfile"] = self.ssl_cert
        if self.ssl_key:
            options["ssl_keyfile"] = self.ssl_key
        return options


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a whole number of seconds") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r} must be positive")
    return value


def broker_settings(*, redis_url: str | None = None, queue: str | None = None) -> BrokerSettings:
    """Resolve broker settings: explicit arguments, then the environment, then defaults."""
    url = redis_url or os.environ.get(ENV_REDIS_URL) or DEFAULT_REDIS_URL
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise SettingsError(f"REDIS_URL {url!r} must start with redis://, rediss:// (TLS) or unix://")
    return BrokerSettings(
        redis_url=url,
        queue=queue or os.environ.get(ENV_QUEUE) or DEFAULT_QUEUE,
        visibility_timeout=_int_env(ENV_VISIBILITY_TIMEOUT, DEFAULT_VISIBILITY_TIMEOUT),
        restore_interval=_int_env(ENV_RESTORE_INTERVAL, DEFAULT_RESTORE_INTERVAL),
        soft_shutdown_timeout=_int_env(ENV_SOFT_SHUTDOWN, DEFAULT_SOFT_SHUTDOWN),
        ssl_ca=os.environ.get(ENV_REDIS_CA) or None,
        ssl_cert=os.environ.get(ENV_REDIS_CERT) or None,
        ssl_key=os.environ.get(ENV_REDIS_KEY) or None,
    )


def export_to_environment(settings: BrokerSettings) -> None:
    """Write resolved settings into the environment so child processes see the same ones."""
    os.environ[ENV_REDIS_URL] = settings.redis_url
    os.environ[ENV_QUEUE] = settings.queue
    os.environ[ENV_VISIBILITY_TIMEOUT] = str(settings.visibility_timeout)
    os.environ[ENV_RESTORE_INTERVAL] = str(settings.restore_interval)
    os.environ[ENV_SOFT_SHUTDOWN] = str(settings.soft_shutdown_timeout)
