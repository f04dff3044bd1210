"""Prometheus metrics: a real Prometheus (Debian's `prometheus`) scrapes a live campaign's worker
(`--metrics-port`) and `eagle-synth exporter`, and PromQL gives what `status --json` says; the
worker's metrics port survives a crashed worker process; the Grafana dashboard's structure and
its PromQL's metric names; the docs list every metric."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import sys
from pathlib import Path

import psutil
import pytest
import redis
import requests

from eagle_synth.errors import ConfigError
from eagle_synth.testing.harness import ManagedProcess, free_port, listening, start_on_a_port, wait_for
from eagle_synth.tools.exporter import REDIS_UP, SCRAPE_SECONDS, CampaignCollector, families
from tests.conftest import chat_rows
from tests.helpers import cli, enqueue_rows, status_json, wait_finished
from workers import metrics
from workers.config import WorkerConfig

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "grafana" / "eagle-synth.json"
# Seconds between Prometheus' scrapes in the test (a campaign here lasts seconds, not days).
SCRAPE_INTERVAL = "1s"
# Seconds PromQL may take to catch up with the campaign's end (a few scrapes).
CATCH_UP_TIMEOUT = 60.0
# Dashboard panels whose every query must return data on the finished campaign (the others chart
# request errors and refusals, which it has none of).
PANELS_WITH_DATA = (
    "Done",
    "Prompts by state",
    "Records/s (workers)",
    "Output tokens/s per server",
    "In flight and slots per server",
    "Request latency per server",
    "Time to first byte per server",
    "Servers by health state",
    "Exporter",
    "Failures by reason",
)
# A metric name in a PromQL expression.
METRIC_NAME = re.compile(r"\beagle_synth_[a-z_]+\b")
# The devserver's context length in the live campaign (the chat rows fit, one long row does not).
CONTEXT_LENGTH = 1024
# Grafana's panel width: 24 grid columns.
GRID_COLUMNS = 24


def exported_series() -> set[str]:
    """Every series name the worker and the exporter can expose."""
    names = {REDIS_UP, SCRAPE_SECONDS}
    for family in [*metrics.REGISTRY.collect(), *families([])]:
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


class Prometheus:
    """A real Prometheus on a free port scraping `targets` (job name: [host:port]) every second."""

    def __init__(self, folder: Path, targets: dict[str, list[str]]) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed: apt-get install prometheus (`make test` does)"
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: {json.dumps(hosts)}\n"
            for job, hosts in targets.items()
        )
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\nscrape_configs:\n{jobs}")

        def launch(port: int) -> ManagedProcess:
            argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}"]
            argv.append(f"--web.listen-address=127.0.0.1:{port}")
            return ManagedProcess(argv, {}, folder / f"prometheus-{port}.log").start()

        self.process, port = start_on_a_port(launch, port=0, what="prometheus")
        self.url = f"http://127.0.0.1:{port}"

    def query(self, promql: str) -> list[dict]:
        """The instant vector PromQL `promql` gives now; AssertionError naming the query if refused."""
        reply = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10).json()
        assert reply["status"] == "success", f"{promql}: {reply}"
        return reply["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The single value of `promql` now (None while it has none)."""
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None


def start_exporter(stack, redis_url: str) -> tuple[ManagedProcess, int]:
    def launch(port: int) -> ManagedProcess:
        argv = [sys.executable, "-m", "eagle_synth", "exporter", "--port", str(port), "--address", "127.0.0.1"]
        return ManagedProcess([*argv, "--redis", redis_url], {}, stack.logdir / "exporter.log").start()

    process, port = start_on_a_port(launch, port=0, what="exporter")
    stack.others.append(process)
    return process, port


