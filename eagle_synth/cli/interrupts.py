"""Ctrl-C before a command can handle it: noted while the CLI imports (a KeyboardInterrupt in
the middle of imports would end in a traceback no command can catch), raised once a command runs."""

from __future__ import annotations

import signal
import threading

_pending_interrupt = False


def note_interrupt(signum: int, frame: object) -> None:
    global _pending_interrupt
    _pending_interrupt = True


def _interrupt(signum: int, frame: object) -> None:
    """Raise KeyboardInterrupt, and remember the Ctrl-C: one that lands in a __del__ (a regex
    object collected mid-run) is only reported by Python, and raise_if_interrupted acts on it."""
    global _pending_interrupt
    _pending_interrupt = True
    raise KeyboardInterrupt


def arm_interrupts() -> None:
    """Ctrl-C raises KeyboardInterrupt again from here on; at once if one came while it waited."""
    global _pending_interrupt
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupt)
    raise_if_interrupted()


def raise_if_interrupted() -> None:
    """KeyboardInterrupt now if a Ctrl-C came and was not acted on (see _interrupt); long
    commands call this at each step (enqueue: at each chunk of rows)."""
    global _pending_interrupt
    if _pending_interrupt:
        _pending_interrupt = False
        raise KeyboardInterrupt
