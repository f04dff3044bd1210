"""Settings come from arguments (the CLI's flags), then the environment (`EAGLE_SYNTH_` + the
field in capitals, or its alias), then defaults: `BrokerSettings`, `Timings` and workers/config.py's
`WorkerConfig`. A process hands its resolved settings to a child's environment (`to_env`).
"""

from __future__ import annotations

import ssl
from typing import Any, ClassVar, Self
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlparse, urlunparse

from pydantic import Field, NonNegativeInt, PositiveInt, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from eagle_synth.errors import SettingsError, UserError

# The Celery queue every campaign's batches travel on.
DEFAULT_QUEUE = "eagle-synth"
# Seconds a SIGTERMed worker may spend finishing batches before it puts the rest back.
DEFAULT_SOFT_SHUTDOWN = 30
# Share of the visibility timeout a task may use before it requeues itself instead, so the
# timeout (which must exceed the longest task with its in-task retries) is never overrun.
TASK_BUDGET_SHARE = 0.8
ENV_PREFIX = "EAGLE_SYNTH_"
# kombu's scheme for a Redis found through Sentinel, and the sentinels' port when a part has none.
SENTINEL_SCHEME = "sentinel://"
SENTINEL_DEFAULT_PORT = 26379
# Seconds a sentinel may take to answer "who is the master?" before the next one is asked.
SENTINEL_SOCKET_TIMEOUT = 5.0


