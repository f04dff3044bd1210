"""The worker process's memory: glibc's malloc arenas capped, every batch thread started up front.

Arenas: glibc gives contending threads their own arena (up to 8 per core) and memory freed in
one is reused only by threads landing on it; 128 batch threads scatter freed blocks over many.
Capping them took 35 MiB (21 %) off RSS after 100k records.

Threads: Celery's ThreadPoolExecutor starts a thread only when a task finds none idle, so the
pool grew to its limit over a run (52 new 8 MiB stacks, ~0.3 MiB resident each, at 40k of 100k
records; Python's heap flat). Started up front they are warm-up: RSS growth from 20 % of 100k
records to the end went 1.16x -> 1.04x (benchmarks/worker_memory.py); over 1M records it still
grows 1.17x, slowing, in the second arena (BENCHMARKS.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("eagle_synth.worker")

# Arenas a worker process may use (its threads mostly wait on I/O, rarely contending for malloc).
WORKER_MALLOC_ARENAS = 2
# Environment variable that overrides it (0: glibc's default, for measuring the difference).
ARENAS_ENV = "EAGLE_SYNTH_MALLOC_ARENAS"
# mallopt's parameter number for the arena cap (glibc malloc.h: M_ARENA_MAX).
_M_ARENA_MAX = -8


def limit_malloc_arenas() -> None:
    """Cap glibc's malloc arenas for this process (call before starting threads); a no-op where
    there is no glibc (musl, macOS) or the cap is turned off."""
    arenas = int(os.environ.get(ARENAS_ENV, WORKER_MALLOC_ARENAS))
    if arenas <= 0 or os.environ.get("MALLOC_ARENA_MAX"):
        return  # off, or already set for the whole process by the operator
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    if mallopt(_M_ARENA_MAX, arenas) != 1:
        log.warning("could not cap malloc arenas at %d", arenas)


def start_pool_threads(pool: Any) -> int:
    """Start every batch thread of Celery's thread pool now (module docstring); returns how many
    it has. `limit` placeholder tasks blocked until all are submitted make each submit start one."""
    executor = getattr(pool, "executor", None)
    limit = getattr(pool, "limit", 0)
    if not isinstance(executor, ThreadPoolExecutor) or not limit:
        return 0
    release = threading.Event()
    for _ in range(limit):
        executor.submit(release.wait)
    release.set()
    return len(executor._threads)
