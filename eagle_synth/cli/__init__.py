"""The `eagle-synth` command, a thin layer over producer/, workers/ and eagle_synth.tools (the
app is in commands.py). Light to import: `main` defers Ctrl-C (interrupts.py) before importing it."""

from __future__ import annotations

import signal

from eagle_synth.cli.interrupts import note_interrupt


def main() -> None:
    signal.signal(signal.SIGINT, note_interrupt)
    from eagle_synth.cli.commands import run

    run()
