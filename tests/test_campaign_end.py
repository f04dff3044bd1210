"""A campaign's end (`eagle-synth close`), with a real Redis, worker and devserver: its Redis state
folds into its folder, and a rerun of `enqueue` or `retry-failed` afterwards stays exact."""

from __future__ import annotations

import json

from eagle_synth.state.campaign_archive import STATE_FILE
from eagle_synth.testing.harness import wait_for
from tests.conftest import chat_rows
from tests.helpers import assert_exactly_once, campaign, cli, enqueue_rows, status_json, wait_finished


def _close(redis_url: str, name: str, out, *, check: bool = True):
    return cli("close", name, "--out", str(out), "--redis", redis_url, check=check)


def test_close_refuses_an_incomplete_campaign(tmp_path, redis_server, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "busy", chat_rows(3), tokenizer=tokenizer_path)
    refused = _close(redis_server.url, "busy", tmp_path / "out", check=False)
    assert refused.returncode == 2
    assert "is not complete: 3 of 3 prompts are still pending" in refused.stderr.decode()
    c = campaign(redis_server.url, "busy")
    assert c.client.scard(c.keys.enqueued) == 3 and not c.client.exists(c.keys.ended)


def test_close_then_rerun_and_retry_stay_exact(tmp_path, redis_server, stack, tokenizer_path):
    url, out = redis_server.url, tmp_path / "out"
    rows = chat_rows(6)
    rows.append({"id": "long", "messages": [{"role": "user", "content": "word " * 400}]})
    enqueue_rows(tmp_path, url, "fold", rows, tokenizer=tokenizer_path)
    process, small = stack.devserver("--context-length", "300")
    worker = stack.worker(servers=[small], out=out, redis_url=url)
    wait_finished(url, "fold", expected=7, stack=stack)

    # Records somewhere else than where close runs: refused, nothing freed.
    elsewhere = _close(url, "fold", tmp_path / "elsewhere", check=False)
    assert elsewhere.returncode == 2 and "6 prompts of 'fold' are done" in elsewhere.stderr.decode()
    c = campaign(url, "fold")
    assert c.client.scard(c.keys.done) == 6

    closed = _close(url, "fold", out).stdout.decode()
    assert "6 done and 1 failed keys folded" in closed
    assert (out / "fold" / STATE_FILE).is_file()
    assert not any(c.client.exists(key) for key in (c.keys.enqueued, c.keys.done, c.keys.failed))
    assert c.client.exists(c.keys.ended) and c.settings() is not None
    assert c.progress().counters["records"] == 6  # the counters stay for `status`
    closed_status = status_json(url, "fold")
    assert closed_status["ended"]["done"] == 6
    # The figures are the totals it ended with, not the emptied sets' zeros.
    assert (closed_status["enqueued"], closed_status["done"], closed_status["failed"]) == (7, 6, 1)
    assert (closed_status["queued"], closed_status["finished_share"]) == (0, 1.0)
    shown = cli("status", "fold", "--redis", url).stdout.decode()
    assert "100.0% finished, closed" in shown
    listed = cli("campaigns", "--redis", url).stdout.decode()
    assert "100.0%  done 6  failed 1" in listed and "closed" in listed
    assert "closed: 1 failures are folded" in cli("failed", "fold", "--redis", url).stdout.decode()

    # A rerun of the campaign's enqueue on the same rows: the state comes back (said in one
    # line), nothing is new.
    rerun_args = ["enqueue", str(tmp_path / "fold.jsonl"), "--campaign", "fold", "--tokenizer", str(tokenizer_path)]
    rerun_args += ["--redis", url, "--batch-size", "8", "--max-new-tokens", "64", "--temperature", "0", "--json"]
    rerun_run = cli(*rerun_args)
    rerun = json.loads(rerun_run.stdout)
    said = [line for line in rerun_run.stderr.decode().splitlines() if "reopened" in line]
    assert len(said) == 1 and "6 done and 1 failed keys read back" in said[0], rerun_run.stderr
    assert (rerun["rows_read"], rerun["rows_enqueued"], rerun["prompts_enqueued"]) == (7, 0, 0)
    assert not c.client.exists(c.keys.ended)
    assert (c.progress().enqueued, c.client.scard(c.keys.done), c.progress().failed) == (7, 6, 1)

    # Closed again, then the failure is retried on a bigger server: read back and replayed.
    _close(url, "fold", out)
    worker.stop()
    process.stop()
    _, big = stack.devserver("--context-length", "4096")
    stack.worker(servers=[big], out=out, redis_url=url)
    retried = cli("retry-failed", "fold", "--redis", url).stdout.decode()
    assert "re-enqueued 1 failed" in retried
    wait_for(lambda: c.progress().done == 7, timeout=60, what="the retried prompt")
    assert_exactly_once(url, "fold", out / "fold", expected=7)

    # The end: every key folded, Redis holds only the settings, counters and marker.
    assert "7 done and 0 failed" in _close(url, "fold", out).stdout.decode()
    left = [key.decode() for key in c.client.scan_iter(match="eagle-synth:campaign:fold:*")]
    assert c.keys.enqueued not in left and c.keys.done not in left and c.keys.ended in left
