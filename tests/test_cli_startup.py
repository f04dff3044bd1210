"""`eagle-synth --help` answers without importing any command's module (pydantic settings,
Redis, Celery, requests, transformers: seconds on a busy machine); the table it lists the
commands from says what the commands themselves say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer

from eagle_synth.cli.commands import COMMANDS, app, module_commands

# Modules a bare `--help` must not import (each costs tenths of a second to seconds).
HEAVY = (
    "pydantic_settings",
    "redis",
    "kombu",
    "celery",
    "requests",
    "transformers",
    "torch",
    "eagle_synth.cli.campaign",
)

_HELP_AND_MODULES = """
import json, sys
from eagle_synth.cli import main
sys.argv = ["eagle-synth", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


@pytest.mark.integration
def test_help_imports_no_command_module():
    result = subprocess.run(
        [sys.executable, "-c", _HELP_AND_MODULES, "--help"], capture_output=True, text=True, timeout=60
    )
    loaded = set(json.loads(result.stderr.strip().splitlines()[-1]))
    assert not {name for name in HEAVY if name in loaded}, sorted(name for name in HEAVY if name in loaded)
    for name in COMMANDS:
        assert f"  {name} " in result.stdout, name


def test_the_command_table_matches_the_commands():
    found = {}
    for module in sorted({module for module, _ in COMMANDS.values()}):
        for name, command in module_commands(module).items():
            found[name] = (module, (command.help or "").strip().split("\n\n")[0].replace("\n", " "))
    assert {name: module for name, (module, _) in found.items()} == {n: m for n, (m, _) in COMMANDS.items()}
    for name, (_, line) in COMMANDS.items():
        assert found[name][1] == line, name


def test_the_listing_is_what_click_would_print():
    """The lazy listing against click's own, built with every command loaded."""
    group = typer.main.get_command(app)
    ctx = group.make_context("eagle-synth", [], resilient_parsing=True)
    lazy = group.get_help(ctx)
    for name in COMMANDS:
        group.get_command(ctx, name)  # loads every module
    formatter = ctx.make_formatter()
    super(type(group), group).format_commands(ctx, formatter)
    assert formatter.getvalue().strip() in lazy


@pytest.mark.integration
def test_devserver_help_names_the_command_it_was_run_as():
    """`eagle-synth devserver --help` reads `eagle-synth devserver`; the module run alone keeps its own name."""
    through_cli = subprocess.run(
        [sys.executable, "-m", "eagle_synth", "devserver", "--help"], capture_output=True, text=True, timeout=60
    )
    assert through_cli.stdout.startswith("Usage: eagle-synth devserver [OPTIONS]"), through_cli.stdout[:200]
    alone = subprocess.run(
        [sys.executable, "-m", "eagle_synth.devserver", "--help"], capture_output=True, text=True, timeout=60
    )
    assert alone.stdout.startswith("Usage: python -m eagle_synth.devserver [OPTIONS]"), alone.stdout[:200]
