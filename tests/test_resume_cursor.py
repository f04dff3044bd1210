"""A rerun skips the rows an earlier run claimed before templating them (producer/resume.py),
and only for the same file and options: anything else is templated and deduplicated as before."""

from __future__ import annotations

import os

from eagle_synth.sampling import SamplingParams
from eagle_synth.settings import broker_settings
from producer.enqueue import EnqueueOptions, enqueue
from tests.conftest import chat_rows, write_jsonl
from tests.helpers import campaign, loaded_tokenizer, queued_items


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
