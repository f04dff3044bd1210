"""#26.5 A rerun of `enqueue` after a stop: CPU with the per-file cursors against templating again.

Setup: ROWS chat rows enqueued once with `eagle-synth enqueue` into a private Redis (no
workers: the prompts stay pending, as after a stop).

Measurement: the rerun's process-tree CPU seconds (templating processes included), per row.
Ours: the same command again (its cursors skip every row before templating). Baseline: the
same rerun after deleting the campaign's cursors hash, which is what every rerun did before
(template every row, then find each prompt a duplicate when claiming it). Both reruns must
enqueue nothing.
"""

from __future__ import annotations

import sys

from benchmarks.common import Measured, Result, Stack, bench_tokenizer, run_measured, write_rows

ROWS = {True: 20_000, False: 100_000}
NAME = "resume"


def _enqueue(redis_url: str, rows) -> Measured:
    return run_measured(
        [
            sys.executable,
            "-m",
            "eagle_synth",
            "enqueue",
            str(rows),
            "--campaign",
            NAME,
            "--tokenizer",
            str(bench_tokenizer()),
            "--redis",
            redis_url,
            "--json",
        ],
        timeout=3600,
    )


def run(quick: bool) -> list[Result]:
    import json

    from eagle_synth.settings import broker_settings
    from eagle_synth.state.keys import CampaignKeys
    from eagle_synth.state.redis_client import connect

    count = ROWS[quick]
    with Stack("resume") as stack:
        redis = stack.redis()
        rows = write_rows(stack.dir / "rows.jsonl", count, seed=5)
        first = _enqueue(redis.url, rows)
        ours = _enqueue(redis.url, rows)
        connect(broker_settings(redis_url=redis.url)).delete(CampaignKeys(NAME).cursors)
        before = _enqueue(redis.url, rows)
    summaries = [json.loads(m.completed.stdout.decode().splitlines()[-1]) for m in (ours, before)]
    if any(s["prompts_enqueued"] for s in summaries):
        raise RuntimeError(f"a rerun enqueued prompts: {summaries}")
    return [
        Result(
            number=26,
            figure=f"enqueue rerun after a stop, {count:,} rows: CPU per row",
            ours=1e3 * ours.cpu / count,
            baseline=1e3 * before.cpu / count,
            unit="CPU ms/row",
            baseline_name="templating every row again (before: no cursors)",
            target="-",
            met=None,
            note=f"rows resumed by cursor: {summaries[0]['rows_resumed']:,}; wall {ours.wall:.1f} s vs "
            f"{before.wall:.1f} s; first run {first.cpu:.1f} CPU-s; start-up included in both",
        )
    ]
