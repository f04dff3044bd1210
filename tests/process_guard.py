"""Servers the tests start end with the test run, however it ends.

A server started by a test (a real vLLM server: 2 GB and an engine process each) runs in a
process group of its own, so a Ctrl-C at the terminal does not reach it and a fixture's
teardown is what stops it. A run that ends without teardown (pytest SIGTERMed by a timeout,
SIGHUPed with its terminal, SIGKILLed) would leave it running for hours. So a `GuardedProcess`:

* has the kernel send it SIGKILL when the test process dies (PR_SET_PDEATHSIG, set in the child
  before it execs);
* is killed, its whole group with it, by a handler of SIGTERM, SIGINT and SIGHUP in the test
  process (then the handler that was there runs) and at the interpreter's exit;
* has a guard: a small process in a session of its own that the kernel signals when the test
  process dies (PR_SET_PDEATHSIG again) and that then kills the server's whole group, engine
  processes included (the kernel's parent-death signal reaches only the server itself).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from eagle_synth.testing.harness import STOP_TIMEOUT, ManagedProcess

# prctl(2) option: the signal a process gets when the thread that started it ends.
PR_SET_PDEATHSIG = 1
# Signals that end a test run without its fixtures' teardown; their handlers kill the servers first.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Seconds the guard waits for its own end after the server's group is killed (it only exits).
GUARD_STOP_TIMEOUT = 5.0

# The guard: argv[1] the server's process group, argv[2] the test process. SIGTERM (the
# parent-death signal it is given) or a test process already gone kills the group, then it exits.
# It says "armed" once its handler is in: a SIGTERM before that would end it without killing.
_GUARD = """
import os, signal, sys
group, parent = int(sys.argv[1]), int(sys.argv[2])

def end(*_):
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os._exit(0)

signal.signal(signal.SIGTERM, end)
print("armed", flush=True)
if os.getppid() != parent:
    end()
while True:
    signal.pause()
"""


def parent_death_signal(sig: int) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when the process that starts it dies (Linux; elsewhere
    nothing is set and only the signal handlers and atexit below apply)."""
    parent = os.getpid()

    def arm() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), sig)

    return arm


class _Registry:
    """The live guarded processes of this test process; installs the signal handlers once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: dict[int, GuardedProcess] = {}  # by id(): dataclasses are unhashable
        self._installed = False

    def add(self, process: GuardedProcess) -> None:
        with self._lock:
            self._processes[id(process)] = process
            if not self._installed and threading.current_thread() is threading.main_thread():
                for sig in ENDING_SIGNALS:
                    signal.signal(sig, _ending_handler(signal.getsignal(sig)))
                atexit.register(self.kill_all)
                self._installed = True

    def discard(self, process: GuardedProcess) -> None:
        with self._lock:
            self._processes.pop(id(process), None)

    def kill_all(self) -> None:
        """SIGKILL every registered process group (the run is ending: no time for a warm stop)."""
        with self._lock:
            processes = list(self._processes.values())
        for process in processes:
            process.kill_group()


_registry = _Registry()


def _ending_handler(previous: object) -> Callable[[int, FrameType | None], None]:
    """Kill the servers, then do what `previous` (the handler replaced) would have done."""

    def handle(signum: int, frame: FrameType | None) -> None:
        _registry.kill_all()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default: end as the signal would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    return handle


@dataclass(eq=False)
class GuardedProcess(ManagedProcess):
    """A ManagedProcess whose process group ends with the test process, however that ends (see
    the module doc); `stop` and `kill` also end its guard."""

    guard: subprocess.Popen | None = None

    def start(self) -> GuardedProcess:
        self.preexec_fn = parent_death_signal(signal.SIGKILL)
        super().start()
        assert self.proc is not None
        _registry.add(self)
        self.guard = subprocess.Popen(
            [sys.executable, "-c", _GUARD, str(self.proc.pid), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=parent_death_signal(signal.SIGTERM),
        )
        assert self.guard.stdout is not None
        self.guard.stdout.readline()  # armed (or its end, if it could not start)
        return self

    def kill_group(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, *, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> None:
        try:
            super().stop(sig=sig, timeout=timeout)
        finally:
            self.release()

    def release(self) -> None:
        """The server has ended: end its guard (SIGKILL: its SIGTERM would kill the group) and forget it."""
        _registry.discard(self)
        if self.guard is not None and self.guard.poll() is None:
            self.guard.kill()
            self.guard.wait(timeout=GUARD_STOP_TIMEOUT)
