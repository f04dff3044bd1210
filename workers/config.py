"""Worker settings, passed from the CLI to the worker process through the environment."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from eagle_synth.payload import DEFAULT_BATCH_SIZE

ENV_SERVERS = "EAGLE_SYNTH_SERVERS"
ENV_OUT = "EAGLE_SYNTH_OUT"
ENV_ALLOW_PARSERS = "EAGLE_SYNTH_ALLOW_SERVER_PARSERS"
ENV_MAX_ATTEMPTS = "EAGLE_SYNTH_MAX_ATTEMPTS"
ENV_TIMEOUT_BASE = "EAGLE_SYNTH_TIMEOUT_BASE"
ENV_TIMEOUT_PER_TOKEN = "EAGLE_SYNTH_TIMEOUT_PER_TOKEN"
ENV_BACKOFF_MAX = "EAGLE_SYNTH_BACKOFF_MAX"
ENV_PROBE_TIMEOUT = "EAGLE_SYNTH_PROBE_TIMEOUT"
ENV_INFLIGHT = "EAGLE_SYNTH_INFLIGHT"
ENV_RENDER_PROCESSES = "EAGLE_SYNTH_RENDER_PROCESSES"

# Prompts kept in flight per server when neither --inflight nor the server says how many it runs.
DEFAULT_INFLIGHT = 256
# In flight per server when the server reports max_running_requests: a full server plus a
# margin, so a freed slot finds the next prompt already waiting in the server's queue.
AUTO_INFLIGHT_FACTOR = 1.25
# Prompts the worker holds open (in reserved batches) per in-flight ticket: heavy-tailed
# outputs leave many batches with one straggler, and the tickets must never run dry
# (benchmarks/occupancy.py measures it).
OPEN_PROMPTS_PER_TICKET = 4
# Attempts per prompt on transient errors (timeouts, 5xx, 429) while the server is healthy.
DEFAULT_MAX_ATTEMPTS = 6
# A /generate request may take this long plus TIMEOUT_PER_TOKEN per max_new_tokens, seconds.
DEFAULT_TIMEOUT_BASE = 120.0
DEFAULT_TIMEOUT_PER_TOKEN = 0.1
# Longest wait between transient-error retries, seconds (backoff doubles up to it, jittered).
DEFAULT_BACKOFF_MAX = 30.0
# Processes that render conversations' next turns (`--history own`), started on first need.
DEFAULT_RENDER_PROCESSES = 2


def default_concurrency(*, inflight: int, servers: int, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
    """Batches to hold open (batch threads) so `inflight` tickets per server never run dry."""
    return max(2, math.ceil(OPEN_PROMPTS_PER_TICKET * inflight * servers / batch_size))


def auto_inflight(capacity: int | None) -> int:
    """In-flight tickets for a server that runs `capacity` requests at once (None: unknown)."""
    return math.ceil(AUTO_INFLIGHT_FACTOR * capacity) if capacity else DEFAULT_INFLIGHT


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What every pool child needs to run a batch.

    Parameters:
        servers: SGLang base URLs.
        out: records go to OUT/<campaign>/.
        allow_server_parsers: accept servers preflight would refuse.
        max_attempts: transient-error attempts per prompt.
        timeout_base, timeout_per_token: request timeout = base + per_token * max_new_tokens.
        backoff_max: longest wait between retries.
        probe_timeout: seconds a /health probe may take.
        inflight: prompts in flight per server; None follows the server's reported capacity.
        render_processes: processes rendering conversations' next turns (`--history own`).
    """

    servers: tuple[str, ...]
    out: Path
    allow_server_parsers: bool = False
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    timeout_base: float = DEFAULT_TIMEOUT_BASE
    timeout_per_token: float = DEFAULT_TIMEOUT_PER_TOKEN
    backoff_max: float = DEFAULT_BACKOFF_MAX
    probe_timeout: float = 25.0
    inflight: int | None = None
    render_processes: int = DEFAULT_RENDER_PROCESSES

    def to_env(self) -> dict[str, str]:
        return {
            ENV_SERVERS: ",".join(self.servers),
            ENV_OUT: str(self.out),
            ENV_ALLOW_PARSERS: "1" if self.allow_server_parsers else "0",
            ENV_MAX_ATTEMPTS: str(self.max_attempts),
            ENV_TIMEOUT_BASE: str(self.timeout_base),
            ENV_TIMEOUT_PER_TOKEN: str(self.timeout_per_token),
            ENV_BACKOFF_MAX: str(self.backoff_max),
            ENV_PROBE_TIMEOUT: str(self.probe_timeout),
            ENV_INFLIGHT: str(self.inflight or ""),
            ENV_RENDER_PROCESSES: str(self.render_processes),
        }

    @classmethod
    def from_env(cls) -> WorkerConfig:
        servers = tuple(s.strip().rstrip("/") for s in os.environ.get(ENV_SERVERS, "").split(",") if s.strip())
        if not servers:
            raise RuntimeError(
                f"no SGLang server configured: set {ENV_SERVERS} or start with `eagle-synth worker --server URL`"
            )
        return cls(
            servers=servers,
            out=Path(os.environ.get(ENV_OUT, "out")),
            allow_server_parsers=os.environ.get(ENV_ALLOW_PARSERS) == "1",
            max_attempts=int(os.environ.get(ENV_MAX_ATTEMPTS, DEFAULT_MAX_ATTEMPTS)),
            timeout_base=float(os.environ.get(ENV_TIMEOUT_BASE, DEFAULT_TIMEOUT_BASE)),
            timeout_per_token=float(os.environ.get(ENV_TIMEOUT_PER_TOKEN, DEFAULT_TIMEOUT_PER_TOKEN)),
            backoff_max=float(os.environ.get(ENV_BACKOFF_MAX, DEFAULT_BACKOFF_MAX)),
            probe_timeout=float(os.environ.get(ENV_PROBE_TIMEOUT, 25.0)),
            inflight=int(os.environ[ENV_INFLIGHT]) if os.environ.get(ENV_INFLIGHT) else None,
            render_processes=int(os.environ.get(ENV_RENDER_PROCESSES) or DEFAULT_RENDER_PROCESSES),
        )

    def request_timeout(self, max_new_tokens: int) -> float:
        return self.timeout_base + self.timeout_per_token * max_new_tokens
