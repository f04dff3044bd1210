"""#3 (issue 35) The price of a replica's acknowledgement: worker CPU per record and records/s
with Redis `WAIT` on one replica, against the same worker with no WAIT.

Setup: a redis-server master with one replica (`replicaof`, on this machine: the replica's
round trip is loopback's, so what is measured is the worker's own cost of the WAIT, its one
extra round trip per commit, not a network's), a zero-latency devserver, WARM + MEASURED prompts
enqueued with the real producer per run, one `eagle-synth worker` (--concurrency CONCURRENCY).

Measured as benchmarks/worker_overhead.py does (its `measure_worker`): CPU of the worker's
process tree and records done between WARM and WARM + MEASURED records, in ROUNDS runs of each
kind, interleaved, summed per kind. Ours: the default, which
waits for one replica whenever the master has one (eagle_synth/state/replicas.py). Baseline: the
same with EAGLE_SYNTH_MIN_REPLICAS=0 (no WAIT), in the same run, on the same Redis pair.
"""

from __future__ import annotations

from benchmarks.common import Result, Stack, enqueue_backlog, write_rows
from benchmarks.worker_overhead import CONCURRENCY, MAX_NEW_TOKENS, MEAN_OUTPUT_TOKENS, measure_worker
from eagle_synth.settings import broker_settings
from eagle_synth.state.redis_client import connect
from eagle_synth.state.replicas import connected_replicas
from eagle_synth.testing.harness import wait_for

# Records done before the clock starts, and records measured per run.
WARM = {True: 64, False: 160}
MEASURED = {True: 400, False: 1200}
# Runs of each kind, interleaved (none, wait, wait, none, ...): other jobs on a shared machine
# then weigh on both alike.
ROUNDS = {True: 2, False: 3}
# The two kinds: the environment of each worker run.
KINDS = {"none": {"EAGLE_SYNTH_MIN_REPLICAS": "0"}, "wait": {}}


def _total(runs: list[dict]) -> dict:
    """The runs of one kind together: CPU per record and records/s over all their records."""
    records = sum(r["records"] for r in runs)
    cpu_ms = sum(r["cpu_ms_per_record"] * r["records"] for r in runs)
    seconds = sum(r["records"] / r["records_per_s"] for r in runs)
    return {"records": records, "cpu_ms_per_record": cpu_ms / records, "records_per_s": records / seconds}


def run(quick: bool) -> list[Result]:
    warm, measured = WARM[quick], MEASURED[quick]
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with Stack("replica-wait") as stack:
        master = stack.redis()
        stack.redis(extra_args=("--replicaof", "127.0.0.1", str(master.port)))
        client = connect(broker_settings(redis_url=master.url))
        wait_for(lambda: connected_replicas(client) == 1, timeout=30, what="the replica")
        _, url = stack.devserver("--mean-output-tokens", str(MEAN_OUTPUT_TOKENS))
        order = [kind for round_ in range(ROUNDS[quick]) for kind in (sorted(KINDS, reverse=bool(round_ % 2)))]
        for index, kind in enumerate(order):
            name = f"{kind}-{index}"
            rows = write_rows(stack.dir / f"rows-{name}.jsonl", warm + measured, seed=10 + index)
            enqueue_backlog(master.url, rows, name, max_new_tokens=MAX_NEW_TOKENS)
            runs[kind].append(
                measure_worker(stack, master.url, url, CONCURRENCY, warm, measured, name, env=KINDS[kind])
            )
    wait = _total(runs["wait"])
    none = _total(runs["none"])
    note = (
        f"one replica on loopback; --concurrency {CONCURRENCY}, zero-latency devserver, batch 16, "
        f"{ROUNDS[quick]} interleaved runs of {measured} records each; records/s {wait['records_per_s']:.0f} "
        f"with WAIT vs {none['records_per_s']:.0f} without ({wait['records_per_s'] / none['records_per_s']:.2f}x)"
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
            details={"wait": runs["wait"], "none": runs["none"]},
        )
    ]
