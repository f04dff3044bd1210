"""Who holds something in Redis, and whether that holder is a process that has died.

Leases, producer runs and in-flight counts name their holder as `host|pid|boot[|extra]`:
`host` for people reading Redis, `boot` a token unique to this boot of this machine (the
kernel's random boot id, or a random one when the system has none). A pid can only be checked
by a process of the same boot: two hosts may share a hostname (cloned VMs, bare-metal images),
and a pid that is not running here says nothing about a process on another machine. A dead
process on another machine is found by its key expiring instead.
"""

from __future__ import annotations

import os
import secrets
import socket
from functools import cache
from pathlib import Path

import redis

# Environment variables that override what this module reads from the system, so tests can run
# two "hosts" with one hostname on one machine (and operators can name nodes explicitly).
ENV_HOSTNAME = "EAGLE_SYNTH_HOSTNAME"
ENV_BOOT_ID = "EAGLE_SYNTH_BOOT_ID"
# The kernel's random id of the current boot (Linux): differs between cloned VMs and after reboots.
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def hostname() -> str:
    return os.environ.get(ENV_HOSTNAME) or socket.gethostname()


@cache
def boot_id() -> str:
    """A token unique to this boot of this machine: the kernel's boot id, else one random per
    process (then a pid is never taken as proof of death: only key expiry is)."""
    if given := os.environ.get(ENV_BOOT_ID):
        return given
    try:
        found = Path(BOOT_ID_FILE).read_text().strip().replace("-", "")
    except OSError:
        found = ""
    return found[:16] or "r" + secrets.token_hex(8)


def holder_id(*extra: str) -> str:
    return "|".join([hostname(), str(os.getpid()), boot_id(), *extra])


def process_alive(pid: int) -> bool:
    """True if a process with this pid exists on this host (or cannot be signalled: another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def holder_dead(holder: str) -> bool:
    """True if the holder is a process of this very boot of this machine that no longer exists;
    one of another machine or an older form without a boot id never is (its key's expiry tells)."""
    parts = holder.split("|")
    if len(parts) < 3 or parts[2] != boot_id() or not parts[1].isdigit():
        return False
    return not process_alive(int(parts[1]))


def holder_alive(client: redis.Redis, holder: str, alive_key: str) -> bool:
    """The one liveness check of a holder that keeps a liveness key: alive while the key lives
    (another machine's holder dies by its expiry) and it is not a dead process of this boot."""
    return not holder_dead(holder) and bool(client.exists(alive_key))
