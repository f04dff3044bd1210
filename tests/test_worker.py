"""Worker behaviour with real processes: preflight, request safety, redelivery, auth, servers."""

from __future__ import annotations

import time

import pytest
import requests

from eagle_synth.payload import PromptItem, TaskPayload
from eagle_synth.queue import make_celery
from eagle_synth.settings import broker_settings
from eagle_synth.state.campaign import Campaign
from eagle_synth.state.node_state import HEALTHY, ServerState
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import RedisServer, free_port, wait_for
from tests.conftest import chat_rows
from tests.helpers import (
    assert_exactly_once,
    campaign,
    cli,
    devserver_stats,
    enqueue_rows,
    queued,
    status_json,
    wait_finished,
)


def _publish(redis_url: str, name: str, items: list[PromptItem], sampling: dict) -> None:
    from producer.publisher import Publisher

    settings = broker_settings(redis_url=redis_url)
    c = Campaign(connect(settings), name)
    Publisher(
        campaign=c, app=make_celery(settings), queue=settings.queue, sampling=sampling, batch_size=len(items)
    ).claim(items)


def test_out_of_vocabulary_id_is_never_sent(tmp_path, redis_server, stack, tokenizer_path, tokenizer):
    enqueue_rows(tmp_path, redis_server.url, "oov", chat_rows(3), tokenizer=tokenizer_path)
    c = campaign(redis_server.url, "oov")
    vocab = c.settings().vocab_size
    good = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)[
        "input_ids"
    ]
    items = [
        PromptItem(key="a" * 32, row_id="bad", sample=0, ids=good[:3] + [vocab] + good[3:], source="x:1"),
        PromptItem(key="b" * 32, row_id="good", sample=0, ids=good, source="x:2"),
    ]
    _publish(redis_server.url, "oov", items, {"max_new_tokens": 32, "temperature": 0.0})
    process, url = stack.devserver()
    stack.worker(servers=[url], out=tmp_path / "out", redis_url=redis_server.url)
    wait_finished(redis_server.url, "oov", expected=5, stack=stack)
    failures = dict(c.iter_failures())
    assert {k: f.reason for k, f in failures.items()} == {"a" * 32: "invalid-token-id"}
    # The server is alive: the id that would have killed it was never sent.
    assert process.alive()
    assert requests.get(f"{url}/health", timeout=10).status_code == 200
    assert devserver_stats(url)["prompts"] == 4
    assert_exactly_once(redis_server.url, "oov", tmp_path / "out" / "oov", expected=5)


def test_redelivered_batch_with_records_is_not_generated_again(tmp_path, redis_server, stack, tokenizer_path):
    summary = enqueue_rows(tmp_path, redis_server.url, "again", chat_rows(8), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver()
    out = tmp_path / "out"
    worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url)
    wait_finished(redis_server.url, "again", expected=8, stack=stack)
    prompts_before = devserver_stats(url)["prompts"]
    files_before = sorted((out / "again" / "records").iterdir())

    # Publish the very same batches again, as a redelivery would.
    from eagle_synth.payload import TaskPayload, batch_id
    from eagle_synth.queue import send_payload
    from tests.helpers import records_by_key

    settings = broker_settings(redis_url=redis_server.url)
    c = Campaign(connect(settings), "again")
    items = [
        PromptItem(key=r.key, row_id=r.id, sample=r.sample, ids=r.prompt_ids, source=r.source)
        for r in records_by_key(out / "again").values()
    ]
    app, sampling = make_celery(settings), c.settings().sampling
    for start in range(0, 8, 4):
        batch = items[start : start + 4]
        payload = TaskPayload(campaign="again", batch=batch_id([i.key for i in batch]), sampling=sampling, items=batch)
        send_payload(app, settings.queue, payload.encode())
    wait_for(lambda: queued(c.client) == 0, timeout=30, what="the copies to be taken")
    wait_for(lambda: worker.log().count("4 already done") >= 2, timeout=30, what="the copies to be skipped")
    assert devserver_stats(url)["prompts"] == prompts_before
    assert sorted((out / "again" / "records").iterdir()) == files_before
    assert summary.prompts_enqueued == 8