def test_prometheus_scraping_a_live_campaign_agrees_with_status(tmp_path, redis_server, stack, tokenizer_path):
    rows = 40
    # One prompt over the server's context length: the worker records it failed without sending it.
    too_long = {"id": "too-long", "messages": [{"role": "user", "content": "word " * CONTEXT_LENGTH}]}
    enqueue_rows(tmp_path, redis_server.url, "watched", [*chat_rows(rows - 1), too_long], tokenizer=tokenizer_path)
    _, url = stack.devserver("--context-length", str(CONTEXT_LENGTH))
    worker_port = free_port()
    stack.worker(servers=[url], redis_url=redis_server.url, args=("--metrics-port", str(worker_port)))
    _, exporter_port = start_exporter(stack, redis_server.url)
    prometheus = Prometheus(
        tmp_path / "prometheus",
        {"workers": [f"127.0.0.1:{worker_port}"], "exporter": [f"127.0.0.1:{exporter_port}"]},
    )
    stack.others.append(prometheus.process)
    wait_finished(redis_server.url, "watched", expected=rows, stack=stack)
    status = status_json(redis_server.url, "watched")
    assert status["done"] == rows - 1 and status["tokens_out"] > 0
    assert status["failed_by_reason"] == {"prompt-too-long": 1}
    expected = {
        'sum(eagle_synth_campaign_done{campaign="watched"})': status["done"],
        'sum(eagle_synth_campaign_output_tokens_total{campaign="watched"})': status["tokens_out"],
        'sum(eagle_synth_campaign_queued{campaign="watched"})': 0,
        'sum(eagle_synth_campaign_failed{campaign="watched"})': 1,
        'eagle_synth_campaign_failed_by_reason{campaign="watched", reason="prompt-too-long"}': 1,
        # The worker's own counts of what it wrote and failed, summed over its servers.
        'sum(eagle_synth_worker_records_written_total{campaign="watched"})': status["done"],
        'sum(eagle_synth_worker_output_tokens_total{campaign="watched"})': status["tokens_out"],
        'eagle_synth_worker_failures_total{campaign="watched", reason="prompt-too-long"}': 1,
        f'eagle_synth_worker_server_health{{server="{url}", state="healthy"}}': 1,
        "min(up)": 1,
    }

    def agreed() -> bool:
        return all(prometheus.value(promql) == value for promql, value in expected.items())

    try:
        wait_for(agreed, timeout=CATCH_UP_TIMEOUT, interval=0.5, what="PromQL to agree with status --json")
    except TimeoutError:
        seen = {promql: prometheus.value(promql) for promql in expected}
        raise AssertionError(f"PromQL {seen}, expected {expected}\n{stack.logs()}") from None
    # Every request answered was timed, and the slots are the server's tickets.
    assert prometheus.value("sum(eagle_synth_worker_request_seconds_count)") >= rows - 1
    assert prometheus.value("sum(eagle_synth_worker_time_to_first_byte_seconds_count)") >= rows - 1
    assert prometheus.value(f'eagle_synth_worker_slots{{server="{url}"}}') > 0

    # The dashboard's every query is valid PromQL (query() asserts it), and its main panels show this
    # campaign once rate() has two samples of the worker's counters.
    def panels_without_data() -> list[str]:
        return [
            f"{title}: {promql}"
            for title, promql in dashboard_targets()
            if title in PANELS_WITH_DATA and not prometheus.query(promql.replace("$campaign", "watched"))
        ]

    try:
        wait_for(lambda: not panels_without_data(), timeout=CATCH_UP_TIMEOUT, interval=0.5, what="the dashboard's data")
    except TimeoutError:
        raise AssertionError(f"panels without data: {panels_without_data()}") from None


