"""The records folder as a resource the worker depends on, like its servers.

A full, read-only or unwritable `--out` must not turn generated prompts into lost ones: a
batch whose records cannot be written goes back to the queue whole, and the worker stops
taking batches (its gate shows `disk`) until a probe write succeeds again. Then the campaign
goes on unattended.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from pathlib import Path

# Seconds between probes of a folder that failed, while the gate is closed for it.
DISK_PROBE_INTERVAL = 2.0
# errno values that mean "this folder cannot take records now", not a bug of ours.
DISK_ERRNOS = frozenset({
    errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EIO, errno.ENOENT,
})


class DiskUnavailable(Exception):
    """Records cannot be written to the output folder; the batch goes back to the queue."""


def is_disk_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS


def probe_folder(folder: Path) -> str | None:
    """Write, fsync and delete a small file in `folder`; None if that works, else why not."""
    probe = folder / f".probe-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"eagle-synth write probe\n" * 64)
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as exc:
        try:
            probe.unlink()
        except OSError:
            pass
        return f"{folder}: {exc.strerror or exc} (errno {exc.errno})"
    return None


class DiskState:
    """Whether the output folder takes records; shared by batch threads and the health gate.

    Behaviour: `failed(detail)` marks it down (a batch could not write); `check()` re-probes a
    down folder at most every DISK_PROBE_INTERVAL seconds and marks it up when a probe works.

    Parameters:
        folder: the worker's `--out`.
    """

    def __init__(self, *, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self.detail: str | None = None
        self._next_probe = 0.0

    @property
    def ok(self) -> bool:
        return self.detail is None

    def failed(self, detail: str) -> None:
        with self._lock:
            self.detail = detail
            self._next_probe = time.monotonic() + DISK_PROBE_INTERVAL

    def check(self) -> bool:
        """Probe again if down and due; returns whether the folder takes records."""
        with self._lock:
            if self.detail is None or time.monotonic() < self._next_probe:
                return self.detail is None
            self._next_probe = time.monotonic() + DISK_PROBE_INTERVAL
        problem = probe_folder(self.folder)
        with self._lock:
            self.detail = problem
        return problem is None