def test_server_400_fails_only_the_bad_prompt(request, tmp_path, redis_server, stack, tokenizer_path, tokenizer):
    """With the context length unknown to the worker, the server answers the long prompt's own
    request with 400: that prompt fails, its batch-mates are written."""
    from workers.batch import BatchRunner
    from workers.config import WorkerConfig

    enqueue_rows(tmp_path, redis_server.url, "iso", chat_rows(1), tokenizer=tokenizer_path)
    _, url = stack.devserver("--context-length", "200")
    client = connect(broker_settings(redis_url=redis_server.url))
    ids = [
        tokenizer.apply_chat_template([{"role": "user", "content": f"q {i}"}], add_generation_prompt=True)["input_ids"]
        for i in range(6)
    ]
    ids[4] = ids[4] + [tokenizer.convert_tokens_to_ids("hello")] * 300
    items = [PromptItem(key=f"{i:032x}", row_id=str(i), sample=0, ids=x, source=f"f:{i}") for i, x in enumerate(ids)]
    runner = BatchRunner(
        config=WorkerConfig(servers=(url,), out=tmp_path / "out"),
        node="test@here",
        broker=broker_settings(redis_url=redis_server.url),
    )
    request.addfinalizer(runner.pool.close)
    # What the health gate would publish (workers/servers/fleet.py).
    runner.fleet.publish({url: ServerState(state=HEALTHY, since=time.time(), context_length=None, backend="sglang")})
    outcome = runner.run(
        TaskPayload(campaign="iso", batch="b1", sampling={"max_new_tokens": 16, "temperature": 0.0}, items=items)
    )
    assert outcome.written == 5
    assert outcome.failed == {"prompt-too-long": 1}
    failure = dict(Campaign(client, "iso").iter_failures())[f"{4:032x}"]
    assert "context length" in failure.message
    assert devserver_stats(url)["client_errors"] >= 1


def test_server_refusing_the_sampling_parameters_fails_the_batch_as_a_campaign_error(
    request, tmp_path, redis_server, stack, tokenizer_path, tokenizer
):
    """A 400 about the sampling parameters is the campaign's, not one prompt's: the batch's open
    prompts are recorded as bad-sampling-params at once, without a request each."""
    from workers.batch import BatchRunner
    from workers.config import WorkerConfig

    enqueue_rows(tmp_path, redis_server.url, "badsp", chat_rows(1), tokenizer=tokenizer_path)
    _, url = stack.devserver()
    client = connect(broker_settings(redis_url=redis_server.url))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)["input_ids"]
    items = [PromptItem(key=f"{i:032x}", row_id=str(i), sample=0, ids=ids + [i + 10]) for i in range(40)]
    runner = BatchRunner(
        config=WorkerConfig(servers=(url,), out=tmp_path / "out", inflight=2),
        node="sp@here",
        broker=broker_settings(redis_url=redis_server.url),
    )
    request.addfinalizer(runner.pool.close)
    runner.fleet.publish({url: ServerState(state=HEALTHY, since=time.time(), backend="sglang")})
    # `seed` is not an SGLang sampling key (it is `sampling_seed`): the server refuses it.
    outcome = runner.run(
        TaskPayload(campaign="badsp", batch="b1", sampling={"max_new_tokens": 8, "seed": 1}, items=items)
    )
    assert outcome.written == 0
    assert outcome.failed == {"bad-sampling-params": 40}
    assert "seed" in next(Campaign(client, "badsp").iter_failures())[1].message
    assert devserver_stats(url)["client_errors"] <= 4, "the rest were withdrawn, not sent"


def test_preflight_refuses_a_server_with_a_reasoning_parser(tmp_path, redis_server, stack):
    _, url = stack.devserver("--reasoning-parser", "deepseek-r1")
    result = cli(
        "worker", "--server", url, "--out", str(tmp_path / "out"), "--redis", redis_server.url, check=False, timeout=60
    )
    assert result.returncode != 0
    message = result.stderr.decode()
    assert "reasoning parser" in message and "--allow-server-parsers" in message


