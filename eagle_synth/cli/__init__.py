"""The `eagle-synth` command, a thin layer over producer/, workers/ and eagle_synth.tools (the
app is in commands.py). Light to import: `main` defers Ctrl-C (interrupts.py) before importing it."""

from __future__ import annotations

import os
import signal

from eagle_synth.cli.interrupts import note_interrupt

# transformers' notices every command (and its child processes) would print when it loads a
# tokenizer: "PyTorch was not found..." (tokenizers need no torch) and other advice.
QUIET_TRANSFORMERS = {"TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "TRANSFORMERS_VERBOSITY": "error"}


def main() -> None:
    signal.signal(signal.SIGINT, note_interrupt)
    for name, value in QUIET_TRANSFORMERS.items():
        os.environ.setdefault(name, value)
    from eagle_synth.cli.commands import run

    run()
