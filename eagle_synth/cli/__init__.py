"""The `eagle-synth` command, a thin layer over producer/, workers/ and eagle_synth.tools (the
app is in commands.py). Light to import: `main` defers Ctrl-C (interrupts.py) before importing it."""

from __future__ import annotations

import signal
from typing import Any

from eagle_synth.cli.interrupts import note_interrupt


def main() -> None:
    signal.signal(signal.SIGINT, note_interrupt)
    from eagle_synth.cli.commands import run

    run()


def __getattr__(name: str) -> Any:
    """`eagle_synth.cli.app`, the typer app (for tests and `typer.main.get_command`)."""
    if name == "app":
        from eagle_synth.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
