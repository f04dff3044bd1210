"""Run Flower against eagle-synth's broker, with basic auth unless explicitly turned off.

Flower runs in this process through Celery's command line, on a Celery app built from
eagle_synth.settings (the producer's and workers' Redis URL, TLS options and queue). That app
declares our queue as `task_default_queue`, and every campaign's own queue is added to the ones
Flower lists (show_every_campaign_queue), so `/api/queues/length` and the Broker page report each
campaign's backlog even with no worker taking it. Credentials travel in FLOWER_BASIC_AUTH, never on a
command line where `ps` would show them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from celery import Celery

from eagle_synth.errors import FlowerAuthError, FlowerPortInUse
from eagle_synth.ports import bind_error
from eagle_synth.queue import CELERY_URL_OVERRIDES, make_celery
from eagle_synth.settings import BrokerSettings, broker_settings

# Environment variable holding `user:password[,user2:password2]`; Flower reads it natively.
ENV_BASIC_AUTH = "FLOWER_BASIC_AUTH"
# The placeholder .env.example ships; refused so a copied example never goes live.
PLACEHOLDER_PASSWORD = "change-me"
# Seconds after which Flower forgets a worker that went offline: hosts come and go in a campaign.
PURGE_OFFLINE_WORKERS_S = 3600
# Tasks Flower keeps in memory (its default is 100,000); a campaign has far more batches.
MAX_TASKS_IN_MEMORY = 20_000
# Where Celery's command line finds the app (resolved lazily by this module's __getattr__).
APP_SYMBOL = "eagle_synth.tools.flower:celery_app"


def parse_basic_auth(raw: str) -> list[str]:
    """`user:pw[,user2:pw2]` as credentials; empty parts and the placeholder are refused."""
    credentials = [c.strip() for c in raw.split(",") if c.strip()]
    if not credentials:
        raise FlowerAuthError(f"basic auth is empty: give user:password via --basic-auth or ${ENV_BASIC_AUTH}")
    for credential in credentials:
        user, sep, password = credential.partition(":")
        if not sep or not user or not password:
            raise FlowerAuthError(
                f"basic auth entry {user or credential!r} is not user:password "
                f"(several are separated by commas, so a password cannot contain ',')"
            )
        if password == PLACEHOLDER_PASSWORD:
            raise FlowerAuthError(
                f"the password of Flower user {user!r} is still the placeholder {PLACEHOLDER_PASSWORD!r}: "
                f"set {ENV_BASIC_AUTH} to a real secret (e.g. `openssl rand -hex 16`)"
            )
    return credentials


def resolve_auth(*, basic_auth: str | None, no_auth: bool, environ: Mapping[str, str]) -> list[str] | None:
    """Credentials from --basic-auth, else $FLOWER_BASIC_AUTH; None only with no_auth (refused
    together with credentials: a contradiction is not guessed at)."""
    raw = basic_auth if basic_auth is not None else environ.get(ENV_BASIC_AUTH) or None
    if raw is not None and no_auth:
        raise FlowerAuthError(
            f"--no-auth contradicts the credentials given (--basic-auth or ${ENV_BASIC_AUTH}): drop one of them"
        )
    if raw is None:
        if no_auth:
            return None
        raise FlowerAuthError(
            f"Flower needs basic auth: pass --basic-auth user:password or set {ENV_BASIC_AUTH}=user:password; "
            "--no-auth starts it open (its web UI only; its API then answers 401)"
        )
    return parse_basic_auth(raw)


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowerOptions:
    """How to run Flower: `user:password` credentials (None: no auth, chosen explicitly), the
    port and interface of its UI and API (0.0.0.0 serves other hosts, e.g. from a container),
    and further Flower options passed through unchanged (e.g. --url_prefix=flower)."""

    credentials: tuple[str, ...] | None
    port: int
    address: str
    extra_args: tuple[str, ...] = ()

    def celery_argv(self) -> list[str]:
        """Arguments of Celery's command line that start Flower on our app."""
        return [
            "-A",
            APP_SYMBOL,
            "flower",
            f"--port={self.port}",
            f"--address={self.address}",
            f"--purge_offline_workers={PURGE_OFFLINE_WORKERS_S}",
            f"--max_tasks={MAX_TASKS_IN_MEMORY}",
            *self.extra_args,
        ]

    def apply_environment(self, environ: MutableMapping[str, str]) -> None:
        """Make the environment Flower reads hold our credentials and no stale Celery URL."""
        for name in (*CELERY_URL_OVERRIDES, ENV_BASIC_AUTH):
            environ.pop(name, None)
        if self.credentials:
            environ[ENV_BASIC_AUTH] = ",".join(self.credentials)


