"""Who holds something in Redis (`host|pid|space[|extra]`), and whether that holder has died.

A pid means something only in its pid space: one boot of one kernel (hostnames repeat across
cloned machines) and, on it, one pid namespace (containers sharing a host number their processes
each from 1, and one's /proc cannot see the other's). So a pid is checked only by a process of
the same space; any other holder dies by its key expiring (its lease or heartbeat lapsing).
"""

from __future__ import annotations

import os
import secrets
import socket
from functools import cache
from pathlib import Path

import redis

# Overrides of the system's values (tests run two "hosts" on one machine; operators name nodes).
ENV_HOSTNAME = "EAGLE_SYNTH_HOSTNAME"
ENV_BOOT_ID = "EAGLE_SYNTH_BOOT_ID"
# The kernel's random id of the current boot (Linux): differs between cloned VMs and after reboots.
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
# This process's pid namespace (Linux: `pid:[INODE]`, the inode unique on one boot).
PID_NAMESPACE_LINK = "/proc/self/ns/pid"


def hostname() -> str:
    return os.environ.get(ENV_HOSTNAME) or socket.gethostname()


@cache
def boot_id() -> str:
    """The kernel's boot id, else one random per process (then only key expiry proves death)."""
    if given := os.environ.get(ENV_BOOT_ID):
        return given
    try:
        found = Path(BOOT_ID_FILE).read_text().strip().replace("-", "")
    except OSError:
        found = ""
    return found[:16] or "r" + secrets.token_hex(8)


@cache
def pid_namespace() -> str:
    """This process's pid namespace (its inode number), else one random per process (then,
    again, only key expiry proves a holder's death)."""
    try:
        link = os.readlink(PID_NAMESPACE_LINK)
    except OSError:
        link = ""
    return link.partition("[")[2].rstrip("]") or "r" + secrets.token_hex(8)


def pid_space() -> str:
    """Where this process's pids mean something: the boot, then the pid namespace on it."""
    return f"{boot_id()}.{pid_namespace()}"


def holder_id(*extra: str) -> str:
    return "|".join([hostname(), str(os.getpid()), pid_space(), *extra])


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
    """True if the holder is a process of this very pid space (boot and pid namespace) that no
    longer exists."""
    parts = holder.split("|")
    if len(parts) < 3 or parts[2] != pid_space() or not parts[1].isdigit():
        return False
    return not process_alive(int(parts[1]))


def holder_host(holder: str) -> str:
    """The host part of a holder id."""
    return holder.split("|", 1)[0]


def holder_gone_here(holder: str) -> bool:
    """holder_dead, for a holder of this very host name too: containers on one machine share its
    boot id but not their pid numbers, and a container's host name is its own (compose sets it)."""
    return holder_host(holder) == hostname() and holder_dead(holder)


def holder_alive(client: redis.Redis, holder: str, alive_key: str) -> bool:
    """A holder with a liveness key is alive while the key lives and it is not dead here."""
    return not holder_dead(holder) and bool(client.exists(alive_key))
