"""The worker process's malloc settings: glibc's per-thread arenas, capped.

glibc gives threads that contend for malloc their own arena (up to 8 per core), and memory
freed in one arena is reused only by the threads that land on it. A worker runs a batch thread
per batch held open (128 by default), each decoding payloads and encoding records in turn, so
freed blocks scatter over many arenas and RSS creeps up while Python's own heap stays flat.
Capping the arenas makes the threads share, and reuse, freed memory. Measured
(benchmarks/worker_memory.py, 100k records, 128 batch threads): RSS at the end 133 MiB capped
against 168 MiB with glibc's default arenas. It does not make RSS flat: both still grow after
warm-up (1.23x and 1.15x from 20 % of the records to the end), so arenas are not the whole
cause (see docs/benchmarks.md, known gaps).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

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