def check_port_free(*, address: str, port: int) -> None:
    """Raise FlowerPortInUse if (address, port) cannot be bound now, before Flower's own start
    would fail there with a traceback (a port in TIME_WAIT passes)."""
    if refused := bind_error(address, port):
        raise FlowerPortInUse(
            f"--port {port}: cannot listen on {address}:{port} ({refused.strerror}); "
            "another Flower (or another program) holds it: pick another --port"
        ) from refused


def require_auth_on_metrics() -> None:
    """Flower 2.x serves /metrics (task, worker and queue figures) without checking credentials:
    put tornado's `authenticated`, which guards its other views, on it too, leaving only
    /healthcheck open. Idempotent."""
    from flower.views.monitor import Metrics
    from tornado import web

    if not getattr(Metrics.get, "_eagle_synth_authenticated", False):
        guarded = web.authenticated(Metrics.get)
        guarded._eagle_synth_authenticated = True  # type: ignore[attr-defined]
        Metrics.get = guarded


def show_every_campaign_queue(settings: BrokerSettings) -> None:
    """Flower lists the queues its workers consume (or, with none, the app's default): on a
    shared fleet a campaign no worker takes now would vanish from the Broker page and
    /api/queues/length, backlog and all. Add every campaign's queue (eagle_synth/queue.py),
    read from Redis at each request. Idempotent."""
    from flower.views import BaseHandler

    from eagle_synth.queue import campaign_queue
    from eagle_synth.state.campaign import campaign_names
    from eagle_synth.state.redis_client import connect

    if getattr(BaseHandler.get_active_queue_names, "_eagle_synth_campaigns", False):
        return
    workers_queues = BaseHandler.get_active_queue_names
    client = connect(settings)

    def every_queue(handler: BaseHandler) -> list[str]:
        campaigns = {campaign_queue(settings.queue, name) for name in campaign_names(client)}
        return sorted(set(workers_queues(handler)) | campaigns)

    every_queue._eagle_synth_campaigns = True  # type: ignore[attr-defined]
    BaseHandler.get_active_queue_names = every_queue


def run_flower(*, settings: BrokerSettings, options: FlowerOptions) -> int:
    """Run Flower in this process until it is stopped; returns its exit code."""
    from celery.bin.celery import celery as celery_command

    require_auth_on_metrics()
    show_every_campaign_queue(settings)
    os.environ.update(settings.to_env())
    options.apply_environment(os.environ)
    try:
        celery_command.main(options.celery_argv(), "eagle-synth flower", auto_envvar_prefix="CELERY")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def __getattr__(name: str) -> Celery:
    # Celery resolves APP_SYMBOL with getattr; building the app on first use (from the environment
    # run_flower exported, then kept as a module global) keeps imports free of side effects.
    if name == "celery_app":
        app = make_celery(broker_settings())
        globals()["celery_app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def flower_urls(*, address: str, port: int) -> Sequence[str]:
    """Where an operator opens Flower and its queue API (for the start-up message)."""
    host = "127.0.0.1" if address in ("", "0.0.0.0") else address
    base = f"http://{host}:{port}"
    return (f"{base}/broker", f"{base}/api/queues/length")
