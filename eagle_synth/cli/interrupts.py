"""Ctrl-C before a command can handle it: noted while the CLI imports (a KeyboardInterrupt in
the middle of imports would end in a traceback no command can catch), raised once a command runs."""

from __future__ import annotations

import signal
import threading

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
