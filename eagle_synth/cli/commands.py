"""The `eagle-synth` app: each command group module's commands merged at the top level.

Library code raises eagle_synth.errors.UserError for what the user can fix, and the app prints
it once (_Commands); commands call options.fail only for what the library cannot name (a flag).
"""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from eagle_synth.cli import campaign, ops, records, worker
from eagle_synth.cli.interrupts import arm_interrupts
from eagle_synth.cli.options import HELP_MARKUP_MODE, INTERRUPTED_EXIT, fail, print_error
from eagle_synth.errors import USER_ERROR_EXIT, UserError, clause


class _Commands(TyperGroup):
    """The top-level group: a command's UserError ends here as one `error:` line and its exit
    code, here rather than in main() so typer's CliRunner sees the same."""

    # ctx is typer's click Context; Any because recent typer vendors its own click (typer._click).
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            fail(str(exc), code=exc.exit_code)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, command, rest = super().resolve_command(ctx, args)
        if name != "enqueue":  # enqueue arms Ctrl-C itself, to say what a stopped run kept and how to resume
            arm_interrupts()
        return name, command, rest


app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    rich_markup_mode=HELP_MARKUP_MODE,
    no_args_is_help=True,
    help="Regenerate prompt sets through a target model served by SGLang or vLLM, keeping exact token ids.",
)
for group in (campaign, worker, records, ops):
    app.add_typer(group.app)


def run() -> None:
    """The app, with Redis failures (exit 2) and a stray Ctrl-C (exit 130) said in one line."""
    import redis
    from kombu.exceptions import OperationalError

    from eagle_synth.settings import broker_settings
    from eagle_synth.state.redis_client import connect
    from eagle_synth.state.redis_policy import is_out_of_memory, out_of_memory_message
    from eagle_synth.state.redis_role import is_read_only, read_only_message

    def stop(message: str, code: int = USER_ERROR_EXIT) -> NoReturn:
        print_error(message)
        raise SystemExit(code) from None

    try:
        app()
    except KeyboardInterrupt:
        stop("interrupted", INTERRUPTED_EXIT)
    except (redis.RedisError, OperationalError) as exc:
        # Redis full (noeviction) refuses writes: OutOfMemoryError, or wrapped by kombu on publish.
        if is_out_of_memory(exc):
            stop(out_of_memory_message())
        if is_read_only(exc):  # a replica, or a master demoted mid-command: REDIS_URL names it
            stop(read_only_message(connect(broker_settings())))
        if isinstance(exc, redis.AuthenticationError):
            stop(
                f"Redis refused the credentials: {clause(exc)}. Check the user and password in "
                "--redis / REDIS_URL (redis://user:password@host:port/db)."
            )
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OperationalError)):
            stop(
                f"cannot reach Redis: {clause(exc)}. Check --redis / REDIS_URL; for TLS use rediss:// "
                "and EAGLE_SYNTH_REDIS_CA. Rerunning a command is safe: enqueue resumes where it stopped."
            )
        raise
