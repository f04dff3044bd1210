"""Whether a TCP address can be bound now, so a server refuses a taken port in one line before it
starts (the devserver, the worker's metrics, the exporter, Flower)."""

from __future__ import annotations

import socket


def bind_error(host: str, port: int) -> OSError | None:
    """What binding (host, port) raises now, None if it binds. SO_REUSEADDR as HTTP servers bind
    (Tornado, aiohttp), so a port in TIME_WAIT passes."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None
