"""DevStats: the counters behind GET /dev/stats, which benchmarks and fault tests read."""

from __future__ import annotations

import threading
import time
from typing import Any


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
            self.generate_requests = 0
            self.generate_calls_before_healthy = 0
            self.first_generate_at: float | None = None
            self.prompts = 0
            self.output_tokens = 0
            self.busy_slot_seconds = 0.0
            self.injected_failures = 0
            self.injected_drops = 0
            self.client_errors = 0
            self.queue_full = 0
            self.aborted = 0
            self.health_requests = 0
            self.health_unavailable = 0
            self.health_trickled = 0
            self.injected_malformed = 0
            self.deprecated_info_calls = 0
            self.peak_running = 0
            self.peak_waiting = 0
            self.peak_prompts = 0

    def generate_received(self, *, healthy: bool) -> None:
        with self._lock:
            self.generate_requests += 1
            if self.first_generate_at is None:
                self.first_generate_at = time.time()
            if not healthy:
                self.generate_calls_before_healthy += 1

    def prompt_done(self, *, output_tokens: int, aborted: bool) -> None:
        with self._lock:
            self.prompts += 1
            self.output_tokens += output_tokens
            if aborted:
                self.aborted += 1

    def slot_released(self, held_seconds: float) -> None:
        with self._lock:
            self.busy_slot_seconds += held_seconds

    def load(self, running: int, waiting: int) -> None:
        # Called under the scheduler lock on every change: keep it tiny.
        if running > self.peak_running:
            self.peak_running = running
        if waiting > self.peak_waiting:
            self.peak_waiting = waiting
        if running + waiting > self.peak_prompts:
            self.peak_prompts = running + waiting

    def count(self, name: str) -> None:
        """Add one to a named counter (injected_failures, client_errors, ...)."""
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        """The /dev/stats body; `extra` adds live values (slots, running, waiting...)."""
        with self._lock:
            data = {
                "uptime": time.monotonic() - self._started_mono,
                "started_at": self.started_at,
                "generate_requests": self.generate_requests,
                "generate_calls_before_healthy": self.generate_calls_before_healthy,
                "first_generate_at": self.first_generate_at,
                "prompts": self.prompts,
                "output_tokens": self.output_tokens,
                "busy_slot_seconds": self.busy_slot_seconds,
                "injected_failures": self.injected_failures,
                "injected_drops": self.injected_drops,
                "client_errors": self.client_errors,
                "queue_full": self.queue_full,
                "aborted": self.aborted,
                "health_requests": self.health_requests,
                "health_unavailable": self.health_unavailable,
                "health_trickled": self.health_trickled,
                "injected_malformed": self.injected_malformed,
                "deprecated_info_calls": self.deprecated_info_calls,
                "peak_running": self.peak_running,
                "peak_waiting": self.peak_waiting,
                "peak_prompts": self.peak_prompts,
            }
        data.update(extra)
        return data
