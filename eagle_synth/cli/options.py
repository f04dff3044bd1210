"""What the eagle-synth commands share: the --redis option, error and warning lines, the Redis client."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from eagle_synth.settings import broker_settings

RedisOpt = Annotated[
    Optional[str],
    typer.Option("--redis", help="Redis URL (redis://[user:pass@]host:port/db or rediss://). Default: $REDIS_URL, then redis://127.0.0.1:6379/0."),
]


def fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def warn(message: str) -> None:
    typer.secho(f"warning: {message}", err=True, fg=typer.colors.YELLOW)


def check_campaign_name(name: str) -> None:
    from eagle_synth.campaign import Campaign

    try:
        Campaign(None, name)  # the name check only: no Redis call is made
    except ValueError as exc:
        fail(f"--campaign: {exc}")


def redis_client(redis_url: str | None):
    from eagle_synth.redis_client import connect

    return connect(broker_settings(redis_url=redis_url))

