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
    keeps the uptime clock. `generate_calls_before_healthy` counts /generate requests that
    arrived while /health would still have answered 503 (work a client sent too early).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self.reset()

    def reset(self) -> None:
        """Zero every counter (uptime keeps counting)."""
        with self._lock:
            self._counts: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
            self._counts["busy_slot_seconds"], self._counts["first_generate_at"] = 0.0, None

    def generate_received(self, *, healthy: bool) -> None:
        with self._lock:
            self._counts["generate_requests"] += 1
            if self._counts["first_generate_at"] is None:
                self._counts["first_generate_at"] = time.time()
            self._counts["generate_calls_before_healthy"] += not healthy

    def prompt_done(self, *, output_tokens: int, aborted: bool) -> None:
        with self._lock:
            self._counts["prompts"] += 1
            self._counts["output_tokens"] += output_tokens
            self._counts["aborted"] += aborted

    def slot_released(self, held_seconds: float) -> None:
        with self._lock:
            self._counts["busy_slot_seconds"] += held_seconds

    def load(self, running: int, waiting: int) -> None:
        # Called under the scheduler lock on every change: keep it tiny.
        counts = self._counts
        counts["peak_running"] = max(counts["peak_running"], running)
        counts["peak_waiting"] = max(counts["peak_waiting"], waiting)
        counts["peak_prompts"] = max(counts["peak_prompts"], running + waiting)

    def count(self, name: str) -> None:
        """Add one to a named counter (injected_failures, client_errors, ...)."""
        with self._lock:
            self._counts[name] += 1

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        """The /dev/stats body; `extra` adds live values (slots, running, waiting...)."""
        with self._lock:
            return {
                "uptime": time.monotonic() - self._started_mono,
                "started_at": self.started_at,
                **self._counts,
                **extra,
            }
