"""The docs' flag tables say what `--help` says, and `--help` is readable at 80 columns.

Each command with a flag table names it with a marker line just above the table:
`<!-- flags of `eagle-synth CMD` ... -->` (several tables of one command may carry it). The
reference for each command is that table: worker (docs/workers.md), enqueue (docs/producer.md),
export (docs/records.md), flower and exporter (docs/operations.md), devserver (docs/devserver.md). A flag
added to a command without a row, or a row left for a flag gone, fails here.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
import typer

from eagle_synth.cli.commands import app
from tests.helpers import cli

DOCS = Path(__file__).resolve().parent.parent / "docs"
MARKER = re.compile(r"<!-- flags of `eagle-synth ([a-z-]+)`")
FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
# Each documented command and the doc that holds its table.
REFERENCES = {
    "worker": "workers.md",
    "enqueue": "producer.md",
    "export": "records.md",
    "flower": "operations.md",
    "exporter": "operations.md",
    "devserver": "devserver.md",
}
# Commands whose --help is checked at 80 columns: every one (devserver's is argparse's own).
COMMANDS = sorted(typer.main.get_command(app).list_commands(None))  # type: ignore[attr-defined, arg-type]


def documented_flags(doc: Path, command: str) -> set[str]:
    """Every --flag in the first cell of the rows of the tables marked for `command`."""
    flags: set[str] = set()
    lines = doc.read_text().splitlines()
    for index, line in enumerate(lines):
        match = MARKER.search(line)
        if not match or match[1] != command:
            continue
        table = []
        for row in lines[index + 1 :]:
            if not row.startswith("|"):
                break
            table.append(row)
        assert len(table) > 2, f"{doc.name}: no table below the marker of {command}"
        for row in table[2:]:  # after the header and its rule
            first_cell = row.split(" | ")[0]
            flags.update(FLAG.findall(first_cell))
    return flags


def cli_command(command: str):
    """The click command of `eagle-synth COMMAND` (the app loads each command's module on demand)."""
    return typer.main.get_command(app).get_command(None, command)  # type: ignore[attr-defined, arg-type]


def help_flags(command: str) -> set[str]:
    """The option names `eagle-synth COMMAND --help` lists (no --help; no --no-X of a switch)."""
    if command == "devserver":
        from eagle_synth.devserver.__main__ import cli as devserver_cli

        click_command = typer.main.get_command(devserver_cli)
    else:
        click_command = cli_command(command)
    return {o for param in click_command.params for o in getattr(param, "opts", ()) if o.startswith("--")} - {"--help"}


def negative_flags(command: str) -> set[str]:
    """The --no-X halves of a command's switches (a table may name them beside --X)."""
    if command == "devserver":
        return set()
    click_command = cli_command(command)
    return {o for param in click_command.params for o in getattr(param, "secondary_opts", ())}


@pytest.mark.parametrize("command", sorted(REFERENCES))
def test_doc_tables_list_exactly_the_flags_of_help(command: str) -> None:
    documented = documented_flags(DOCS / REFERENCES[command], command)
    listed = help_flags(command)
    assert listed - documented == set(), f"flags of `{command}` missing from docs/{REFERENCES[command]}"
    assert documented - listed - negative_flags(command) == set(), (
        f"docs/{REFERENCES[command]} lists flags `{command}` does not take"
    )


def _assert_whole(command: str, shown: str) -> None:
    assert "…" not in shown, (command, shown)
    assert max(len(line) for line in shown.splitlines()) <= 80, (command, shown)
    for flag in help_flags(command):
        assert re.search(rf"(^|[\s,/]){re.escape(flag)}([\s,=/]|$)", shown, re.M), (command, flag, shown)


def test_help_is_whole_at_80_columns() -> None:
    """No flag name cut short ("--repetition-pena..."), no line wider than the terminal, and the
    worker's defaults shown. The two longest, enqueue and worker, as a user runs them (a process
    on an 80-column terminal); every other command in this process, with the same width."""
    from typer.testing import CliRunner

    for command in ("enqueue", "worker"):
        _assert_whole(command, cli(command, "--help", env={"COLUMNS": "80", "TERM": "xterm"}).stdout.decode())
    for command in COMMANDS:
        if command == "devserver":
            continue  # argparse's help, not typer's (its own test below)
        result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80", "TERM": "xterm"})
        assert result.exit_code == 0, result.output
        _assert_whole(command, result.output)
    worker = cli("worker", "--help", env={"COLUMNS": "80"}).stdout.decode()
    flat = " ".join(worker.split())
    for flag, default in (
        ("--max-attempts", "6"),
        ("--timeout-base", "120.0"),
        ("--timeout-per-token", "0.1"),
        ("--backoff-max", "30.0"),
        ("--probe-timeout", "25.0"),
        ("--render-processes", "2"),
    ):
        after = flat[flat.index(flag + " ") :]
        next_flag = re.search(r" --[a-z]", after[len(flag) :])
        entry = after[: len(flag) + (next_flag.start() if next_flag else len(after))]
        assert f"[default: {default}]" in entry, (flag, entry)


def test_devserver_help_names_every_flag_at_80_columns() -> None:
    shown = cli("devserver", "--help", env={"COLUMNS": "80"}).stdout.decode()
    for flag in help_flags("devserver"):
        assert flag in shown, flag


def test_task_event_cost_is_the_measured_one_in_help_and_docs() -> None:
    """The figure both say is BENCHMARKS.md's: worker CPU per record with task events on and off."""
    bench = (DOCS.parent / "BENCHMARKS.md").read_text()
    on = Decimal(re.search(r"\| worker CPU per record \| ([\d.]+) CPU ms/record", bench)[1])
    off = Decimal(re.search(r"\| worker CPU per record, --no-task-events \| ([\d.]+) CPU ms/record", bench)[1])
    said = f"about {(on - off).quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)} ms of CPU per record"
    worker = " ".join(cli("worker", "--help", env={"COLUMNS": "200"}).stdout.decode().split())
    assert said in worker
    assert said in (DOCS / "workers.md").read_text()


def test_export_json_keys_are_documented() -> None:
    from eagle_synth.tools.export import ExportResult

    keys = ExportResult(format="jsonl").to_dict()
    text = " ".join((DOCS / "records.md").read_text().split())
    sentence = text[text.index("The summary (`--json`) gives") :][:600]
    for key in keys:
        assert f"`{key}`" in sentence, key
