"""Who holds something in Redis, and whether that holder is a process that has died.

Leases, producer runs and in-flight counts name their holder as `host|pid[|extra]`. Only a
holder on this host can be checked (a dead process on another host is found by its key
expiring instead).
"""

from __future__ import annotations

import os
import socket


def holder_id(*extra: str) -> str:
    """This process's holder id: `host|pid`, plus any extra parts."""
    return "|".join([socket.gethostname(), str(os.getpid()), *extra])


def process_alive(pid: int) -> bool:
    """True if a process with this pid exists on this host (or cannot be signalled: another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder_dead(holder: str) -> bool:
    """True if the holder is a process on this host that no longer exists."""
    host, _, rest = holder.partition("|")
    pid = rest.split("|", 1)[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return not process_alive(int(pid))
