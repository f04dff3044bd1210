"""Which batches left record files in this host's records folder, without listing it per batch.

Any copy of a batch adopts the files of its batch already on this host's disk (workers/batch.py):
a Redis failover or restart can forget marks and acks the old master acknowledged, so a batch
can come back as a fresh message after its records were written here. Listing a folder of
20,000 files costs about 15 ms, more than the worker spends on a whole batch, so the batch ids
found are kept per folder with the folder's mtime, and the folder is listed again only when
something other than this process's own writes changed it (another process, compaction,
`repair`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from eagle_synth.records import RECORD_SUFFIX, batch_files, batch_of_file, is_shard, records_dir


class OwnBatchFiles:
    """Per campaign folder: the batch ids with a record file in it, and the folder mtime (ns)
    that list is true for. Thread-safe; `files(folder, batch)` answers from it, `write` records
    a write of this process. A write by another process in the instant between this process's
    rename and its look at the mtime after it goes unseen until the folder changes again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[Path, tuple[int, set[str]]] = {}

    @staticmethod
    def _mtime(folder: Path) -> int:
        try:
            return os.stat(folder).st_mtime_ns
        except FileNotFoundError:
            return -1

    def _batches(self, folder: Path) -> set[str]:
        """The batch ids in `folder`, listed again if it changed since last seen."""
        mtime = self._mtime(folder)
        with self._lock:
            known = self._known.get(folder)
            if known is not None and known[0] == mtime:
                return known[1]
        try:
            names = os.listdir(folder) if mtime >= 0 else []
        except OSError:  # not a folder, or unreadable: nothing to adopt; the batch's write says why
            return set()
        batches = {batch_of_file(n) for n in names if n.endswith(RECORD_SUFFIX) and not is_shard(n)}
        with self._lock:
            self._known[folder] = (mtime, batches)
        return batches

    def files(self, campaign_path: Path, batch: str) -> list[Path]:
        """The record files of `batch` in the campaign's records folder (records.batch_files)."""
        if batch not in self._batches(records_dir(campaign_path)):
            return []
        return batch_files(campaign_path, batch)

    def write(self, campaign_path: Path, batch: str, writer: Callable[[], Path]) -> Path:
        """Run `writer` (which writes one record file of `batch`) and note the file, keeping the
        list when nothing else changed the folder before it."""
        folder = records_dir(campaign_path)
        before = self._mtime(folder)
        path = writer()
        after = self._mtime(folder)
        with self._lock:
            known = self._known.get(folder)
            if known is not None and known[0] == before:
                self._known[folder] = (after, known[1] | {batch})
            else:
                self._known.pop(folder, None)
        return path
