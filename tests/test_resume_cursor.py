"""A rerun skips the rows an earlier run claimed before templating them (producer/resume.py),
and only for the same file and options: anything else is templated and deduplicated as before."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from eagle_synth.sampling import SamplingParams
from eagle_synth.settings import broker_settings
from eagle_synth.testing.harness import wait_for
from producer.enqueue import EnqueueOptions, enqueue
from tests.conftest import chat_rows, write_jsonl
from tests.helpers import campaign, cli, loaded_tokenizer, queued_items, status_json


def _enqueue(path, redis_url: str, tokenizer_path, **options):
    opts = EnqueueOptions(
        inputs=[str(path)],
        campaign="cursor",
        tokenizer=str(tokenizer_path),
        sampling=SamplingParams(max_new_tokens=16, temperature=0.0),
        processes=1,
        **options,
    )
    tokenizer = loaded_tokenizer(opts.tokenizer, trust_remote_code=False, chat_template=None)
    summary = enqueue(opts, broker=broker_settings(redis_url=redis_url), tokenizer=tokenizer)
    assert summary.accounted
    return summary


def test_a_rerun_skips_claimed_rows_before_templating(tmp_path, redis_server, tokenizer_path):
    path = write_jsonl(tmp_path / "rows.jsonl", chat_rows(300))  # more than one templating chunk
    first = _enqueue(path, redis_server.url, tokenizer_path)
    assert (first.rows_enqueued, first.rows_resumed) == (300, 0)
    second = _enqueue(path, redis_server.url, tokenizer_path)
    assert (second.rows_read, second.rows_duplicate, second.rows_resumed, second.prompts_enqueued) == (300, 300, 300, 0)
    assert second.prompts_duplicate == 0  # nothing was templated

    # Other options map rows to other prompts: no cursor applies, the claim deduplicates.
    other = _enqueue(path, redis_server.url, tokenizer_path, turns="all")
    assert other.rows_resumed == 0 and other.rows_read == 300

    # An appended file is another file: templated again, only the new rows enqueued.
    write_jsonl(path, chat_rows(310))
    os.utime(path, ns=(1, 1))
    third = _enqueue(path, redis_server.url, tokenizer_path)
    assert (third.rows_resumed, third.rows_duplicate, third.rows_enqueued) == (0, 300, 10)
    keys = [item.key for item in queued_items(redis_server.url)]
    assert len(keys) == len(set(keys)) == campaign(redis_server.url, "cursor").progress().enqueued


def test_interrupted_then_rerun_counts_rows_as_one_uninterrupted_run(tmp_path, redis_server, tokenizer_path):
    """Ctrl-C half-way, then the same command again: `status` shows the rows read and skipped of
    a run never interrupted (no skip counted twice), and the rerun's summary says how many rows
    it resumed (and how many of them the first run skipped) rather than calling them duplicates."""
    rows: list = []
    for i in range(3000):
        # A bad row every 10: skipped rows all through the file, on both sides of the cut.
        rows.append({"id": f"r{i}", "messages": [] if i % 10 == 3 else [{"role": "user", "content": f"q {i}"}]})
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    base = ["enqueue", str(path), "--tokenizer", str(tokenizer_path), "--redis", redis_server.url]
    base += ["--batch-size", "4", "--processes", "1"]

    whole = json.loads(cli(*base, "--campaign", "whole", "--json").stdout)
    assert (whole["rows_read"], whole["rows_skipped"]) == (3000, 300)
    expected = status_json(redis_server.url, "whole")
    assert (expected["rows_read"], expected["rows_skipped"]) == (3000, 300)

    args = [sys.executable, "-m", "eagle_synth", *base, "--campaign", "cut"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    c = campaign(redis_server.url, "cut")
    wait_for(lambda: c.client.hlen(c.keys.cursors) > 0, timeout=120, what="a first chunk claimed")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()
    first = status_json(redis_server.url, "cut")
    assert 0 < first["rows_read"] < 3000, "the interrupted run's figures: the rows it claimed"
    assert first["rows_skipped"] == sum(1 for i in range(first["rows_read"]) if i % 10 == 3)

    rerun = cli(*base, "--campaign", "cut")
    shown = status_json(redis_server.url, "cut")
    for figure in ("rows_read", "rows_skipped", "skipped_by_reason", "enqueued"):
        assert shown[figure] == expected[figure], figure
    summary = rerun.stdout.decode()
    resumed = first["rows_read"]
    assert f"resumed {resumed} (read by an earlier run, which skipped {first['rows_skipped']} of them" in summary
    # Rows the interrupted run claimed past its last cursor note are duplicates now (their
    # prompts were enqueued by it): every row is read, resumed, enqueued, duplicate or skipped.
    read, enqueued, duplicate, skipped = map(
        int, re.search(r"rows read (\d+) / enqueued (\d+) / duplicate (\d+) / skipped (\d+)", summary).groups()
    )
    assert read == 3000 and enqueued + duplicate + skipped + resumed == read, summary
