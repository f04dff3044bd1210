"""#34 Routing cost: worker CPU per record with 8 campaign queues against 1.

A shared fleet gives every campaign its own queue, split into one Redis list per priority
level (eagle_synth/queue.py), and the worker's health gate learns which campaigns its servers
serve (workers/servers/routing.py). What does that cost a record? Setup: one zero-latency devserver,
one `eagle-synth worker` (--concurrency CONCURRENCY); the same number of prompts either as one
campaign (1 queue: 10 Redis lists per BRPOP) or as CAMPAIGNS campaigns of the same model, all
queued at once, of mixed priorities (80 lists per BRPOP, every campaign routed and checked).

Measurement (as #3, worker overhead): CPU of the worker's whole process tree between WARM
records done and WARM + MEASURED done over all campaigns, per record. Baseline: the one-queue
run, in the same stack and run, right before. Ratio = many queues / one queue; target: within
noise (<= TARGET_RATIO).
"""

from __future__ import annotations

from benchmarks.common import (
    Result,
    Stack,
    enqueue_backlog,
    write_rows,
)
from benchmarks.worker_overhead import (
    CONCURRENCY,
    MAX_NEW_TOKENS,
    MEAN_OUTPUT_TOKENS,
    MEASURED,
    WARM,
    measure_worker,
)

# Campaign queues of the many-queue run. Concurrency, warm-up, records measured (over all
# campaigns), output lengths and time limit are benchmark #3's.
CAMPAIGNS = 8
# Most the many-queue run may use per record, as a multiple of the one-queue run's CPU:
# the benchmark's run-to-run noise on 2 cores is about 5-10 % (BENCHMARKS.md, #3's two runs).
TARGET_RATIO = 1.1


def run(quick: bool) -> list[Result]:
    warm, measured = WARM[quick], MEASURED[quick]
    total = warm + measured
    with Stack("routing") as stack:
        redis = stack.redis()
        _, url = stack.devserver("--mean-output-tokens", str(MEAN_OUTPUT_TOKENS))
        enqueue_backlog(
            redis.url, write_rows(stack.dir / "one.jsonl", total, seed=7), "one", max_new_tokens=MAX_NEW_TOKENS
        )
        one = measure_worker(stack, redis.url, url, CONCURRENCY, warm, measured, "one")
        names = [f"many-{index}" for index in range(CAMPAIGNS)]
        for index, name in enumerate(names):
            rows = write_rows(stack.dir / f"{name}.jsonl", -(-total // CAMPAIGNS), seed=100 + index)
            enqueue_backlog(redis.url, rows, name, max_new_tokens=MAX_NEW_TOKENS, priority=3 + index % 4)
        many = measure_worker(stack, redis.url, url, CONCURRENCY, warm, measured, names)
    ratio = many["cpu_ms_per_record"] / one["cpu_ms_per_record"]
    return [
        Result(
            number=34,
            figure=f"worker CPU per record, {CAMPAIGNS} campaign queues",
            ours=many["cpu_ms_per_record"],
            baseline=one["cpu_ms_per_record"],
            unit="CPU ms/record",
            baseline_name="the same worker and prompts, one campaign queue",
            target=f"<= {TARGET_RATIO}x one queue",
            met=ratio <= TARGET_RATIO,
            note=(
                f"--concurrency {CONCURRENCY}, zero-latency devserver, {many['records']} records; {CAMPAIGNS} campaigns "
                f"of priorities 3-6 queued at once ({CAMPAIGNS * 10} Redis lists per fetch) against one (10 lists); "
                f"{many['records_per_s']:.0f} against {one['records_per_s']:.0f} rec/s"
            ),
            details={"one": one, "many": many},
        )
    ]
