"""`eagle-synth status` and `campaigns`: the data, the JSON keys and the rendered view, on a real
redis-server holding campaign and worker state written the way producer and workers write it
(Campaign and NodeState), so no worker or server is needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import redis
from rich.console import Console
from typer.testing import CliRunner

from eagle_synth.cli.commands import app as cli_app
from eagle_synth.payload import PromptItem
from eagle_synth.state.campaign import Campaign, CampaignSettings
from eagle_synth.state.keys import PROMPTS_ENQUEUED, ROWS_READ, ROWS_SKIPPED
from eagle_synth.state.node_state import HEALTHY, LOADING, UNHEALTHY, NodeState, ServerState
from eagle_synth.testing.harness import RedisServer, wait_for
from eagle_synth.tools.failures import failure_summary, format_failures
from eagle_synth.tools.status import CAMPAIGN_ROW_KEYS, STATUS_KEYS, WORKER_KEYS, campaign_status, campaigns_overview
from eagle_synth.tools.status_view import format_duration, render_status, watch_status

NAME = "ops-demo"
ENQUEUED, DONE = 40, 12
FAILURES = {"prompt-too-long": 2, "invalid-token-id": 1}
TOKENS_IN, TOKENS_OUT = 12 * 300, 12 * 500
# Prompt tokens the servers had in their prefix cache: a quarter.
CACHED = TOKENS_IN // 4
GPU_A, GPU_B = "http://gpu-a:30000", "http://gpu-b:30000"
CLI = [sys.executable, "-c", "from eagle_synth.cli import main; main()"]


@pytest.fixture(scope="module")
def server():
    redis_server = RedisServer(workdir=Path(tempfile.mkdtemp(prefix="eagle-synth-status-")) / "redis").start()
    yield redis_server
    redis_server.stop()


@pytest.fixture(scope="module")
def client(server: RedisServer) -> redis.Redis:
    client = redis.Redis.from_url(server.url)
    _write_campaign(client)
    _write_workers(client)
    return client


def _write_campaign(client: redis.Redis) -> None:
    campaign = Campaign(client, NAME)
    campaign.register(
        CampaignSettings(
            name=NAME, tokenizer_path="/tok", tokenizer_fingerprint="f", chat_template_hash="h", created_at=time.time()
        )
    )
    keys = [f"k{i:03d}" for i in range(ENQUEUED)]
    # Claimed as the producer claims (its outbox entry cleared as after publishing).
    campaign.outbox.claim("test-run:1", [PromptItem(key=key, row_id="r", sample=0, ids=[1, 2, 3]) for key in keys])
    campaign.outbox.clear("test-run:1")
    campaign.count({ROWS_READ: ENQUEUED + 3, ROWS_SKIPPED: 3, PROMPTS_ENQUEUED: ENQUEUED})
    campaign.count_skipped({"empty-prompt": 2, "too-long": 1})
    # Two completions some time apart, as two batches would land.
    campaign.mark_done(keys[:6], tokens_in=TOKENS_IN // 2, tokens_out=TOKENS_OUT // 2)
    time.sleep(0.05)
    campaign.mark_done(keys[6:DONE], tokens_in=TOKENS_IN // 2, tokens_out=TOKENS_OUT // 2, tokens_cached=CACHED)
    failing = iter(keys[DONE:])
    for reason, count in FAILURES.items():
        for _ in range(count):
            item = PromptItem(key=next(failing), row_id="r", sample=0, ids=[1, 2, 3], source="in.jsonl:1")
            campaign.record_failure(item, reason=reason, message="boom", sampling={}, worker="w1@gpu-a")


def _write_workers(client: redis.Redis) -> None:
    now = time.time()
    first = NodeState(client, "w1@gpu-a")
    first.reset([GPU_A])
    client.hset(first.key, "host", "gpu-a")
    first.publish({GPU_A: ServerState(state=HEALTHY, since=now - 3600, detail="ok")}, consuming=True)
    first.publish_inflight(pid=101, counts={(NAME, GPU_A): 16}, previous={})
    first.publish_inflight(pid=102, counts={(NAME, GPU_A): 8}, previous={})
    second = NodeState(client, "w2@gpu-b")
    second.reset([GPU_B, "http://gpu-b:30001"])
    client.hset(second.key, "host", "gpu-b")
    second.publish(
        {
            GPU_B: ServerState(state=UNHEALTHY, since=now - 300, detail="timeout after 10 s"),
            "http://gpu-b:30001": ServerState(state=LOADING, since=now - 1500, detail="connection refused"),
        },
        consuming=False,
    )


def test_status_figures(client: redis.Redis) -> None:
    data = campaign_status(client, NAME)
    failed = sum(FAILURES.values())
    assert (data["enqueued"], data["done"], data["failed"], data["inflight"]) == (ENQUEUED, DONE, failed, 24)
    assert data["queued"] == ENQUEUED - DONE - failed - 24
    assert data["failed_by_reason"] == FAILURES == data["failures_recorded_by_reason"]
    assert (data["tokens_in"], data["tokens_out"]) == (TOKENS_IN, TOKENS_OUT)
    assert data["cache_hit_share"] == 0.25
    assert (data["rows_read"], data["rows_skipped"]) == (ENQUEUED + 3, 3)
    assert data["skipped_by_reason"] == {"empty-prompt": 2, "too-long": 1}
    assert data["records_per_s"] > 0 and data["tokens_per_s"] > 0 and data["eta_seconds"] > 0
    assert data["finished_share"] == pytest.approx((DONE + failed) / ENQUEUED, abs=1e-4)
    states = {(w["node"], w["host"], w["server"]): w["state"] for w in data["workers"]}
    assert states == {
        ("w1@gpu-a", "gpu-a", GPU_A): HEALTHY,
        ("w2@gpu-b", "gpu-b", GPU_B): UNHEALTHY,
        ("w2@gpu-b", "gpu-b", "http://gpu-b:30001"): LOADING,
    }


def test_counter_names_are_those_running_campaigns_hold(client: redis.Redis) -> None:
    # Pinned: renaming a counter would orphan the counts of campaigns already in Redis.
    held = {field.decode() for field in client.hkeys(Campaign(client, NAME).keys.counters)}
    assert held == {
        "rows-read",
        "rows-skipped",
        "prompts-enqueued",
        "records",
        "tokens-in",
        "tokens-out",
        "tokens-cached",
        "failed-prompt-too-long",
        "failed-invalid-token-id",
    }


def test_status_json_keys(client: redis.Redis) -> None:
    result = CliRunner().invoke(cli_app, ["status", NAME, "--json", "--redis", _url(client)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert list(data) == list(STATUS_KEYS)
    assert data["workers"] and all(list(w) == list(WORKER_KEYS) for w in data["workers"])
    json.dumps(data)  # JSON-ready all the way down


def test_view_shows_everything_listed(client: redis.Redis) -> None:
    console = Console(record=True, width=220, color_system=None)
    render_status(campaign_status(client, NAME), console=console)
    text = console.export_text()
    for label in (
        "enqueued",
        "queued",
        "in flight",
        "done",
        "failed",
        "tokens in",
        "tokens out",
        "prefix cache hits",
        "records/s (60s)",
        "tokens/s (60s)",
        "ETA",
        "failed by reason",
        "workers",
        "host",
        "server",
        "state",
    ):
        assert label in text, label
    for value in (
        f"{TOKENS_IN:,}",
        f"{TOKENS_OUT:,}",
        "prompt-too-long",
        "invalid-token-id",
        "empty-prompt 2",
        "gpu-a",
        "gpu-b",
        GPU_A,
        GPU_B,
        HEALTHY,
        UNHEALTHY,
        LOADING,
        "timeout after 10 s",
        "25.0%",
    ):
        assert value in text, value
    # Since when: the unhealthy server for 5 minutes, the loading one for 25, with the clock time.
    unhealthy_row = next(line for line in text.splitlines() if GPU_B in line)
    assert "300s" not in unhealthy_row and "5m (since " in unhealthy_row
    assert "25m (since " in next(line for line in text.splitlines() if "gpu-b:30001" in line)


# Everything the view shows that wraps nowhere: it must be whole at any width.
UNBREAKABLE = (
    "enqueued",
    "queued",
    "in flight",
    "stranded",
    "done",
    "failed",
    "tokens in",
    "records/s (60s)",
    "ETA",
    "failed by reason",
    "workers",
    f"{TOKENS_IN:,}",
    f"{TOKENS_OUT:,}",
    "prompt-too-long",
    "empty-prompt 2",
    "w1@gpu-a",
    "w2@gpu-b",
    GPU_A,
    GPU_B,
    "http://gpu-b:30001",
    HEALTHY,
    UNHEALTHY,
    LOADING,
)


def _assert_fits(text: str, width: int) -> None:
    assert "…" not in text, text  # no header or value cut short
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width, text
    for value in UNBREAKABLE:
        assert value in text, (value, text)


@pytest.mark.parametrize("width", [80, 60, 120])
def test_view_fits_narrow_consoles(client: redis.Redis, width: int) -> None:
    console = Console(record=True, width=width, color_system=None)
    render_status(campaign_status(client, NAME), console=console)
    text = console.export_text()
    _assert_fits(text, width)
    if width == 80:  # the workers as blocks, one line per node, its servers below
        assert "w2@gpu-b on gpu-b: last heartbeat" in text and "taking batches no" in text


def test_status_piped_is_80_columns_and_whole(server: RedisServer, client: redis.Redis) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    result = subprocess.run(
        [*CLI, "status", NAME, "--redis", server.url], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    _assert_fits(result.stdout, 80)


def test_several_campaigns_fit_80x24_a_line_each(client: redis.Redis) -> None:
    """`status A B ... --watch` on a shared fleet: a dozen campaigns, one line each, and why a
    server does not take one, inside an 80x24 terminal."""
    from eagle_synth.state.node_state import NodeRouting
    from eagle_synth.tools.status_view import FleetView

    names = [f"fleet-{i:02d}-{'x' * (i % 7)}" for i in range(12)]
    for name in names:
        Campaign(client, name).register(
            CampaignSettings(name=name, tokenizer_path="/m/tok", tokenizer_fingerprint="f", chat_template_hash="h")
        )
    node = NodeState(client, "w3@gpu-c")
    node.reset([GPU_A])
    line = "not sending campaign 'fleet-00-' to server http://gpu-a:30000: it serves /m/other, whose tokenizer does not match"
    why = {names[0]: {GPU_A: line}}
    node.publish(
        {GPU_A: ServerState(state=HEALTHY)}, consuming=True, routing=NodeRouting(campaigns=names[1:], not_served=why)
    )
    rows = [campaign_status(client, name) for name in names]
    console = Console(record=True, width=80, height=24, color_system=None)
    console.print(FleetView(rows, footer="every 2s; Ctrl-C to stop"))
    lines = console.export_text().splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 80, "\n".join(lines)
    assert all(any(line.lstrip().startswith(name) for line in lines) for name in names)
    assert rows[1]["serving"] == ["w3@gpu-c"] and rows[0]["serving"] == []
    assert any(
        line.startswith("fleet-00-: not taken by http://gpu-a:30000") and "another model" in line for line in lines
    )
    for name in names:
        client.srem("eagle-synth:campaigns", name)
    client.delete(node.key)
    client.zrem("eagle-synth:workers", "w3@gpu-c")


def test_campaigns_lists_progress(client: redis.Redis) -> None:
    rows = campaigns_overview(client)
    assert [r["campaign"] for r in rows] == [NAME]
    assert set(CAMPAIGN_ROW_KEYS) <= set(rows[0])
    result = CliRunner().invoke(cli_app, ["campaigns", "--json", "--redis", _url(client)])
    assert result.exit_code == 0, result.output
    assert [r["campaign"] for r in json.loads(result.output)] == [NAME]


def test_failed_groups_by_reason_most_first(client: redis.Redis) -> None:
    report = failure_summary(Campaign(client, NAME), examples=1)
    assert report["failed"] == sum(FAILURES.values())
    assert {r: g["count"] for r, g in report["by_reason"].items()} == FAILURES
    lines = format_failures(report, limit=1)
    assert lines[0] == f"{sum(FAILURES.values())} failed prompts in {NAME}"
    assert lines[1] == "  prompt-too-long: 2" and lines[3] == "  invalid-token-id: 1"
    assert len(lines) == 5 and lines[2].endswith("(in.jsonl:1): boom")  # one example per reason
    result = CliRunner().invoke(cli_app, ["failed", NAME, "--limit", "1", "--redis", _url(client)])
    assert result.exit_code == 0 and result.output.splitlines() == lines


def test_watch_survives_a_redis_outage() -> None:
    # Its own Redis, stopped between two refreshes, as a Redis restart would look.
    outage = RedisServer(workdir=Path(tempfile.mkdtemp(prefix="eagle-synth-status-outage-")) / "redis").start()
    try:
        client = redis.Redis.from_url(outage.url, socket_connect_timeout=1)
        _write_campaign(client)
        _write_workers(client)
        console = Console(record=True, width=220, color_system=None)
        watch_status(
            client, NAME, interval=0, as_json=False, console=console, refreshes=2, sleep=lambda _: outage.stop()
        )
        text = console.export_text()
    finally:
        outage.stop()
    assert "Redis not answering" in text and "figures below are from" in text
    assert "w1@gpu-a" in text and "Ctrl-C to stop" in text  # the last good view stays on screen


def test_watch_json_streams_lines_until_interrupted(server: RedisServer, client: redis.Redis) -> None:
    proc = subprocess.Popen(
        [*CLI, "status", NAME, "--watch", "--json", "--interval", "0.2", "--redis", server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert all(json.loads(line)["campaign"] == NAME for line in lines)
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: proc.poll() is not None, timeout=15, what="status --watch to stop on Ctrl-C")
        assert proc.returncode == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "seconds, shown", [(None, "-"), (5, "5s"), (600, "10m"), (3 * 3600 + 300, "3h05m"), (3 * 86400 + 4 * 3600, "3d04h")]
)
def test_format_duration(seconds, shown) -> None:
    assert format_duration(seconds) == shown


def _url(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/0"
