"""The `eagle-synth` command: a thin layer over producer/, workers/ and eagle_synth.tools.

Each command group lives in its own module with its own `typer.Typer()`; the app here merges
them (typer's add_typer without a name) so every command sits at the top level. Shared options
and helpers are in options.py; the command modules import that, never `app` or `main` from here.
"""

from __future__ import annotations

import typer

from eagle_synth.cli import campaign, ops, records, worker

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Regenerate prompt sets through a target model served by SGLang, keeping exact token ids.",
)
for group in (campaign, worker, records, ops):
    app.add_typer(group.app)


def main() -> None:
    import redis
    from kombu.exceptions import OperationalError

    from eagle_synth.redis_policy import EvictingRedisError, is_out_of_memory, out_of_memory_message
    from eagle_synth.settings import SettingsError

    def stop(message: str) -> None:
        typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
        raise SystemExit(2) from None

    try:
        app()
    except (redis.RedisError, OperationalError) as exc:
        # Redis full (noeviction) refuses writes: OutOfMemoryError, or wrapped by kombu on publish.
        if is_out_of_memory(exc):
            stop(out_of_memory_message())
        if isinstance(exc, redis.AuthenticationError):
            stop(f"Redis refused the credentials: {exc}. Check the user and password in "
                 "--redis / REDIS_URL (redis://user:password@host:port/db).")
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OperationalError)):
            stop(f"cannot reach Redis: {exc}. Check --redis / REDIS_URL; for TLS use rediss:// "
                 "and EAGLE_SYNTH_REDIS_CA. Rerunning a command is safe: enqueue resumes where it stopped.")
        raise
    except (SettingsError, EvictingRedisError) as exc:
        stop(str(exc))
