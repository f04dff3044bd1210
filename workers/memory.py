"""The worker process's memory: glibc's malloc arenas capped, and every batch thread started
up front.

Arenas: glibc gives threads that contend for malloc their own arena (up to 8 per core), and
memory freed in one arena is reused only by the threads that land on it; a worker's batch
threads (128 by default) decode payloads and encode records in turn, so freed blocks scatter
over many arenas. Capping them took 35 MiB (21 %) off RSS after 100k records.

Threads: most of the growth after warm-up over 100k records (Python's heap flat under
tracemalloc) was the thread pool itself. Celery's ThreadPoolExecutor starts a thread only when a task finds none
idle, so the pool reached its limit over the run: /proc smaps showed 52 new thread stacks
(8 MiB mappings, ~0.3 MiB resident each) appear at 40k of 100k records, with RSS. Started up
front they are part of warm-up. Measured (benchmarks/worker_memory.py, 100k records, 128 batch
threads, arenas capped, process tree RSS from 20 % of the records to the end): 1.16x before
(158 -> 183 MiB), 1.04x after (178 -> 185 MiB). Over 1M records RSS still grows 1.17x, slowing,
in the second arena (BENCHMARKS.md, targets missed).
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

# Arenas a worker process may use: 2 took 35 MiB (21 %) off the worker's RSS after 100k records
# with 128 batch threads (the threads mostly wait on I/O, so they rarely contend for malloc).
WORKER_MALLOC_ARENAS = 2
# Environment variable that overrides it (0: glibc's default, for measuring the difference).
ARENAS_ENV = "EAGLE_SYNTH_MALLOC_ARENAS"
# mallopt's parameter number for the arena cap (glibc malloc.h: M_ARENA_MAX).
_M_ARENA_MAX = -8


def limit_malloc_arenas() -> int | None:
    """Cap glibc's malloc arenas for this process (call before starting threads); returns the
    cap set, or None where there is no glibc (musl, macOS) or the cap is turned off."""
    arenas = int(os.environ.get(ARENAS_ENV, WORKER_MALLOC_ARENAS))
    if arenas <= 0 or os.environ.get("MALLOC_ARENA_MAX"):
        return None  # off, or already set for the whole process by the operator
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    if mallopt(_M_ARENA_MAX, arenas) != 1:
        log.warning("could not cap malloc arenas at %d", arenas)
        return None
    return arenas


def start_pool_threads(pool: Any) -> int:
    """Start every batch thread of Celery's thread pool now; returns how many it has.

    ThreadPoolExecutor starts a thread only when a task finds none idle, so the pool grows to
    its limit over hours, each new thread adding its stack and thread state to RSS (the growth
    read as a leak). Blocking `limit` placeholder tasks until all are submitted makes each
    submit start a thread."""
    executor = getattr(pool, "executor", None)
    limit = getattr(pool, "limit", 0)
    if not isinstance(executor, ThreadPoolExecutor) or not limit:
        return 0
    release = threading.Event()
    for _ in range(limit):
        executor.submit(release.wait)
    release.set()
    return len(executor._threads)
