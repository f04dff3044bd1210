"""`eagle-synth worker`: a Celery worker that generates queued batches on SGLang servers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from eagle_synth.cli.flags import flag_names, settings_flags, settings_from
from eagle_synth.cli.options import (
    RedisOpt,
    check_campaign_name,
    command_group,
    fail,
    redis_client,
    warn,
)
from eagle_synth.errors import ConfigError
from eagle_synth.settings import broker_settings
from workers.config import WorkerConfig, default_concurrency

app = command_group()
# The help of the flags whose declaration would not fit a line.
HELP = {
    "concurrency": "Batches held open at once (batch threads). Default: 8 x inflight x servers / 16.",
    "task_events": "Send Celery task events (Flower's task views need them; they cost about 0.07 ms of CPU per record, BENCHMARKS.md).",
}
# The WorkerConfig settings whose flag a settings error names instead (max_attempts: --max-attempts).
SETTINGS_SAID_AS_FLAGS = frozenset(
    {
        "inflight",
        "allow_server_parsers",
        "allow_server_settings",
        "max_attempts",
        "timeout_base",
        "timeout_per_token",
        "backoff_max",
        "probe_timeout",
        "metrics_port",
        "metrics_address",
    }
)
# The parameters in --help order: WorkerConfig's flags with the command's own among them.
FLAG_ORDER = (
    "ctx",
    "servers",
    "out",
    "backend",
    "inflight",
    "concurrency",
    "allow_server_parsers",
    "allow_server_settings",
    "campaigns",
    "max_attempts",
    "timeout_base",
    "timeout_per_token",
    "backoff_max",
    "probe_timeout",
    "render_processes",
    "metrics_port",
    "metrics_address",
    "tokenizer",
    "name",
    "task_events",
    "loglevel",
    "allow_evicting_redis",
    "allow_volatile_redis",
    "redis",
)


# Paths of the servers' own endpoints: a --server URL ending in one names an endpoint, not the
# server (the worker adds /generate, /v1/completions, /health, ... itself).
ENDPOINT_PATHS = [
    "/generate",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1",
    "/health",
    "/health_generate",
    "/get_model_info",
    "/get_server_info",
]


def _check_server_url(url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        fail(f"--server {url!r}: not an http:// or https:// URL; e.g. --server http://{url.split('://')[-1]}")
    path = parts.path.rstrip("/")
    for endpoint in ENDPOINT_PATHS:
        if path.endswith(endpoint):
            base = url[: url.index(parts.netloc) + len(parts.netloc)] + path[: -len(endpoint)]
            fail(
                f"--server {url!r}: give the server's address without the {endpoint} path "
                f"(the worker adds it): --server {base}"
            )


@app.command()
@settings_flags(WorkerConfig, order=FLAG_ORDER)
def worker(
    ctx: typer.Context,
    concurrency: Annotated[int | None, typer.Option(help=HELP["concurrency"])] = None,
    name: Annotated[str | None, typer.Option(help="Celery node name (default eagle-synth-<random>@<host>).")] = None,
    task_events: Annotated[bool, typer.Option(help=HELP["task_events"])] = True,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    redis: RedisOpt = None,
) -> None:
    """Run a Celery worker that generates queued batches on SGLang or vLLM servers and writes records.

    Servers started with --api-key need it in EAGLE_SYNTH_SERVER_API_KEY (no flag: a flag shows in ps).
    """
    from eagle_synth.state.redis_policy import check_redis_ready
    from eagle_synth.state.redis_role import refuse_replica

    # Checked as given, before anything else (the settings strip a trailing /).
    servers: list[str] = ctx.params["servers"]
    campaigns: list[str] = ctx.params["campaigns"] or []
    for url in servers:
        _check_server_url(url)
    for pinned in campaigns:
        check_campaign_name(pinned)
    # Every other flag sets the WorkerConfig field of its name (workers/config.py declares them):
    # flags given, else the environment (EAGLE_SYNTH_*), else the defaults.
    try:
        config = settings_from(WorkerConfig, ctx)
    except ConfigError as exc:
        # The library names settings (max_attempts); say the flags (--max-attempts).
        said = {
            setting: flag for setting, flag in flag_names(WorkerConfig).items() if setting in SETTINGS_SAID_AS_FLAGS
        }
        fail(re.sub(r"\b(" + "|".join(said) + r")\b", lambda m: said[m[1]], str(exc)))
    settings = broker_settings(redis_url=redis)
    # Celery would retry a wrong password or an unreachable Redis forever: check once, say why.
    client = redis_client(redis)
    refuse_replica(client)
    check_redis_ready(
        client, warn=warn, allow_evicting=config.allow_evicting_redis, allow_volatile=config.allow_volatile_redis
    )
    from eagle_synth.ports import bind_error
    from workers.disk import probe_folder
    from workers.servers.preflight import preflight_at_start

    if problem := probe_folder(config.out):
        fail(f"--out cannot take records: {problem}")
    # The worker's Celery process binds it, restarted or not: a port taken now is said once, here.
    if config.metrics_port is not None and (taken := bind_error(config.metrics_address, config.metrics_port)):
        fail(
            f"--metrics-port {config.metrics_port}: cannot listen on {config.metrics_address}: {taken.strerror or taken}"
        )
    for folder in config.tokenizer:
        if not Path(folder).expanduser().is_dir():
            fail(f"--tokenizer {folder}: no such folder; give the model folder its server loads")
    # Preflight the servers that already answer; the others are checked when they come up.
    found = preflight_at_start(
        config.servers,
        forced=config.backend_for,
        allow_server_parsers=config.allow_server_parsers,
        allowed_settings=config.allow_server_settings,
        api_key=config.api_key,
    )
    for line in found.accepted:
        typer.echo(line)
    for url, why in found.not_answering:
        typer.echo(f"server {url} not answering yet ({why}); the worker will wait for it")
    if found.all_refused:
        fail("\n".join(found.refused))
    for message in found.refused:
        typer.secho(message, err=True, fg=typer.colors.YELLOW)
    # Batch threads are sized once, at start: from --inflight, else from the servers answering now.
    sizing = config.inflight or found.inflight()
    from workers.supervisor import supervise_worker

    # The Celery worker runs in a child process that is started again if it crashes; the
    # resolved settings reach it through its environment.
    code = supervise_worker(
        env={**settings.to_env(), **config.to_env()},
        concurrency=concurrency or default_concurrency(inflight=sizing, servers=len(config.servers)),
        loglevel=loglevel,
        name=name,
        task_events=task_events,
    )
    raise typer.Exit(code)
