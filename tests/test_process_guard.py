"""A server a test run starts ends with the run, however the run ends (tests/process_guard.py):
a stand-in test process starts a fake server (a process with a child of its own, as vLLM's
API server has its engine) through GuardedProcess, and is then killed; both must be gone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eagle_synth.testing.harness import wait_for

ROOT = Path(__file__).resolve().parent.parent
# Seconds the server and its child may take to be gone once the test process died.
GONE_WITHIN = 20.0

# The fake server: starts a child in its own group (as an engine process), says both pids, waits.
_FAKE_SERVER = """
import json, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({"server": __import__("os").getpid(), "engine": child.pid}), flush=True)
time.sleep(600)
"""

# The stand-in test process: starts the fake server guarded, waits until it reported its pids,
# says it is ready, then sleeps until it is killed.
_TEST_PROCESS = """
import sys, time
from pathlib import Path
from eagle_synth.testing.harness import wait_for
from tests.process_guard import GuardedProcess
log = Path(sys.argv[1])
GuardedProcess(args=[sys.executable, "-c", sys.argv[2]], env={}, log_path=log).start()
wait_for(lambda: log.exists() and log.read_text().strip(), timeout=30, what="the fake server's pids")
print("ready", flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, waiting for whoever adopted it to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    state = next((line.split()[1] for line in status.splitlines() if line.startswith("State:")), "")
    return state in ("Z", "X")


@pytest.mark.integration
@pytest.mark.parametrize(
    "ending", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: signal.Signals(s).name
)
def test_a_guarded_server_ends_with_the_test_process(tmp_path, ending):
    log = tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    test_process = subprocess.Popen(
        [sys.executable, "-c", _TEST_PROCESS, str(log), _FAKE_SERVER],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: dict[str, int] = {}
    try:
        assert test_process.stdout is not None
        ready = test_process.stdout.readline().strip()
        assert ready == "ready", test_process.stderr.read() if test_process.stderr else ""
        pids = json.loads(log.read_text())
        assert not _gone(pids["server"]) and not _gone(pids["engine"])

        test_process.send_signal(ending)
        test_process.wait(timeout=30)
        wait_for(
            lambda: _gone(pids["server"]) and _gone(pids["engine"]),
            timeout=GONE_WITHIN,
            interval=0.1,
            what=f"the fake server and its engine to end after {signal.Signals(ending).name}",
        )
    finally:
        if test_process.poll() is None:
            test_process.kill()
            test_process.wait()
        for pid in pids.values():  # a failed run must not leave them behind either
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
