"""#3 (issue 35) The price of a replica's acknowledgement: worker CPU per record and records/s
with Redis `WAIT` on one replica, against the same worker with no WAIT.

Setup: a redis-server master with one replica (`replicaof`, on this machine: the replica's
round trip is loopback's, so what is measured is the worker's own cost of the WAIT, its one
extra round trip per commit, not a network's), a zero-latency devserver, WARM + MEASURED prompts
enqueued with the real producer per run, one `eagle-synth worker` (--concurrency CONCURRENCY).

Measured as benchmarks/worker_overhead.py does (its `measure_worker`): CPU of the worker's
process tree and records done between WARM and WARM + MEASURED records. Ours: the default, which
waits for one replica whenever the master has one (eagle_synth/state/replicas.py). Baseline: the
same with EAGLE_SYNTH_MIN_REPLICAS=0 (no WAIT), in the same run, on the same Redis pair.
"""

from __future__ import annotations

from benchmarks.common import Result, Stack, enqueue_backlog, write_rows
from benchmarks.worker_overhead import CONCURRENCY, MAX_NEW_TOKENS, MEAN_OUTPUT_TOKENS, measure_worker
from eagle_synth.harness import wait_for
from eagle_synth.settings import broker_settings
from eagle_synth.state.redis_client import connect
from eagle_synth.state.replicas import connected_replicas

# Records done before the clock starts, and records measured (kept short: two runs).
WARM = {True: 96, False: 160}
MEASURED = {True: 800, False: 2400}


def run(quick: bool) -> list[Result]:
    warm, measured = WARM[quick], MEASURED[quick]
    with Stack("replica-wait") as stack:
        master = stack.redis()
        stack.redis(extra_args=("--replicaof", "127.0.0.1", str(master.port)))
        client = connect(broker_settings(redis_url=master.url))
        wait_for(lambda: connected_replicas(client) == 1, timeout=30, what="the replica")
        _, url = stack.devserver("--mean-output-tokens", str(MEAN_OUTPUT_TOKENS))
        runs = {}
        for seed, (label, env) in enumerate((("none", {"EAGLE_SYNTH_MIN_REPLICAS": "0"}), ("wait", {}))):
            rows = write_rows(stack.dir / f"rows-{label}.jsonl", warm + measured, seed=10 + seed)
            enqueue_backlog(master.url, rows, label, max_new_tokens=MAX_NEW_TOKENS)
            runs[label] = measure_worker(stack, master.url, url, CONCURRENCY, warm, measured, label, env=env)
    wait, none = runs["wait"], runs["none"]
    note = (
        f"one replica on loopback; --concurrency {CONCURRENCY}, zero-latency devserver, batch 16, "
        f"{wait['records']} records each; records/s {wait['records_per_s']:.0f} with WAIT vs "
        f"{none['records_per_s']:.0f} without ({wait['records_per_s'] / none['records_per_s']:.2f}x)"
    )
    return [
        Result(
            number=3,
            figure="worker CPU per record, WAIT on one replica",
            ours=wait["cpu_ms_per_record"],
            baseline=none["cpu_ms_per_record"],
            unit="CPU ms/record",
            baseline_name="the same worker with EAGLE_SYNTH_MIN_REPLICAS=0 (no WAIT)",
            target="-",
            met=None,
            note=note,
            details={"wait": wait, "none": none},
        )
    ]
