"""The records folder as a resource the worker depends on, like its servers: a batch whose
records cannot be written (full, read-only `--out`) goes back to the queue whole, and the worker
takes no batches (its gate shows `disk`) until a probe write succeeds again.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

from eagle_synth.records import atomic_write_bytes

# Seconds between probes of a folder that failed, while the gate is closed for it.
DISK_PROBE_INTERVAL = 2.0


def probe_folder(folder: Path) -> str | None:
    """Write a small file in `folder` as records are written (fsync, rename: atomic_write_bytes),
    then delete it; None if that works, else why not."""
    probe = folder / f".probe-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
    try:
        atomic_write_bytes(probe, b"eagle-synth write probe\n" * 64)  # makes the folder if need be
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink()
        return f"{folder}: {exc.strerror or exc} (errno {exc.errno})"
    return None


class DiskState:
    """Whether the output folder (`folder`: the worker's `--out`) takes records; shared by batch
    threads and the health gate. `failed(detail, folder=...)` marks it down; `check()` re-probes
    the folder that failed at most every DISK_PROBE_INTERVAL s and marks it up when a probe works."""

    def __init__(self, *, folder: Path) -> None:
        self.folder = folder
        self._failed_folder = folder
        self._lock = threading.Lock()
        self.detail: str | None = None
        self._next_probe = 0.0

    def failed(self, detail: str, *, folder: Path | None = None) -> None:
        with self._lock:
            self.detail = detail
            self._failed_folder = folder or self.folder
            self._next_probe = time.monotonic() + DISK_PROBE_INTERVAL

    def check(self) -> bool:
        """Probe again if down and due; returns whether the folder takes records."""
        with self._lock:
            if self.detail is None or time.monotonic() < self._next_probe:
                return self.detail is None
            self._next_probe = time.monotonic() + DISK_PROBE_INTERVAL
        problem = probe_folder(self._failed_folder)
        with self._lock:
            self.detail = problem
        return problem is None
