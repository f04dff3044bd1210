"""Ctrl-C before a command can handle it: noted while the CLI imports, raised once a command runs.

A KeyboardInterrupt raised in the middle of imports would end the process with a traceback
that no command can catch, so `eagle_synth.cli.main` installs `note_interrupt` first.
"""

from __future__ import annotations

import signal
import threading

# A Ctrl-C that came before a command could handle it.
_pending_interrupt = False


def note_interrupt(signum: int, frame: object) -> None:
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
