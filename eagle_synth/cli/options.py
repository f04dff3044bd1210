"""What the eagle-synth commands share: common options, error and warning lines, the Redis client.
A flag that sets a settings field is declared on the field instead (eagle_synth/cli/flags.py)."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    import redis

# How --help is laid out: click's plain format. Rich's boxed tables cut flag names at 80 columns
# ("--repetition-pena...") and read "[default: 6]" in a help text as markup, dropping it; the plain
# format puts a long flag on a line of its own and wraps the help beside it, at any width.
HELP_MARKUP_MODE = None


def command_group() -> typer.Typer:
    return typer.Typer(rich_markup_mode=HELP_MARKUP_MODE)


RedisOpt = Annotated[
    str | None,
    typer.Option(
        "--redis",
        help="Redis URL (redis://[user:pass@]host:port/db, rediss://, or sentinel://host:port;sentinel://... with "
        "$EAGLE_SYNTH_SENTINEL_MASTER). Default: $REDIS_URL, then redis://127.0.0.1:6379/0.",
    ),
]


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
JsonSummaryOpt = Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object.")]
CampaignArg = Annotated[str, typer.Argument(help="Campaign name.")]

# Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED_EXIT = 130


def print_error(message: str) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)


def fail(message: str, code: int | None = None) -> NoReturn:
    """Stop the command with `error: <message>` and exit status `code` (default: a user error's)."""
    # Imported here: eagle_synth.errors imports redis (CommitUnsure is a redis.ConnectionError),
    # which `eagle-synth --help` must not pay for (tests/test_cli_startup.py).
    from eagle_synth.errors import USER_ERROR_EXIT

    print_error(message)
    raise typer.Exit(USER_ERROR_EXIT if code is None else code)


@contextmanager
def output_errors(out: Path, *, what: str = "--out") -> Iterator[None]:
    """An OSError while a command writes `out` (a folder it may not write, a full disk, a path
    through a file) ends it in one `error:` line naming the path and the OS error, not a traceback."""
    try:
        yield
    except OSError as exc:
        path = exc.filename if exc.filename is not None else out
        reason = exc.strerror or str(exc) or type(exc).__name__
        hint = "; free space there or choose another place" if exc.errno == errno.ENOSPC else ""
        fail(f"cannot write {what} {out}: {path}: {reason}{hint}")


def warn(message: str) -> None:
    typer.secho(f"warning: {message}", err=True, fg=typer.colors.YELLOW)


def check_campaign_name(name: str) -> None:
    from eagle_synth.errors import BadCampaignName
    from eagle_synth.state.campaign import check_campaign_name as check

    try:
        check(name)
    except BadCampaignName as exc:
        fail(f"--campaign: {exc}")  # the library cannot know which flag gave the name


def redis_client(redis_url: str | None) -> redis.Redis:
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.redis_client import connect

    return connect(broker_settings(redis_url=redis_url))
