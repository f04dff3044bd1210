"""The `eagle-synth` command: a thin layer over producer/, workers/ and eagle_synth.tools (the
app is in commands.py).

This module stays light to import: `main` first makes Ctrl-C wait for a command to handle it,
then imports the commands. A KeyboardInterrupt raised in the middle of those imports would end
the process with a traceback that no command can catch.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

# A Ctrl-C that came before a command could handle it.
_pending_interrupt = False


def _note_interrupt(signum: int, frame: object) -> None:
    global _pending_interrupt
    _pending_interrupt = True


def arm_interrupts() -> None:
    """Ctrl-C raises KeyboardInterrupt again from here on; at once if one came while it waited."""
    global _pending_interrupt
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _pending_interrupt:
        _pending_interrupt = False
        raise KeyboardInterrupt


def main() -> None:
    """The `eagle-synth` entry point."""
    signal.signal(signal.SIGINT, _note_interrupt)
    from eagle_synth.cli.commands import run

    run()


def __getattr__(name: str) -> Any:
    """`eagle_synth.cli.app`, the typer app (for tests and `typer.main.get_command`)."""
    if name == "app":
        from eagle_synth.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