def test_allow_server_parsers_overrides_preflight(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "parsers", chat_rows(4), tokenizer=tokenizer_path)
    _, url = stack.devserver("--tool-call-parser", "qwen25")
    stack.worker(servers=[url], out=tmp_path / "out", redis_url=redis_server.url, args=["--allow-server-parsers"])
    wait_finished(redis_server.url, "parsers", expected=4, stack=stack)
    c = campaign(redis_server.url, "parsers")
    servers = c.servers()
    assert servers[url]["launch_args"]["tool_call_parser"] == "qwen25"
    assert servers[url]["version"]


def test_two_servers_one_dead_the_other_does_the_work(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "two", chat_rows(12), tokenizer=tokenizer_path, batch_size=3)
    _, alive = stack.devserver()
    dead = f"http://127.0.0.1:{free_port()}"
    stack.worker(servers=[dead, alive], out=tmp_path / "out", redis_url=redis_server.url)
    wait_finished(redis_server.url, "two", expected=12, stack=stack)
    states = {w["server"]: w["state"] for w in status_json(redis_server.url, "two")["workers"]}
    assert states == {dead: "loading", alive: "healthy"}
    records = assert_exactly_once(redis_server.url, "two", tmp_path / "out" / "two", expected=12)
    assert {r.server for r in records.values()} == {alive}


def test_old_sglang_prefix_bug_is_repaired(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "prefix", chat_rows(6), tokenizer=tokenizer_path)
    _, buggy = stack.devserver("--prefix-bug", "3")
    _, clean = stack.devserver()
    stack.worker(servers=[buggy], out=tmp_path / "out", redis_url=redis_server.url)
    wait_finished(redis_server.url, "prefix", expected=6, stack=stack)
    records = assert_exactly_once(redis_server.url, "prefix", tmp_path / "out" / "prefix", expected=6)
    for record in records.values():
        expected = requests.post(
            f"{clean}/generate", json={"input_ids": record.prompt_ids, "sampling_params": record.sampling}, timeout=30
        ).json()
        assert record.output_ids == expected["output_ids"]
        assert record.repaired_prefix == 3
    assert status_json(redis_server.url, "prefix")["repaired_prefix"] == 6


@pytest.mark.parametrize("auth", ["password", "acl-user"])
def test_redis_with_password_or_acl_user(tmp_path, stack, tokenizer_path, auth):
    if auth == "password":
        server = RedisServer(workdir=tmp_path / "redis", password="s3cret-pw").start()
        url = server.url
    else:
        server = RedisServer(workdir=tmp_path / "redis", password="admin-pw", acl_user=("eagle", "eagle-pw")).start()
        url = f"redis://eagle:eagle-pw@127.0.0.1:{server.port}/0"
    try:
        enqueue_rows(tmp_path, url, "auth", chat_rows(4), tokenizer=tokenizer_path)
        _, dev = stack.devserver()
        stack.worker(servers=[dev], out=tmp_path / "out", redis_url=url)
        wait_finished(url, "auth", expected=4, stack=stack)
        assert status_json(url, "auth")["done"] == 4
        wrong = cli("status", "auth", "--redis", f"redis://127.0.0.1:{server.port}/0", check=False)
        assert wrong.returncode != 0
    finally:
        server.stop()


def test_failed_and_retry_failed(tmp_path, redis_server, stack, tokenizer_path):
    rows = chat_rows(4)
    rows.append({"id": "long", "messages": [{"role": "user", "content": "word " * 400}]})
    enqueue_rows(tmp_path, redis_server.url, "retry", rows, tokenizer=tokenizer_path)
    process, url = stack.devserver("--context-length", "300")
    worker = stack.worker(servers=[url], out=tmp_path / "out", redis_url=redis_server.url)
    wait_finished(redis_server.url, "retry", expected=5, stack=stack)
    listing = cli("failed", "retry", "--json", "--redis", redis_server.url).stdout
    import json

    data = json.loads(listing)
    assert data["failed"] == 1 and list(data["by_reason"]) == ["prompt-too-long"]
    assert data["by_reason"]["prompt-too-long"]["prompts"][0]["id"] == "long"

    # A bigger server comes up; the failed prompt is replayed and now succeeds.
    worker.stop()
    process.stop()
    _, big = stack.devserver("--context-length", "4096")
    stack.worker(servers=[big], out=tmp_path / "out", redis_url=redis_server.url)
    out = cli("retry-failed", "retry", "--reason", "prompt-too-long", "--redis", redis_server.url).stdout.decode()
    assert "re-enqueued 1" in out
    c = campaign(redis_server.url, "retry")
    wait_for(lambda: c.progress().done == 5, timeout=60, what="the replayed prompt")
    assert c.progress().failed == 0
    assert_exactly_once(redis_server.url, "retry", tmp_path / "out" / "retry", expected=5)


