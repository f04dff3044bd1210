"""workers/app.py StopDeadlineStep: a worker process that hangs while stopping still ends.

After kombu's "Unrecoverable error" (a Redis restart) a Celery process was seen to log its
stop and then never exit, so the supervisor never restarted it. The step ends such a process
with the worker's exit code once the soft-shutdown timeout plus a margin has passed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

# A Celery worker stopping after an error (exitcode 1) whose interpreter cannot exit: a
# non-daemon thread that never ends holds it, as a stuck batch thread would.
HANGING_STOP = """
import threading, time
import workers.app as app
app.STOP_DEADLINE_MARGIN = 1
class Worker:
    exitcode = 1
app.StopDeadlineStep(Worker()).stop(Worker())
assert app.STOPPING.is_set()
threading.Thread(target=time.sleep, args=(3600,)).start()
"""


@pytest.mark.integration
def test_a_worker_stuck_while_stopping_is_ended_with_its_exit_code() -> None:
    env = {**os.environ, "EAGLE_SYNTH_SOFT_SHUTDOWN_TIMEOUT": "1"}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", HANGING_STOP], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < 30
    assert "did not finish stopping" in result.stderr
