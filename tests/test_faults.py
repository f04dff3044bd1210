"""Fault tests with real processes: every one ends with each prompt key having exactly one
record or one recorded failure (docs/reliability.md lists them). Those taking `server_api` run
against each kind of server: SGLang's /generate and vLLM's /v1/completions."""

from __future__ import annotations

import signal

from eagle_synth.state.node_state import all_nodes
from eagle_synth.testing.harness import free_port, wait_for
from tests.conftest import chat_rows
from tests.helpers import (
    assert_exactly_once,
    campaign,
    devserver_stats,
    enqueue_rows,
    queued,
    status_json,
    status_now,
    wait_finished,
)

# Short visibility timeout so a SIGKILLed worker's batches come back within the test.
FAST_REDELIVERY = {
    "EAGLE_SYNTH_VISIBILITY_TIMEOUT": "10",
    "EAGLE_SYNTH_RESTORE_INTERVAL": "1",
    "EAGLE_SYNTH_BACKOFF_MAX": "0.5",
}


def test_worker_sigkilled_mid_batch_another_worker_finishes(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "kill", chat_rows(24), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--token-latency", "0.01", "--mean-output-tokens", "60", "--slots", "8")
    out = tmp_path / "out"
    first = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST_REDELIVERY, name="first@test")
    c = campaign(redis_server.url, "kill")

    def busy() -> bool:
        return any(n.get("inflight_by_campaign", {}).get("kill") for n in all_nodes(c.client))

    wait_for(busy, timeout=60, what="a batch in flight")
    first.kill()  # the whole worker, main process and pool, mid-batch
    assert c.progress().done < 24

    stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST_REDELIVERY, name="second@test")
    wait_finished(redis_server.url, "kill", expected=24, stack=stack, timeout=120)
    records = assert_exactly_once(redis_server.url, "kill", out / "kill", expected=24)
    assert c.progress().failed == 0
    assert {r.worker for r in records.values()} >= {"second@test"}


def test_server_down_at_start_then_warming_then_up(tmp_path, redis_server, stack, tokenizer_path, server_api):
    enqueue_rows(tmp_path, redis_server.url, "late", chat_rows(16), tokenizer=tokenizer_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url)
    c = campaign(redis_server.url, "late")

    def state_is(wanted: str, status=status_now):
        workers = status(redis_server.url, "late")["workers"]
        return workers and workers[0]["state"] == wanted and workers[0]["since"]

    wait_for(lambda: state_is("loading"), timeout=60, interval=0.1, what="status to show the server loading")
    assert state_is("loading", status=status_json), "the CLI shows it too (it stays until the server starts)"
    queued_tasks = queued(c.client)
    assert queued_tasks == 2, "no batch may be taken while the server refuses connections"

    if server_api == "sglang":
        stack.devserver("--startup-delay", "2", "--warmup", "3", port=port, wait=False)
        # Warming lasts 3 s: looked at in this process, which a loaded machine cannot make miss it.
        wait_for(lambda: state_is("warming"), timeout=60, interval=0.1, what="status to show the server warming")
        assert queued(c.client) == 2
    else:
        # vLLM listens only once its model is loaded: from refused connections straight to ready.
        stack.devserver("--startup-delay", "3", port=port, wait=False, api="vllm")
    wait_finished(redis_server.url, "late", expected=16, stack=stack, timeout=90)

    stats = devserver_stats(url)
    assert stats["generate_calls_before_healthy"] == 0
    assert c.progress().failed == 0
    assert_exactly_once(redis_server.url, "late", out / "late", expected=16)


def test_injected_500s_and_dropped_connections(tmp_path, redis_server, stack, tokenizer_path, server_api):
    enqueue_rows(tmp_path, redis_server.url, "flaky", chat_rows(40), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver(
        "--fail-rate", "0.2", "--drop-rate", "0.2", "--health-fail-rate", "0.3", "--seed", "3", api=server_api
    )
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST_REDELIVERY)
    wait_finished(redis_server.url, "flaky", expected=40, stack=stack, timeout=180)
    stats = devserver_stats(url)
    assert stats["injected_failures"] + stats["injected_drops"] > 0
    assert campaign(redis_server.url, "flaky").progress().failed == 0
    records = assert_exactly_once(redis_server.url, "flaky", out / "flaky", expected=40)
    assert {r.backend for r in records.values()} == {server_api}


def test_redis_restarted_mid_campaign(tmp_path, stack, tokenizer_path):
    from eagle_synth.testing.harness import RedisServer

    redis_server = RedisServer(workdir=tmp_path / "redis", appendonly=True).start()
    try:
        enqueue_rows(tmp_path, redis_server.url, "rr", chat_rows(32), tokenizer=tokenizer_path, batch_size=4)
        _, url = stack.devserver("--token-latency", "0.005", "--mean-output-tokens", "80")
        out = tmp_path / "out"
        stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST_REDELIVERY)
        c = campaign(redis_server.url, "rr")
        wait_for(lambda: c.progress().done >= 4, timeout=60, what="the first records")
        redis_server.restart()
        wait_finished(redis_server.url, "rr", expected=32, stack=stack, timeout=180)
        assert_exactly_once(redis_server.url, "rr", out / "rr", expected=32)
        assert campaign(redis_server.url, "rr").progress().failed == 0
    finally:
        redis_server.stop()


