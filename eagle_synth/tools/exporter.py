"""`eagle-synth exporter`: every campaign's figures from Redis as Prometheus metrics.

A custom collector computes them at scrape time with the same `campaign_status` that
`eagle-synth status --json` prints (eagle_synth/tools/status.py), so the board and the command
never disagree; one scan for stranded prompts serves every campaign of a scrape. Redis out of
reach is a scrape with `eagle_synth_exporter_redis_up 0`, not an error page. The workers'
own metrics (per server, per process) are workers/metrics.py's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from eagle_synth.state.campaign import campaign_names
from eagle_synth.state.stranded import stranded_prompts
from eagle_synth.tools.status import campaign_status

log = logging.getLogger("eagle_synth.exporter")

# Gauges of every campaign: (metric name, status --json key, help). ETA is absent while no rate is known.
CAMPAIGN_GAUGES = (
    ("eagle_synth_campaign_enqueued", "enqueued", "Prompts enqueued (distinct keys)."),
    ("eagle_synth_campaign_queued", "queued", "Prompts waiting in the queue (not at a server, not stranded)."),
    ("eagle_synth_campaign_inflight", "inflight", "Prompts at a server now (workers' heartbeats)."),
    ("eagle_synth_campaign_stranded", "stranded", "Prompts held by a worker that died, waiting for a reaper."),
    ("eagle_synth_campaign_done", "done", "Prompts with a record."),
    ("eagle_synth_campaign_failed", "failed", "Prompts with a recorded failure."),
    ("eagle_synth_campaign_finished_ratio", "finished_share", "(done + failed) / enqueued."),
    ("eagle_synth_campaign_records_per_second", "records_per_s", "Records per second over the rate window."),
    ("eagle_synth_campaign_tokens_per_second", "tokens_per_s", "Output tokens per second over the rate window."),
    ("eagle_synth_campaign_eta_seconds", "eta_seconds", "Seconds left at the current rate (absent while none)."),
)
# The exporter's own gauges: whether a scrape could read Redis, and how long it took.
REDIS_UP = "eagle_synth_exporter_redis_up"
SCRAPE_SECONDS = "eagle_synth_exporter_scrape_seconds"
# Counters of every campaign: (metric name without _total, status --json key, help).
CAMPAIGN_COUNTERS = (
    ("eagle_synth_campaign_output_tokens", "tokens_out", "Output tokens of every record written."),
    ("eagle_synth_campaign_input_tokens", "tokens_in", "Prompt tokens of every record written."),
)


class CampaignCollector(Collector):
    """Yields every campaign's gauges and counters, read from Redis through `client` at each
    scrape (campaign_status, as `status --json`), plus `eagle_synth_exporter_redis_up` and the
    seconds the scrape took."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        started = time.monotonic()
        up = GaugeMetricFamily(REDIS_UP, "1 when this scrape could read Redis, else 0.")
        try:
            statuses = list(self._statuses())
        except redis.RedisError as exc:
            log.warning("scrape: cannot read Redis: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families(statuses)
        took = GaugeMetricFamily(SCRAPE_SECONDS, "Seconds this scrape spent reading Redis.")
        took.add_metric([], time.monotonic() - started)
        yield took

    def _statuses(self) -> Iterator[dict]:
        stranded = stranded_prompts(self.client)
        for name in campaign_names(self.client):
            try:
                yield campaign_status(self.client, name, stranded=stranded)
            except KeyError:
                continue  # listed but its settings are gone (deleted by hand): nothing to show


def families(statuses: list[dict]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The metric families of some campaign_status() dicts."""
    kinds: tuple[tuple[type[GaugeMetricFamily] | type[CounterMetricFamily], tuple], ...] = (
        (GaugeMetricFamily, CAMPAIGN_GAUGES),
        (CounterMetricFamily, CAMPAIGN_COUNTERS),
    )
    for family_type, table in kinds:
        for metric, key, words in table:
            family = family_type(metric, words, labels=["campaign"])
            for status in statuses:
                if status[key] is not None:
                    family.add_metric([status["campaign"]], status[key])
            yield family
    yield _by_reason(statuses)


def _by_reason(statuses: list[dict]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "eagle_synth_campaign_failed_by_reason",
        "Prompts with a recorded failure, by reason.",
        labels=["campaign", "reason"],
    )
    for status in statuses:
        for reason, count in sorted(status["failed_by_reason"].items()):
            family.add_metric([status["campaign"], reason], count)
    return family


def start_exporter(*, client: redis.Redis, port: int, address: str) -> None:
    """Serve every campaign's metrics at http://address:port/metrics from a daemon thread; OSError
    when the port cannot be bound."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CampaignCollector(client))
    start_http_server(port, addr=address, registry=registry)
