"""Keeps `eagle-synth worker`'s Celery process running: a crashed one comes back by itself.

The command's own process only supervises: it runs the Celery worker (workers/app.py
run_worker) as a child process and starts it again, after a backoff, whenever it ends by any
cause but a deliberate stop. Causes seen: kombu's Redis transport ending the worker with
"Unrecoverable error" after a broker restart (AttributeError on a `None` connection while
restoring unacked messages, long-standing upstream: celery/kombu #582, #970), an out-of-memory
kill, a bug. A restarted worker takes its batches' leases back at once (their holder, the old
child, is a dead process of this boot and pid namespace) or finds them restored by the reaper.

Endings: a SIGTERM or SIGINT to the supervisor is forwarded to the child, and the supervisor
exits 0 once the child has ended. The child's exit code 2 (every server refused, by preflight
or by a batch; or REDIS_URL a read-only replica: restarting cannot help) ends the supervisor
with 2. Any other end of the child, while the supervisor was not asked to stop, is a crash, exit code 0 included: Celery exits 0 on
paths that set no code (its cold shutdown, "Too many open files"), as it does for a SIGTERM sent
to the child alone. Apart from exit 2, a worker stops only when its supervisor is told to.
SIGQUIT (Celery's cold shutdown) is forwarded and stops the supervisor likewise.

The signals Celery acts on without stopping are passed on to the child: SIGUSR1 (dump the
threads' stacks), and SIGUSR2 when Celery's remote debugger is on (CELERY_RDBSIG set; else it is
ignored: its default would end the child). SIGTTIN/SIGTTOU, whose default would stop (suspend)
the supervisor, are ignored. None is left to a default action that would end the supervisor and
orphan the child. SIGHUP keeps its default (a closed terminal ends the worker): the child then
ends with the supervisor, as it does however the supervisor ends, SIGKILL included
(workers/parent_death.py: a SIGTERM, Celery's warm shutdown).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from types import FrameType

from eagle_synth.errors import USER_ERROR_EXIT
from eagle_synth.settings import TIMINGS

log = logging.getLogger("eagle_synth.supervisor")

# First wait before restarting a crashed worker, seconds; it doubles per crash up to the max.
RESTART_BACKOFF_START = TIMINGS.restart_backoff
RESTART_BACKOFF_MAX = TIMINGS.restart_backoff_max
# A worker that ran this long before crashing was healthy: the next restart waits the least again.
STABLE_AFTER = 60.0
# Environment variable telling the child it runs under a supervisor: the supervisor's pid, which
# the child ends with.
ENV_CHILD = "EAGLE_SYNTH_SUPERVISED"
# Signals that stop the worker: forwarded to the child, then the supervisor exits once it ended.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
# Environment variable turning Celery's remote debugger on (on SIGUSR2).
ENV_CELERY_DEBUGGER = "CELERY_RDBSIG"


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """A signal's handler that does nothing."""


class Supervisor:
    """Run `argv` (with environment `env`) as a child and restart it with backoff until it exits
    2 (refused) or we are stopped."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env
        self.child: subprocess.Popen | None = None
        self.stopping = False
        self.restarts = 0

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        self._pass_on(signum, frame)

    def _pass_on(self, signum: int, _frame: FrameType | None) -> None:
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signum)

    def run(self) -> int:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._stop)
        signal.signal(signal.SIGUSR1, self._pass_on)
        # A handler that does nothing, not SIG_IGN: an ignored signal stays ignored in the child.
        signal.signal(signal.SIGUSR2, self._pass_on if self.env.get(ENV_CELERY_DEBUGGER) else _ignore)
        for signum in (signal.SIGTTIN, signal.SIGTTOU):
            signal.signal(signum, _ignore)
        backoff = RESTART_BACKOFF_START
        while True:
            started = time.monotonic()
            self.child = subprocess.Popen(self.argv, env={**self.env, ENV_CHILD: str(os.getpid())})
            code = self.child.wait()  # PEP 475: a signal handler does not interrupt it
            if code == USER_ERROR_EXIT:
                return code
            if self.stopping:
                return 0
            if time.monotonic() - started > STABLE_AFTER:
                backoff = RESTART_BACKOFF_START
            self.restarts += 1
            log.error(
                "the worker process exited with %s; starting it again in %.1f s (restart %d)",
                f"signal {-code}" if code < 0 else f"code {code}",
                backoff,
                self.restarts,
            )
            deadline = time.monotonic() + backoff
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            if self.stopping:
                return 0
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX)


def supervise_worker(
    *, env: dict[str, str], concurrency: int, loglevel: str, name: str | None, task_events: bool
) -> int:
    """Run the Celery worker under a Supervisor; `env` carries its settings (EAGLE_SYNTH_*, REDIS_URL)."""
    # One node name for every restart: status and the reaper see one worker, not a new one per crash.
    name = name or f"eagle-synth-{uuid.uuid4().hex[:6]}@%h"
    options = {"concurrency": concurrency, "loglevel": loglevel, "name": name, "task_events": task_events}
    argv = [sys.executable, "-m", "workers.child", json.dumps(options)]
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s/supervisor] %(message)s")
    return Supervisor(argv, {**os.environ, **env}).run()
