"""`eagle-synth flower`, tested as an operator meets it: a real Flower process on a real Redis
with real queued tasks, asked over HTTP with and without credentials.

One redis-server and one Flower serve the module; each test polls with a deadline instead of
sleeping. The worker test points a real worker at a closed port: its health gate keeps it from
consuming, so the queue keeps its length while Flower learns the queue from the worker.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
import redis
import requests
from typer.testing import CliRunner

from eagle_synth.cli.commands import app as cli_app
from eagle_synth.errors import FlowerAuthError
from eagle_synth.payload import TASK_NAME
from eagle_synth.queue import campaign_queue, make_celery, queue_lists
from eagle_synth.settings import DEFAULT_QUEUE, broker_settings
from eagle_synth.state.keys import CAMPAIGNS
from eagle_synth.testing.harness import ManagedProcess, RedisServer, free_port, start_worker, wait_for
from eagle_synth.tools.flower import ENV_BASIC_AUTH, parse_basic_auth, resolve_auth

USER, PASSWORD = "ops", "s3cret-for-tests"
QUEUED = 7
# Seconds Flower gets to start and report; it is up in about one on an idle machine.
DEADLINE_S = 45.0
HTTP_TIMEOUT_S = 5.0
# The CLI in a child process, as the installed `eagle-synth` script runs it.
CLI = [sys.executable, "-c", "from eagle_synth.cli import main; main()"]


@pytest.fixture(scope="module")
def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="eagle-synth-flower-"))


@pytest.fixture(scope="module")
def redis_server(workdir: Path):
    # A password on Redis too, so the test proves Flower gets the full URL from our settings.
    server = RedisServer(workdir=workdir / "redis", password="redis-pw").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def queued(redis_server: RedisServer) -> int:
    settings = broker_settings(redis_url=redis_server.url)
    celery = make_celery(settings)
    for index in range(QUEUED):
        # Flower only counts messages; the payload need not be a valid batch.
        celery.send_task(TASK_NAME, args=[{"dummy": index}], queue=settings.queue, serializer="msgpack")
    return QUEUED


@pytest.fixture(scope="module")
def flower(redis_server: RedisServer, workdir: Path, queued: int):
    port = free_port()
    env = {**os.environ, ENV_BASIC_AUTH: f"{USER}:{PASSWORD}", "PYTHONUNBUFFERED": "1"}
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    process = ManagedProcess(
        args=[*CLI, "flower", "--port", str(port), "--redis", redis_server.url],
        env=env,
        log_path=workdir / "flower.log",
    ).start()
    base = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        if not process.alive():
            raise RuntimeError(f"flower exited:\n{process.log()}")
        try:
            requests.get(f"{base}/healthcheck", timeout=HTTP_TIMEOUT_S)
            return True
        except requests.ConnectionError:
            return False

    wait_for(answering, timeout=DEADLINE_S, what="flower to listen")
    yield base, process
    process.stop(timeout=10)


def _queue_lengths(base: str) -> dict[str, int]:
    response = requests.get(f"{base}/api/queues/length", auth=(USER, PASSWORD), timeout=HTTP_TIMEOUT_S)
    response.raise_for_status()
    return {q["name"]: q["messages"] for q in response.json()["active_queues"]}


def test_queue_length_api_reports_what_redis_holds(flower, redis_server: RedisServer) -> None:
    base, _ = flower
    expected = redis.Redis.from_url(redis_server.url).llen(DEFAULT_QUEUE)  # the reference
    assert expected == QUEUED
    wait_for(
        lambda: _queue_lengths(base).get(DEFAULT_QUEUE) == expected,
        timeout=DEADLINE_S,
        what=f"flower to report {expected} messages",
    )


def test_api_and_pages_refuse_without_or_with_wrong_credentials(flower) -> None:
    base, _ = flower
    for path in ("/api/queues/length", "/api/workers", "/broker", "/"):
        assert requests.get(base + path, timeout=HTTP_TIMEOUT_S).status_code == 401, path
        assert requests.get(base + path, auth=(USER, "wrong"), timeout=HTTP_TIMEOUT_S).status_code == 401, path


def test_metrics_need_credentials_and_only_healthcheck_is_open(flower) -> None:
    base, _ = flower
    assert requests.get(f"{base}/metrics", timeout=HTTP_TIMEOUT_S).status_code == 401
    assert requests.get(f"{base}/metrics", auth=(USER, "wrong"), timeout=HTTP_TIMEOUT_S).status_code == 401
    scraped = requests.get(f"{base}/metrics", auth=(USER, PASSWORD), timeout=HTTP_TIMEOUT_S)
    assert scraped.status_code == 200 and "flower_" in scraped.text
    health = requests.get(f"{base}/healthcheck", timeout=HTTP_TIMEOUT_S)
    assert health.status_code == 200 and health.text == "OK"


def test_broker_page_shows_our_queue(flower) -> None:
    base, _ = flower
    page = requests.get(f"{base}/broker", auth=(USER, PASSWORD), timeout=HTTP_TIMEOUT_S)
    assert page.status_code == 200
    assert DEFAULT_QUEUE in page.text


def test_every_campaigns_queue_is_listed_even_with_no_worker_taking_it(flower, redis_server: RedisServer) -> None:
    """A shared fleet: each campaign has its own queue; Flower lists them all with their backlog."""
    base, _ = flower
    settings = broker_settings(redis_url=redis_server.url)
    queue = campaign_queue(settings.queue, "fleet-a")
    client = redis.Redis.from_url(redis_server.url)
    client.sadd(CAMPAIGNS, "fleet-a")
    celery = make_celery(settings)
    try:
        for index in range(3):
            celery.send_task(TASK_NAME, args=[{"dummy": index}], queue=queue, serializer="msgpack", priority=4)
        wait_for(
            lambda: _queue_lengths(base).get(queue) == 3, timeout=DEADLINE_S, what="flower to list the campaign queue"
        )
        page = requests.get(f"{base}/broker", auth=(USER, PASSWORD), timeout=HTTP_TIMEOUT_S)
        assert queue in page.text
    finally:
        client.delete(*queue_lists(queue))
        client.srem(CAMPAIGNS, "fleet-a")


def test_password_never_on_a_command_line(flower) -> None:
    _, process = flower
    cmdline = Path(f"/proc/{process.proc.pid}/cmdline").read_bytes()
    assert PASSWORD.encode() not in cmdline


def test_a_gated_worker_is_seen_and_the_backlog_stays(flower, redis_server: RedisServer, workdir: Path) -> None:
    base, _ = flower
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: the health gate holds the worker
    worker = start_worker(
        servers=[closed],
        out=workdir / "out",
        redis_url=redis_server.url,
        logdir=workdir,
        concurrency=1,
        name=f"gated{free_port()}@test",
    )
    node = worker.args[worker.args.index("--name") + 1]
    try:

        def seen() -> dict | None:
            if not worker.alive():
                raise RuntimeError(f"worker exited:\n{worker.log()}")
            response = requests.get(
                f"{base}/api/workers", params={"refresh": "1"}, auth=(USER, PASSWORD), timeout=HTTP_TIMEOUT_S
            )
            response.raise_for_status()
            info = response.json().get(node) or {}
            return info if info.get("stats") and info.get("conf") else None

        info = wait_for(seen, timeout=DEADLINE_S, interval=0.5, what="flower to see the worker")
        assert info["conf"]["worker_send_task_events"] is True
        # A gated worker has cancelled its consumer, so it reports no queue; Flower then falls
        # back to the app's task_default_queue, which is why the backlog stays visible.
        assert DEFAULT_QUEUE not in [q["name"] for q in info["active_queues"]]
        assert _queue_lengths(base) == {DEFAULT_QUEUE: QUEUED}
    finally:
        worker.stop(timeout=15)


# Refusals happen before Flower starts, so they run in-process.


def test_cli_refuses_to_start_without_credentials(monkeypatch) -> None:
    monkeypatch.delenv(ENV_BASIC_AUTH, raising=False)
    result = CliRunner().invoke(cli_app, ["flower", "--redis", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 2
    assert "--basic-auth" in result.output and "--no-auth" in result.output


def test_cli_refuses_the_example_placeholder(monkeypatch) -> None:
    monkeypatch.setenv(ENV_BASIC_AUTH, "admin:change-me")
    result = CliRunner().invoke(cli_app, ["flower"])
    assert result.exit_code == 2
    assert "placeholder" in result.output


@pytest.mark.parametrize("raw", ["admin", "admin:", ":pw", ",", "a:b,c"])
def test_malformed_credentials_are_refused(raw: str) -> None:
    with pytest.raises(FlowerAuthError):
        parse_basic_auth(raw)


def test_auth_precedence() -> None:
    env = {ENV_BASIC_AUTH: "env:pw"}
    assert resolve_auth(basic_auth="flag:pw", no_auth=False, environ=env) == ["flag:pw"]
    assert resolve_auth(basic_auth=None, no_auth=False, environ=env) == ["env:pw"]
    assert resolve_auth(basic_auth=None, no_auth=True, environ={}) is None
    assert parse_basic_auth("a:1,b:2") == ["a:1", "b:2"]
    with pytest.raises(FlowerAuthError):
        resolve_auth(basic_auth=None, no_auth=True, environ=env)
