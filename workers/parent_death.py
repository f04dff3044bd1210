"""Ending a supervised process with its supervisor (workers/supervisor.py): the Celery process
must not outlive a SIGKILLed `eagle-synth worker`, or it goes on taking batches unsupervised and
shown as healthy, and a second start on that host doubles the workers on one server.

On Linux the kernel sends the child a signal when its parent dies (prctl PR_SET_PDEATHSIG). The
request takes effect only from the moment it is made, so a parent that died before is caught by
comparing the parent pid with the supervisor's; where prctl is unavailable, a thread watches the
parent pid instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import threading
import time

log = logging.getLogger("eagle_synth.supervisor")

# prctl option (linux/prctl.h): the signal the kernel sends this process when its parent dies.
PR_SET_PDEATHSIG = 1
# Seconds between looks at the parent pid where prctl is unavailable: a dead supervisor's child
# stops taking batches within about this long.
PARENT_WATCH_INTERVAL = 1.0


def _request_death_signal(signum: int) -> bool:
    """Ask the kernel for `signum` when the parent dies; whether that worked."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc, or no prctl (not Linux)
        return False


def _watch_parent(parent_pid: int, signum: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_WATCH_INTERVAL)
    os.kill(os.getpid(), signum)


def end_with_parent(parent_pid: int, signum: int = signal.SIGTERM) -> None:
    """Send this process `signum` when the process `parent_pid` (its parent) ends, also if it
    already has. SIGTERM: Celery's warm shutdown, which puts running batches back and is bounded
    by its own stop deadline (workers/app.py StopDeadlineStep)."""
    if not _request_death_signal(signum):
        log.warning("prctl(PR_SET_PDEATHSIG) unavailable: watching the supervisor's pid instead")
        threading.Thread(target=_watch_parent, args=(parent_pid, signum), daemon=True, name="parent-watch").start()
    if os.getppid() != parent_pid:  # it died before the request took effect
        os.kill(os.getpid(), signum)
