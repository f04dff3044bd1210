"""Fault tests for endings that used to drop a batch: an unwritable output folder, campaign
settings gone from Redis, and an error nobody planned for. Each ends with every prompt key
holding exactly one record or one recorded failure (docs/reliability.md)."""

from __future__ import annotations

from eagle_synth.testing.harness import wait_for
from tests.conftest import chat_rows
from tests.helpers import (
    assert_exactly_once,
    campaign,
    cli,
    devserver_stats,
    enqueue_rows,
    queued,
    status_json,
    status_now,
    wait_finished,
)


def test_unwritable_output_requeues_closes_the_gate_and_resumes_unattended(
    tmp_path, redis_server, stack, tokenizer_path
):
    enqueue_rows(tmp_path, redis_server.url, "disk", chat_rows(12), tokenizer=tokenizer_path, batch_size=4)
    out = tmp_path / "out"
    # A path where the records folder must go that cannot take files: every write fails with
    # an OS error, as on a full or read-only disk.
    blocker = out / "disk" / "records"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")
    _, url = stack.devserver("--token-latency", "0.001")
    stack.worker(servers=[url], out=out, redis_url=redis_server.url)
    c = campaign(redis_server.url, "disk")

    def gate_closed_for_disk(status=status_now) -> bool:
        workers = status(redis_server.url, "disk")["workers"]
        return bool(workers) and bool(workers[0]["disk"]) and not workers[0]["consuming"]

    wait_for(gate_closed_for_disk, timeout=60, interval=0.1, what="the worker to stop for its output folder")
    assert gate_closed_for_disk(status=status_json), "the CLI shows it too (it stays until the disk is freed)"
    progress = c.progress()
    assert (progress.done, progress.failed) == (0, 0)
    assert queued(c.client) >= 1, "the batches went back to the queue"

    blocker.unlink()  # the operator frees the disk; nobody restarts anything
    wait_finished(redis_server.url, "disk", expected=12, stack=stack, timeout=90)
    assert_exactly_once(redis_server.url, "disk", out / "disk", expected=12)
    assert c.progress().failed == 0
    assert not status_json(redis_server.url, "disk")["workers"][0]["disk"]


def test_campaign_settings_gone_from_redis_end_as_replayable_failures(tmp_path, redis_server, stack, tokenizer_path):
    rows = chat_rows(8)
    enqueue_rows(tmp_path, redis_server.url, "evicted", rows, tokenizer=tokenizer_path, batch_size=4)
    c = campaign(redis_server.url, "evicted")
    c.client.delete(c.keys.settings)  # what an evicting Redis does under memory pressure
    out = tmp_path / "out"
    _, url = stack.devserver()
    stack.worker(servers=[url], out=out, redis_url=redis_server.url)
    wait_finished(redis_server.url, "evicted", expected=8, stack=stack)
    assert_exactly_once(redis_server.url, "evicted", out / "evicted", expected=8)
    assert c.failure_counts() == {"campaign-settings-missing": 8}
    assert "enqueue" in next(c.iter_failures())[1].message

    # The way back the message gives: enqueue again (restores the settings), retry the failures.
    enqueue_rows(tmp_path, redis_server.url, "evicted", rows, tokenizer=tokenizer_path, batch_size=4)
    cli("retry-failed", "evicted", "--redis", redis_server.url)
    wait_for(lambda: c.progress().done == 8, timeout=60, interval=0.2, what="the replayed prompts")
    assert_exactly_once(redis_server.url, "evicted", out / "evicted", expected=8)


def test_unexpected_error_is_retried_then_recorded_never_dropped(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "broken", chat_rows(8), tokenizer=tokenizer_path, batch_size=4)
    c = campaign(redis_server.url, "broken")
    c.client.set(c.keys.settings, '{"name": "broken"}')  # corrupt state no code path expects
    out = tmp_path / "out"
    _, url = stack.devserver()
    worker = stack.worker(
        servers=[url], out=out, redis_url=redis_server.url, env={"EAGLE_SYNTH_ERROR_RETRY_DELAY": "0.2"}
    )
    wait_finished(redis_server.url, "broken", expected=8, stack=stack, timeout=90)
    assert_exactly_once(redis_server.url, "broken", out / "broken", expected=8)
    assert c.failure_counts() == {"worker-error": 8}
    # The failure names the error: the stored settings lack a required field.
    assert "ValidationError" in (message := next(c.iter_failures())[1].message) and "tokenizer_path" in message
    assert worker.log().count("unexpected error") >= 2 * 5, "each batch was tried 5 times first"
    assert worker.alive()


def test_malformed_200_replies_never_become_records(
    tmp_path, redis_server, stack, tokenizer_path, tokenizer, server_api
):
    """A server answering 200 with items that are not usable replies (a list of ints, meta_info
    or choices a string, ids as strings or negative, no output ids): each is retried, then
    recorded as `bad-response`; no record is written from one."""
    enqueue_rows(tmp_path, redis_server.url, "junk", chat_rows(12), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--malformed-rate", "0.4", "--seed", "3", api=server_api)
    _, junk_url = stack.devserver("--malformed-rate", "1.0", api=server_api)
    out = tmp_path / "out"
    fast = {"EAGLE_SYNTH_BACKOFF_MAX": "0.05"}
    first = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=fast)
    wait_finished(redis_server.url, "junk", expected=12, stack=stack, timeout=120)
    records = assert_exactly_once(redis_server.url, "junk", out / "junk", expected=12)
    c = campaign(redis_server.url, "junk")
    assert set(c.failure_counts()) <= {"bad-response"}
    assert devserver_stats(url)["injected_malformed"] >= 3
    vocab = len(tokenizer)
    for record in records.values():
        assert record.output_ids and all(0 <= i < vocab for i in record.output_ids)
        assert record.completion_tokens == len(record.output_ids)

    # A server that only ever answers junk: every prompt ends as a recorded bad-response.
    first.stop()
    enqueue_rows(tmp_path, redis_server.url, "alljunk", chat_rows(4), tokenizer=tokenizer_path, batch_size=4)
    stack.worker(servers=[junk_url], out=out, redis_url=redis_server.url, env=fast, name="junk@test")
    wait_finished(redis_server.url, "alljunk", expected=4, stack=stack, timeout=120)
    assert_exactly_once(redis_server.url, "alljunk", out / "alljunk", expected=4)
    assert campaign(redis_server.url, "alljunk").failure_counts() == {"bad-response": 4}
