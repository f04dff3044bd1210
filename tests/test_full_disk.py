"""A full disk (issue 35, item 7): `compact` ends in one line and leaves the campaign readable,
and no failed write (a batch's records, the worker's disk probe) leaves a temporary file.

The disk is a small tmpfs mounted for the test (root and mount(8) needed), filled up with a
filler file: writes fail with ENOSPC as on a real full disk. Where mounting is not possible the
tests still run: the writes of this process or of the CLI it starts fail by a file-size limit
(RLIMIT_FSIZE: EFBIG at the write, after the file was made), and the worker's folder is made
read-only instead (EACCES).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eagle_synth.testing.harness import wait_for
from tests.helpers import assert_exactly_once, campaign, enqueue_rows, status_now, wait_finished
from tests.test_compact import contents, fill
from tests.test_exactly_once import FAST, celery_child, single_rows
from workers.disk import probe_folder

# Every test here mounts a disk (a process) or starts the CLI or a worker.
pytestmark = pytest.mark.integration

# Size of the test's disk: room for a campaign's batch files, then filled up.
DISK_KB = 2048
# Bytes per write of the filler file.
FILL_CHUNK = 64 * 1024


class FullDisk:
    """A folder on a small disk of its own that can be filled up and freed again (a tmpfs mounted
    at `path`; else a file-size limit on the processes told of it, `limits`).

    Parameters:
        path: where the disk is mounted (made if need be).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        mount = ["mount", "-t", "tmpfs", "-o", f"size={DISK_KB}k", "tmpfs", str(path)]
        self.mounted = os.geteuid() == 0 and subprocess.run(mount, capture_output=True).returncode == 0
        self.filler = path / "filler"
        self.limited = False  # this process may grow no file
        self.read_only: list[Path] = []

    def fill(self, worker_folder: Path | None = None) -> None:
        """Leave no free byte (tmpfs); else forbid this process to grow any file, or make
        `worker_folder` read-only for the worker writing there."""
        if self.mounted:
            with open(self.filler, "wb") as handle, contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * FILL_CHUNK)
                    handle.flush()
        elif worker_folder is not None:
            worker_folder.chmod(0o555)
            self.read_only.append(worker_folder)
        else:
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
            self.limited = True

    def preexec(self) -> Callable[[], None] | None:
        """What a process started on the full disk runs before its program (the file-size limit
        where there is no tmpfs)."""
        return None if self.mounted else _no_file_growth

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)
        if self.limited:
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            self.limited = False
        for folder in self.read_only:
            folder.chmod(0o755)
        self.read_only.clear()

    def failure(self, *, worker: bool = False) -> str:
        """The words of the error a write gets (by the worker: in its read-only folder)."""
        if self.mounted:
            return os.strerror(errno.ENOSPC)
        return os.strerror(errno.EACCES if worker else errno.EFBIG)

    def close(self) -> None:
        self.free()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


@pytest.fixture
def full_disk(tmp_path) -> Iterator[FullDisk]:
    disk = FullDisk(tmp_path / "disk")
    try:
        yield disk
    finally:
        disk.close()


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*") if p.name.startswith((".tmp-", ".probe-"))]


def test_compact_on_a_full_disk_ends_in_one_line_and_the_campaign_reads_as_before(full_disk):
    folder = full_disk.path / "c"
    fill(folder, batches=12)
    before = contents(folder, dedupe=False)
    command = [sys.executable, "-m", "eagle_synth", "compact", str(folder), "--min-age", "0"]
    full_disk.fill()
    result = subprocess.run(command, capture_output=True, timeout=120, preexec_fn=full_disk.preexec())
    assert result.returncode == 2, result.stderr.decode()
    said = result.stderr.decode().strip()
    assert len(said.splitlines()) == 1 and "Traceback" not in said, said
    assert "cannot write a shard in" in said and full_disk.failure() in said
    assert not temporaries(folder), "the failed shard left no temporary file"
    assert contents(folder, dedupe=False) == before, "every batch file is kept and reads as before"
    full_disk.free()
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    assert contents(folder, dedupe=False) == before
    assert any(p.name.startswith("shard-") for p in (folder / "records").iterdir())


def _no_file_growth() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))


def test_a_failed_disk_probe_leaves_no_temporary_file(full_disk):
    folder = full_disk.path / "out"
    folder.mkdir()
    full_disk.fill()
    try:
        problems = [probe_folder(folder) for _ in range(3)]
    finally:
        full_disk.free()
    assert all(p is not None and full_disk.failure() in p for p in problems), problems
    assert not temporaries(full_disk.path), "each failed probe left a temporary file"
    assert probe_folder(folder) is None


def test_a_worker_on_a_full_disk_leaves_no_temporary_file_and_ends_exactly_once(
    full_disk, tmp_path, redis_server, stack, tokenizer_path
):
    out = full_disk.path / "out"
    _, url = stack.devserver("--token-latency", "0.001")
    worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST)
    wait_for(lambda: celery_child(worker), timeout=60, what="the Celery process")
    full_disk.fill(out)  # after the start-up probe, which refuses a disk that takes nothing
    enqueue_rows(tmp_path, redis_server.url, "full", single_rows(12), tokenizer=tokenizer_path, batch_size=4)
    c = campaign(redis_server.url, "full")

    def gate_closed_for_disk() -> bool:
        workers = status_now(redis_server.url, "full")["workers"]
        return bool(workers) and bool(workers[0]["disk"]) and not workers[0]["consuming"]

    wait_for(gate_closed_for_disk, timeout=60, interval=0.1, what="the worker to stop for its output folder")
    detail = status_now(redis_server.url, "full")["workers"][0]["disk"]
    assert full_disk.failure(worker=True) in str(detail)
    assert (c.progress().done, c.progress().failed) == (0, 0)
    assert not temporaries(out), "a failed write or probe left a temporary file"
    full_disk.free()  # the operator frees the disk; nobody restarts anything
    wait_finished(redis_server.url, "full", expected=12, stack=stack, timeout=90)
    assert_exactly_once(redis_server.url, "full", out / "full", expected=12)
    assert not temporaries(out)
