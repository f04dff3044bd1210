"""DevStats: the counters behind GET /dev/stats, which benchmarks and fault tests read."""

from __future__ import annotations

import threading
import time
from typing import Any

# Every counter /dev/stats reports, in its order (after uptime and started_at).
COUNTERS = (
    *("generate_requests", "generate_calls_before_healthy", "first_generate_at", "prompts", "output_tokens"),
    *("busy_slot_seconds", "injected_failures", "injected_drops", "client_errors", "queue_full", "aborted"),
    *("health_requests", "health_unavailable", "health_trickled", "injected_malformed", "deprecated_info_calls"),
    *("peak_running", "peak_waiting", "peak_prompts"),
)


class DevStats:
    """Thread-safe counters of what the devserver did since start (or the last reset).

    Behaviour: `snapshot()` returns a JSON-ready dict; `reset()` zeroes every counter but
    keeps the uptime clock. `generate_calls_before_healthy` counts generation requests that
    arrived while /health would still have answered 503 (work a client sent too early).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started_at, self._started_mono = time.time(), time.monotonic()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._counts: dict[str, Any] = {**dict.fromkeys(COUNTERS, 0), "busy_slot_seconds": 0.0}
            self._counts["first_generate_at"] = None

    def add(self, **amounts: float) -> None:
        """Add to named counters (injected_failures=1, output_tokens=n, ...)."""
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] += amount

    def count(self, name: str) -> None:
        self.add(**{name: 1})

    def generate_received(self, *, healthy: bool) -> None:
        with self._lock:
            self._counts["generate_requests"] += 1
            self._counts["generate_calls_before_healthy"] += not healthy
            if self._counts["first_generate_at"] is None:
                self._counts["first_generate_at"] = time.time()

    def prompt_done(self, *, output_tokens: int, aborted: bool) -> None:
        self.add(prompts=1, output_tokens=output_tokens, aborted=aborted)

    def load(self, running: int, waiting: int) -> None:
        # Called under the scheduler lock on every change: keep it tiny.
        counts = self._counts
        counts["peak_running"] = max(counts["peak_running"], running)
        counts["peak_waiting"] = max(counts["peak_waiting"], waiting)
        counts["peak_prompts"] = max(counts["peak_prompts"], running + waiting)

    def snapshot(self, **live: Any) -> dict[str, Any]:
        """The /dev/stats body; `live` adds current values (slots, running, waiting...)."""
        with self._lock:
            return {
                "uptime": time.monotonic() - self._started_mono,
                "started_at": self.started_at,
                **self._counts,
                **live,
            }
