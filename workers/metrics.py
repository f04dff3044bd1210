"""The worker's Prometheus metrics, served by its Celery process (`eagle-synth worker --metrics-port`).

The batch code calls one plainly named hook per event (a request sent and answered, a record
file committed, a prompt failed, a server's health changed); each hook returns at once while
metrics are off, so a worker without --metrics-port pays one flag test per event. Counters live in
the process: a restarted worker process starts them from zero, which Prometheus' rate() and
increase() read as a counter reset. Campaign-wide totals from Redis are `eagle-synth exporter`'s
(eagle_synth/tools/exporter.py). Every metric is listed in docs/operations.md "Metrics".
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from eagle_synth.errors import BadRequest, ServerDown, TransientError, Unauthorized
from eagle_synth.records import Record
from eagle_synth.state.node_state import HEALTHY, LOADING, REFUSED, UNHEALTHY, UNKNOWN, WARMING

log = logging.getLogger("eagle_synth.metrics")

# Histogram buckets of request latency, seconds: a prompt takes from well under a second (a short
# answer) to many minutes (a long reasoning trace); every doubling step keeps the quantiles honest.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 240, 480, 960, 1920)
# The states a server can be in (eagle_synth/state/node_state.py), each a series of the health gauge.
SERVER_STATES = (UNKNOWN, LOADING, WARMING, HEALTHY, UNHEALTHY, REFUSED)
# Error kinds of a failed request (label `kind`), by the client's error class; others are "other".
ERROR_KINDS = (
    (Unauthorized, "unauthorized"),
    (ServerDown, "connection_refused"),
    (BadRequest, "bad_request"),
    (TransientError, "transient"),
)

# Its own registry: the worker's metrics, not whatever else an imported library registers.
REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS_INFLIGHT = Gauge(
    "eagle_synth_worker_requests_inflight",
    "Generation requests this worker process has open at the server now.",
    ["server"],
    registry=REGISTRY,
)
SLOTS = Gauge(
    "eagle_synth_worker_slots",
    "In-flight tickets this worker may use at the server now (0 while it routes nothing there).",
    ["server"],
    registry=REGISTRY,
)
RECORDS_WRITTEN = Counter(
    "eagle_synth_worker_records_written",
    "Records this worker process wrote and marked done, by the server that generated them.",
    ["server", "campaign"],
    registry=REGISTRY,
)
OUTPUT_TOKENS = Counter(
    "eagle_synth_worker_output_tokens",
    "Output tokens of the records written (as status' tokens_out counts them).",
    ["server", "campaign"],
    registry=REGISTRY,
)
FAILURES = Counter(
    "eagle_synth_worker_failures",
    "Prompts this worker process recorded as failed, by reason.",
    ["campaign", "reason"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "eagle_synth_worker_request_seconds",
    "Seconds from sending a generation request to its whole answer read (errors included).",
    ["server"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
FIRST_BYTE_SECONDS = Histogram(
    "eagle_synth_worker_time_to_first_byte_seconds",
    "Seconds from sending a generation request to the answer's status line and headers.",
    ["server"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
REQUEST_ERRORS = Counter(
    "eagle_synth_worker_request_errors",
    "Generation requests that got no usable answer, by kind (connection_refused, unauthorized, bad_request, transient, other).",
    ["server", "kind"],
    registry=REGISTRY,
)
SERVER_HEALTH = Gauge(
    "eagle_synth_worker_server_health",
    "1 for the state the health gate has the server in, 0 for the others.",
    ["server", "state"],
    registry=REGISTRY,
)
REFUSALS = Counter(
    "eagle_synth_worker_server_refusals",
    "Times the worker refused a server (preflight, another model than the campaign's, API key refused).",
    ["server"],
    registry=REGISTRY,
)

_enabled = False


def serve(*, port: int, address: str, servers: Iterable[str]) -> None:
    """Serve /metrics on (address, port) from this process and start recording; OSError when the
    port cannot be bound. The listening socket is closed with the process (and not inherited by
    spawned children), so a restarted worker process binds the same port again."""
    global _enabled
    start_http_server(port, addr=address, registry=REGISTRY)
    _enabled = True
    for url in servers:
        server_state(url, UNKNOWN)
        SLOTS.labels(server=url).set(0)
        REQUESTS_INFLIGHT.labels(server=url).set(0)
    log.info("serving Prometheus metrics on http://%s:%d/metrics", address, port)


def enabled() -> bool:
    return _enabled


def request_sent(url: str) -> None:
    if _enabled:
        REQUESTS_INFLIGHT.labels(server=url).inc()


def first_byte(url: str, seconds: float) -> None:
    if _enabled:
        FIRST_BYTE_SECONDS.labels(server=url).observe(seconds)


def request_ended(url: str, seconds: float, error: Exception | None) -> None:
    if not _enabled:
        return
    REQUESTS_INFLIGHT.labels(server=url).dec()
    REQUEST_SECONDS.labels(server=url).observe(seconds)
    if error is not None:
        kind = next((name for cls, name in ERROR_KINDS if isinstance(error, cls)), "other")
        REQUEST_ERRORS.labels(server=url, kind=kind).inc()


def slots(limits: Mapping[str, int]) -> None:
    if _enabled:
        for url, tickets in limits.items():
            SLOTS.labels(server=url).set(tickets)


def records_written(campaign: str, records: Iterable[Record]) -> None:
    """A committed record file's records (written and marked done), counted per server."""
    if not _enabled:
        return
    written: collections.Counter[str] = collections.Counter()
    tokens: collections.Counter[str] = collections.Counter()
    for record in records:
        written[record.server] += 1
        tokens[record.server] += len(record.output_ids)
    for url, count in written.items():
        RECORDS_WRITTEN.labels(server=url, campaign=campaign).inc(count)
        OUTPUT_TOKENS.labels(server=url, campaign=campaign).inc(tokens[url])


def prompt_failed(campaign: str, reason: str, count: int = 1) -> None:
    if _enabled:
        FAILURES.labels(campaign=campaign, reason=reason).inc(count)


def server_state(url: str, state: str) -> None:
    if not _enabled:
        return
    for known in SERVER_STATES:
        SERVER_HEALTH.labels(server=url, state=known).set(1 if known == state else 0)
    if state == REFUSED:
        REFUSALS.labels(server=url).inc()