class EnvSettings(BaseSettings):
    """The family's rules: EAGLE_SYNTH_ names, an empty variable means unset, values frozen."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True, extra="ignore", populate_by_name=True
    )
    # Raised (with every problem, by environment name) for a value that does not parse.
    error: ClassVar[type[UserError]] = SettingsError

    @classmethod
    def env_name(cls, name: str) -> str:
        if name not in cls.model_fields:  # already an alias
            return name
        alias = cls.model_fields[name].validation_alias
        return alias if isinstance(alias, str) else ENV_PREFIX + name.upper()

    @classmethod
    def load(cls, **given: Any) -> Self:
        """Arguments that are not None, else the environment, else the defaults."""
        try:
            return cls(**{name: value for name, value in given.items() if value is not None})
        except ValidationError as exc:
            raise cls.error(
                "; ".join(
                    f"{cls.env_name(str(e['loc'][0])) if e['loc'] else cls.__name__} {e['input']!r}: "
                    + e["msg"].removeprefix("Value error, ")
                    for e in exc.errors()
                )
            ) from None

    def to_env(self) -> dict[str, str]:
        """Every setting as the environment variable a child process reads back."""

        def form(value: Any) -> str:
            if isinstance(value, bool):
                return "1" if value else "0"
            if isinstance(value, SecretStr):
                return value.get_secret_value()
            return ",".join(value) if isinstance(value, tuple) else "" if value is None else str(value)

        return {self.env_name(name): form(getattr(self, name)) for name in type(self).model_fields}


class BrokerSettings(EnvSettings):
    """Redis (REDIS_URL: `redis://[user:password@]host:port/db`, `rediss://` for TLS, with
    optional `ssl_*` certificate files; or Sentinel in kombu's form
    `sentinel://[user:password@]host:port[/db];sentinel://host:port;...` with the master's name in
    `sentinel_master`, the sentinels' own password if they have one in `sentinel_password`, and
    `sentinel_tls` for TLS to master and sentinels), the replicas that must hold each mark
    (`min_replicas`; unset: one whenever the master has one, eagle_synth/state/replicas.py), the
    Celery `queue`, the seconds an unacked
    message stays reserved (`visibility_timeout`), between kombu's restore sweeps, and of a soft
    shutdown."""

    redis_url: str = Field("redis://127.0.0.1:6379/0", validation_alias="REDIS_URL")
    sentinel_master: str | None = None
    sentinel_password: SecretStr | None = None
    sentinel_tls: bool = False
    min_replicas: NonNegativeInt | None = None
    queue: str = DEFAULT_QUEUE
    visibility_timeout: PositiveInt = 6 * 3600
    restore_interval: PositiveInt = 10
    soft_shutdown_timeout: PositiveInt = DEFAULT_SOFT_SHUTDOWN
    ssl_ca: str | None = Field(None, validation_alias="EAGLE_SYNTH_REDIS_CA")
    ssl_cert: str | None = Field(None, validation_alias="EAGLE_SYNTH_REDIS_CERT")
    ssl_key: str | None = Field(None, validation_alias="EAGLE_SYNTH_REDIS_KEY")

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str) -> str:
        if url.startswith(SENTINEL_SCHEME):
            if not all(part.startswith(SENTINEL_SCHEME) and urlparse(part).hostname for part in url.split(";")):
                raise ValueError("a Sentinel URL is sentinel://HOST:PORT;sentinel://HOST:PORT;... (every part)")
            return url
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// (TLS), unix:// or sentinel://")
        return url

    @classmethod
    def load(cls, **given: Any) -> Self:
        """As EnvSettings.load; a Sentinel URL also needs the master's name."""
        settings = super().load(**given)
        if settings.uses_sentinel and not settings.sentinel_master:
            raise SettingsError(
                f"REDIS_URL names sentinels: set {ENV_PREFIX}SENTINEL_MASTER to the master's name "
                "(the NAME of `sentinel monitor NAME ...` in their configuration)"
            )
        return settings

    @property
    def uses_sentinel(self) -> bool:
        return self.redis_url.startswith(SENTINEL_SCHEME)

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """(host, port) of every sentinel of a Sentinel URL (port 26379 when not given)."""
        parts = [urlparse(part) for part in self.redis_url.split(";")] if self.uses_sentinel else []
        return [(str(part.hostname), part.port or SENTINEL_DEFAULT_PORT) for part in parts]

    @property
    def sentinel_master_auth(self) -> dict[str, Any]:
        """The master's database, user and password, from the first sentinel part (as kombu reads them)."""
        first = urlparse(self.redis_url.split(";")[0])
        auth = {"db": first.path.strip("/") or "0"}
        if first.username:
            auth["username"] = unquote(first.username)
        if first.password:
            auth["password"] = unquote(first.password)
        return auth

    def sentinel_kwargs(self) -> dict[str, Any]:
        """How to reach the sentinels themselves: their password and TLS, with our timeouts."""
        options: dict[str, Any] = {"socket_timeout": SENTINEL_SOCKET_TIMEOUT}
        if self.sentinel_password is not None:
            options["password"] = self.sentinel_password.get_secret_value()
        if self.uses_tls:
            options.update({"ssl": True, **(self.ssl_options() or {})})
        return options

    @property
    def uses_tls(self) -> bool:
        return self.redis_url.startswith("rediss://") or (self.uses_sentinel and self.sentinel_tls)

    @property
    def task_budget_seconds(self) -> float:
        """How long one task may run before it must hand its batch back to the queue."""
        return self.visibility_timeout * TASK_BUDGET_SHARE

    @property
    def url_without_ssl_query(self) -> str:
        """The URL (each sentinel's part) minus `ssl_*` parameters (kombu would let them replace
        `broker_use_ssl`)."""

        def without_ssl(url: str) -> str:
            parts = urlparse(url)
            query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not k.startswith("ssl_")]
            return urlunparse(parts._replace(query=urlencode(query)))

        return ";".join(without_ssl(part) for part in self.redis_url.split(";"))

    def ssl_options(self) -> dict | None:
        """Options for Celery's `broker_use_ssl` and redis-py, or None for plain TCP."""
        if not self.uses_tls:
            return None
        reqs = (parse_qs(urlparse(self.redis_url.split(";")[0]).query).get("ssl_cert_reqs") or ["required"])[0].lower()
        none = ssl.CERT_NONE
        optional = ssl.CERT_OPTIONAL
        cert_reqs = {"optional": optional, "cert_optional": optional, "none": none, "cert_none": none}
        files = {"ssl_ca_certs": self.ssl_ca, "ssl_certfile": self.ssl_cert, "ssl_keyfile": self.ssl_key}
        return {"ssl_cert_reqs": cert_reqs.get(reqs, ssl.CERT_REQUIRED), **{k: v for k, v in files.items() if v}}


class Timings(EnvSettings):
    """Seconds of the recovery machinery, each described where it is used."""

    lease_ttl: float = 60.0
    error_retry_delay: float = 15.0
    followup_sweep: float = 10.0
    reap_interval: float = 30.0
    reap_after: float = 120.0
    reconcile_interval: float = 30.0
    reconcile_after: float = 60.0
    restart_backoff: float = 1.0
    restart_backoff_max: float = 30.0
    priority_aging: float = 600.0
    handoff_delay: float = 2.0


def broker_settings(*, redis_url: str | None = None, queue: str | None = None) -> BrokerSettings:
    return BrokerSettings.load(redis_url=redis_url or None, queue=queue or None)


# Read once, when the first module that needs a knob imports this one.
TIMINGS = Timings.load()