def test_prompt_over_context_length_inside_a_batch(tmp_path, redis_server, stack, tokenizer_path, server_api):
    rows = chat_rows(7)
    rows.insert(3, {"id": "long", "messages": [{"role": "user", "content": "word " * 400}]})
    enqueue_rows(tmp_path, redis_server.url, "ctx", rows, tokenizer=tokenizer_path, batch_size=8)
    _, url = stack.devserver("--context-length", "300", api=server_api)
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url)
    wait_finished(redis_server.url, "ctx", expected=8, stack=stack)
    c = campaign(redis_server.url, "ctx")
    failures = dict(c.iter_failures())
    assert [f.reason for f in failures.values()] == ["prompt-too-long"]
    assert [f.item["row_id"] for f in failures.values()] == ["long"]
    records = assert_exactly_once(redis_server.url, "ctx", out / "ctx", expected=8)
    assert len(records) == 7


def test_pickle_message_is_rejected_never_run(tmp_path, redis_server, stack, tokenizer_path):
    from eagle_synth.payload import TASK_NAME
    from eagle_synth.queue import campaign_queue, make_celery
    from eagle_synth.settings import DEFAULT_QUEUE, broker_settings

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    # Into the queue of a campaign the worker takes, ahead of its batches (kombu's priority 0 is served first).
    enqueue_rows(tmp_path, redis_server.url, "after", chat_rows(8), tokenizer=tokenizer_path)
    app = make_celery(broker_settings(redis_url=redis_server.url))
    queue = campaign_queue(DEFAULT_QUEUE, "after")
    app.send_task(TASK_NAME, args=[Exploit()], serializer="pickle", queue=queue, priority=0)
    _, url = stack.devserver()
    out = tmp_path / "out"
    worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url)
    c = campaign(redis_server.url, "after")
    wait_for(lambda: "disallowed" in worker.log().lower(), timeout=60, what="the worker to refuse the pickle message")
    # The worker goes on: the campaign behind it completes.
    wait_finished(redis_server.url, "after", expected=8, stack=stack)
    assert not marker.exists()
    assert queued(c.client) == 0
    assert worker.alive()


def test_sigterm_puts_unfinished_batches_back(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "term", chat_rows(8), tokenizer=tokenizer_path, batch_size=4)
    # The first worker's server holds every prompt in prefill for two minutes, so nothing can finish
    # before the SIGTERM however slow the machine; the soft shutdown gives the batches 1 s, then puts
    # them back. A second worker, on a fast server of the same model, then does them all.
    _, slow_url = stack.devserver("--prefill-latency", "120")
    out = tmp_path / "out"
    env = {**FAST_REDELIVERY, "EAGLE_SYNTH_SOFT_SHUTDOWN_TIMEOUT": "1"}
    first = stack.worker(servers=[slow_url], out=out, redis_url=redis_server.url, env=env, name="term1@test")
    c = campaign(redis_server.url, "term")

    def busy() -> bool:
        return any(n.get("inflight_by_campaign", {}).get("term") for n in all_nodes(c.client))

    wait_for(busy, timeout=60, what="batches in flight")
    first.stop(sig=signal.SIGTERM, timeout=60)
    assert c.progress().done == 0
    _, fast_url = stack.devserver()
    stack.worker(servers=[fast_url], out=out, redis_url=redis_server.url, env=env, name="term2@test")
    wait_finished(redis_server.url, "term", expected=8, stack=stack, timeout=120)
    assert_exactly_once(redis_server.url, "term", out / "term", expected=8)
    assert c.progress().failed == 0


def test_server_dies_mid_campaign_and_comes_back(tmp_path, redis_server, stack, tokenizer_path, server_api):
    enqueue_rows(tmp_path, redis_server.url, "dies", chat_rows(32), tokenizer=tokenizer_path, batch_size=4)
    port = free_port()
    first, url = stack.devserver("--die-after", "3", "--token-latency", "0.002", port=port, api=server_api)
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST_REDELIVERY)
    c = campaign(redis_server.url, "dies")
    wait_for(lambda: not first.alive(), timeout=60, what="the server to die")

    def state_is(wanted: str, status=status_now) -> bool:
        workers = status(redis_server.url, "dies")["workers"]
        return bool(workers) and workers[0]["state"] == wanted

    wait_for(lambda: state_is("loading"), timeout=60, interval=0.1, what="status to show the server down")
    assert state_is("loading", status=status_json), "the CLI shows it too (it stays until the server is back)"
    assert c.progress().done < 32
    stack.devserver("--token-latency", "0.002", port=port, api=server_api)
    wait_finished(redis_server.url, "dies", expected=32, stack=stack, timeout=120)
    assert c.progress().failed == 0
    assert_exactly_once(redis_server.url, "dies", out / "dies", expected=32)