def test_metrics_port_serves_again_after_the_worker_process_crashes(tmp_path, redis_server, stack):
    _, url = stack.devserver()
    dead = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    worker = stack.worker(servers=[url, dead], redis_url=redis_server.url, args=("--metrics-port", str(port)))
    assert worker.proc is not None
    supervisor = psutil.Process(worker.proc.pid)

    def serving_child() -> int | None:
        """The pid of the supervisor's Celery process once it serves /metrics with both servers' states."""
        children = supervisor.children()
        if not children or not listening(children[0].pid, port):
            return None
        try:
            page = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except requests.ConnectionError:  # the process just ended (killed below)
            return None
        states = (f'{{server="{url}",state="healthy"}} 1.0', f'{{server="{dead}",state="loading"}} 1.0')
        return children[0].pid if all(f"eagle_synth_worker_server_health{state}" in page for state in states) else None

    first = wait_for(serving_child, timeout=60, what="the worker's metrics")
    psutil.Process(first).send_signal(signal.SIGKILL)
    second = wait_for(lambda: (pid := serving_child()) != first and pid, timeout=60, what="metrics after a restart")
    assert second != first and worker.alive()
    # A second worker on the same port is told at once, in one line, before it starts anything.
    taken = cli("worker", "--server", url, "--out", str(tmp_path / "out2"), "--redis", redis_server.url,
                "--metrics-port", str(port), check=False, timeout=60)  # fmt: skip
    assert taken.returncode == 2
    assert taken.stderr.decode().strip().splitlines() == [
        f"error: --metrics-port {port}: cannot listen on 0.0.0.0: Address already in use"
    ]


def test_exporter_refuses_a_taken_port_and_an_unreachable_redis_in_one_line(redis_server) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = cli(
            "exporter", "--port", str(port), "--address", "127.0.0.1", "--redis", redis_server.url, check=False
        )
    assert result.returncode == 2
    assert result.stderr.decode().strip().splitlines() == [
        f"error: --port {port}: cannot listen on 127.0.0.1: Address already in use"
    ]
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    result = cli("exporter", "--port", str(free_port()), "--address", "127.0.0.1", "--redis", nowhere, check=False)
    assert result.returncode == 2
    (line,) = result.stderr.decode().strip().splitlines()
    assert line.startswith("error: cannot reach Redis")


def test_exporter_says_redis_is_unreachable_in_a_metric_not_an_error_page() -> None:
    unreachable = redis.Redis(port=free_port(), socket_connect_timeout=1)
    (family,) = CampaignCollector(unreachable).collect()
    assert family.name == REDIS_UP and [sample.value for sample in family.samples] == [0]


def test_metrics_port_must_be_a_port() -> None:
    with pytest.raises(ConfigError, match="metrics_port 70000: must be a TCP port"):
        WorkerConfig.load(servers=("http://127.0.0.1:1",), metrics_port=70000)
    assert WorkerConfig.load(servers=("http://127.0.0.1:1",)).metrics_port is None  # off by default


def test_dashboard_structure_and_metric_names() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert set(METRIC_NAME.findall(variables["campaign"]["definition"])) <= exported_series()
    panels = dashboard["panels"]
    assert len(panels) >= len(PANELS_WITH_DATA)
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    titles = {p["title"] for p in panels}
    assert set(PANELS_WITH_DATA) <= titles
    for panel in panels:
        assert panel["type"] in ("stat", "timeseries", "table", "gauge"), panel["title"]
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "xywh") and grid["x"] + grid["w"] <= GRID_COLUMNS
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    # Every metric a query names is one the code exports (a renamed metric fails here).
    for title, promql in dashboard_targets():
        named = set(METRIC_NAME.findall(promql))
        assert named, f"panel {title!r}: {promql} names no eagle-synth metric"
        assert named <= exported_series(), f"panel {title!r} names {sorted(named - exported_series())}"


def test_operations_doc_lists_every_metric() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    families_named = {
        f.name + ("_total" if f.type == "counter" else "") for f in [*metrics.REGISTRY.collect(), *families([])]
    }
    missing = sorted(name for name in families_named | {REDIS_UP, SCRAPE_SECONDS} if f"`{name}`" not in doc)
    assert not missing, f"docs/operations.md does not list {missing}"