def test_redis_over_tls(tmp_path, stack, tokenizer_path, monkeypatch):
    server = RedisServer(workdir=tmp_path / "redis", tls=True, password="tls-pw").start()
    monkeypatch.setenv("EAGLE_SYNTH_REDIS_CA", str(server.ca_file))
    try:
        assert server.url.startswith("rediss://")
        enqueue_rows(tmp_path, server.url, "tls", chat_rows(4), tokenizer=tokenizer_path)
        _, dev = stack.devserver()
        stack.worker(servers=[dev], out=tmp_path / "out", redis_url=server.url)
        wait_finished(server.url, "tls", expected=4, stack=stack)
        assert status_json(server.url, "tls")["done"] == 4
        # Without the CA the certificate is not trusted: a clear error, not a hang.
        monkeypatch.delenv("EAGLE_SYNTH_REDIS_CA")
        untrusted = cli("status", "tls", "--redis", server.url, check=False, timeout=60)
        assert untrusted.returncode != 0
    finally:
        server.stop()


def test_stale_temporary_files_are_removed(tmp_path):
    import os

    from eagle_synth.records import STALE_TEMPORARY_SECONDS, remove_stale_temporaries

    folder = tmp_path / "c" / "records"
    folder.mkdir(parents=True)
    old, fresh, record = folder / ".tmp-old.zst", folder / ".tmp-new.zst", folder / "b-1.zst"
    for path in (old, fresh, record):
        path.write_bytes(b"x")
    past = time.time() - STALE_TEMPORARY_SECONDS - 10
    os.utime(old, (past, past))
    os.utime(record, (past, past))
    assert remove_stale_temporaries(tmp_path / "c") == 1
    assert not old.exists() and fresh.exists() and record.exists()


def test_retried_batch_adopts_files_a_crashed_attempt_left(
    request, tmp_path, redis_server, stack, tokenizer_path, tokenizer
):
    """A crash between writing a record file and marking its keys done: the redelivered batch
    adopts the file instead of generating again."""
    from workers.batch import BatchRunner
    from workers.config import WorkerConfig

    enqueue_rows(tmp_path, redis_server.url, "adopt", chat_rows(1), tokenizer=tokenizer_path)
    _, url = stack.devserver()
    client = connect(broker_settings(redis_url=redis_server.url))
    ids = [
        tokenizer.apply_chat_template([{"role": "user", "content": f"q {i}"}], add_generation_prompt=True)["input_ids"]
        for i in range(4)
    ]
    items = [PromptItem(key=f"{i:032x}", row_id=str(i), sample=0, ids=x) for i, x in enumerate(ids)]
    payload = TaskPayload(
        campaign="adopt", batch="b1", sampling={"max_new_tokens": 16, "temperature": 0.0}, items=items
    )
    runner = BatchRunner(
        config=WorkerConfig(servers=(url,), out=tmp_path / "out"),
        node="t@here",
        broker=broker_settings(redis_url=redis_server.url),
    )
    request.addfinalizer(runner.pool.close)
    runner.fleet.publish({url: ServerState(state=HEALTHY, since=time.time(), backend="sglang")})
    assert runner.run(payload).written == 4
    c = Campaign(client, "adopt")
    client.srem(c.keys.done, *[i.key for i in items])  # the crash: file renamed, keys not marked
    prompts = devserver_stats(url)["prompts"]

    outcome = runner.run(payload)  # a fresh copy (a failover forgot the mark and the ack) adopts too
    assert (outcome.adopted, outcome.written) == (4, 0)
    assert devserver_stats(url)["prompts"] == prompts
    assert c.progress().done == 4
    assert len(list((tmp_path / "out" / "adopt" / "records").glob("b1-*"))) == 1
