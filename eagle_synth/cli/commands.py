"""The `eagle-synth` app: each command group module's commands merged at the top level, each
module imported only when one of its commands runs (or shows its own --help).

Library code raises eagle_synth.errors.UserError for what the user can fix, and the app prints
it once (_Commands); commands call options.fail only for what the library cannot name (a flag).
"""

from __future__ import annotations

import importlib
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from eagle_synth.cli.interrupts import arm_interrupts
from eagle_synth.cli.options import HELP_MARKUP_MODE, INTERRUPTED_EXIT, fail, print_error

# Every command: its module under eagle_synth.cli and the first line of its docstring, which
# `eagle-synth --help` lists without importing the modules (they pull in pydantic, Redis,
# Celery and requests: a second or more on a busy machine). In the order --help lists them;
# tests/test_cli_startup.py checks this table against the commands themselves.
COMMANDS: dict[str, tuple[str, str]] = {
    "enqueue": ("campaign", "Template prompt rows with the model's chat template and enqueue their token ids."),
    "status": (
        "campaign",
        "Where a campaign stands: enqueued, queued, in flight, stranded, done, failed, throughput, workers; "
        "its model, priority and the workers taking it. Several campaigns: a table, a line each.",
    ),
    "campaigns": ("campaign", "List campaigns with their progress."),
    "failed": ("campaign", "List a campaign's failed prompts by reason."),
    "retry-failed": ("campaign", "Enqueue a campaign's failed prompts again."),
    "close": (
        "campaign",
        "End a complete campaign: fold its Redis state (keys, failures, counts) into OUT/NAME and free Redis.",
    ),
    "reopen": (
        "campaign",
        "Read a closed campaign's state back into Redis (enqueue and retry-failed do this themselves).",
    ),
    "priority": ("campaign", "Change a campaign's priority: its queued batches move at once, later ones follow it."),
    "cancel": (
        "campaign",
        "Cancel a campaign: its queued and stranded batches leave the queue, batches in flight stop at their "
        "next prompt, its Redis state is freed; records already written stay readable.",
    ),
    "worker": (
        "worker",
        "Run a Celery worker that generates queued batches on SGLang or vLLM servers and writes records.",
    ),
    "export": (
        "records",
        "Export records as training rows: input_ids, loss_mask (0 prompt, 1 output) and provenance, for each trainer.",
    ),
    "vocab": ("records", "Count loss-masked tokens and write the EAGLE-3 draft vocabulary mapping (d2t, t2d)."),
    "verify": (
        "records",
        "Check records: repeated keys, ids outside the vocabulary, counts, EOS, empty outputs, reasoning structure.",
    ),
    "inspect": ("records", "Show a record decoded, special tokens highlighted, the prompt/output boundary marked."),
    "compact": (
        "records",
        "Merge small batch files into large shards; safe while workers write and if stopped midway.",
    ),
    "repair": ("records", "Move damaged record files to DIR/damaged/ and put the prompts they held back on the queue."),
    "flower": (
        "ops",
        "Run Flower on the campaign broker, with basic auth. Unknown options go to Flower (e.g. --url_prefix=flower).",
    ),
    "exporter": (
        "ops",
        "Serve every campaign's figures (enqueued, queued, in flight, stranded, done, failed, ETA...) as "
        "Prometheus metrics, read from Redis at each scrape.",
    ),
    "demo": ("ops", "Run a whole campaign locally on embedded defaults: Redis, devserver, worker, prompts."),
    "devserver": (
        "ops",
        "Run the SGLang stand-in (--api vllm: the vLLM one; no GPU) for tests, the demo and benchmarks. "
        "`eagle-synth devserver --help` lists its flags.",
    ),
}


def module_commands(module_name: str) -> dict[str, Any]:
    """The click commands of one command module (eagle_synth.cli.<module_name>), by name."""
    module = importlib.import_module(f"eagle_synth.cli.{module_name}")
    # As a group even for a module of one command (get_command would build that command alone,
    # with shell-completion options the app does not offer).
    return dict(typer.main.get_group(module.app).commands)


class _Commands(TyperGroup):
    """The top-level group: commands come from their modules when first asked for (COMMANDS),
    and a command's UserError ends here as one `error:` line and its exit code, here rather than
    in main() so typer's CliRunner sees the same."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    # ctx is typer's click Context; Any because recent typer vendors its own click (typer._click).
    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            for name, command in module_commands(COMMANDS[cmd_name][0]).items():
                self.commands.setdefault(name, command)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """As click lists commands (name, help cut to the width), from COMMANDS: no module imported."""
        from typer._click.utils import make_default_short_help

        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = [(name, make_default_short_help(line, limit)) for name, (_, line) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: Any) -> Any:
        # Imported once a command runs: eagle_synth.errors imports redis, which --help must not load.
        from eagle_synth.errors import UserError

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


@app.callback()
def _top_level() -> None:
    """The app's own options (none but --help): makes it a group whose commands load lazily."""


def run() -> None:
    """The app, with Redis failures (exit 2) and a stray Ctrl-C (exit 130) said in one line."""

    def stop(message: str, code: int | None = None) -> NoReturn:
        from eagle_synth.errors import USER_ERROR_EXIT

        print_error(message)
        raise SystemExit(USER_ERROR_EXIT if code is None else code) from None

    try:
        app()
    except KeyboardInterrupt:
        stop("interrupted", INTERRUPTED_EXIT)
    except Exception as exc:
        # Imported only now: `--help` and a mistyped flag never pay for Redis and kombu.
        import redis
        from kombu.exceptions import OperationalError

        from eagle_synth.errors import clause
        from eagle_synth.settings import broker_settings
        from eagle_synth.state.redis_client import connect
        from eagle_synth.state.redis_policy import is_out_of_memory, out_of_memory_message
        from eagle_synth.state.redis_role import is_read_only, read_only_message

        if not isinstance(exc, (redis.RedisError, OperationalError)):
            raise
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
