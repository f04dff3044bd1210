"""`python -m eagle_synth.devserver --tokenizer DIR [--port P] ...`: run a devserver, its
options made from the `Flag`s of DevServerConfig's fields (eagle_synth/cli/flags.py) so the CLI
and the dataclass cannot drift apart."""

from __future__ import annotations

import errno
import logging
import sys
import typing
from collections.abc import Sequence

import typer

from eagle_synth.cli.flags import settings_flags, settings_from
from eagle_synth.devserver.app import run_devserver
from eagle_synth.devserver.config import DevServerConfig
from eagle_synth.errors import USER_ERROR_EXIT, TemplateError
from eagle_synth.ports import bind_error
from eagle_synth.templating import check_tokenizer_path

# Log line format on stderr (stdout carries only the "listening" line).
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
PROG = "python -m eagle_synth.devserver"


@settings_flags(DevServerConfig)
def serve(ctx: typer.Context) -> None:
    """SGLang (or, with --api vllm, vLLM) stand-in for tests, demos and benchmarks (no GPU needed)."""
    try:
        config = settings_from(DevServerConfig, ctx)
        check_tokenizer_path(config.tokenizer)
    except (ValueError, TemplateError) as exc:
        _stop(str(exc))
    port_taken = f"--port {config.port}: address {config.host}:{config.port} is already in use; pick another port "
    port_taken += "(--port 0 takes a free one)"
    if config.port and (refused := bind_error(config.host, config.port)):
        if refused.errno != errno.EADDRINUSE:
            raise refused
        _stop(port_taken)  # before the tokenizer's seconds of loading
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    try:
        run_devserver(config)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        _stop(port_taken)  # taken while the tokenizer loaded


# Plain (not rich) help, as every eagle-synth command has: see eagle_synth/cli/options.py.
cli = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)
cli.command()(serve)


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """The exit status (2 for a flag to fix); `prog`: the command as its usage line names it
    (`eagle-synth devserver` when run through the eagle-synth command)."""
    try:
        typer.main.get_command(cli).main(args=list(argv) if argv is not None else None, prog_name=prog)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0


def _stop(message: str) -> typing.NoReturn:
    """One `error: ...` line on stderr, as every eagle-synth command says it."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise typer.Exit(USER_ERROR_EXIT)


if __name__ == "__main__":
    sys.exit(main())
