"""#7 Scaling: records/s with 1, 2 and 4 worker processes against a server with ample slots.

Whether adding worker processes adds throughput, and where this machine's cores run out.
Setup: a devserver with SLOTS slots and zero token latency (it answers as fast as its CPU
allows, so the worker side is the limit); one deep backlog (rows x SAMPLES prompts) enqueued
with the real producer; for each k in PROCESSES, k `eagle-synth worker` processes with
--concurrency CONCURRENCY each, started together, stopped (their batches go back to the
queue) before the next k.

Measurement: records done (campaign `done` count in Redis) over WINDOW seconds after
WARMUP seconds. Besides the rate, the CPU each party used in the window (workers' process
trees, the devserver, redis-server) and the whole machine's busy share (psutil, all
processes, other users included) show where the cores go. Baseline: k = 1; ratio =
rate(k) / rate(1).

Target: near-linear (ratio >= LINEAR_SHARE x k) while the machine has idle CPU; a row
where the machine was at least SATURATED busy says the cores ran out there instead.
"""

from __future__ import annotations

import time

import psutil

from benchmarks.common import (
    Result,
    Stack,
    campaign_progress,
    enqueue_backlog,
    main_cpu_seconds,
    tree_cpu_seconds,
    wait_done,
    write_rows,
)

PROCESSES = (1, 2, 4)
CONCURRENCY = 2
SLOTS = 512
MEAN_OUTPUT_TOKENS = 100
MAX_NEW_TOKENS = 256
# Prompts per templated row (`--n`): a deep backlog for little templating.
SAMPLES = 8
# Records/s per process assumed before any is measured, seconds of consumption outside the
# warm-up and window to allow for (reaching FIRST_RECORDS, stopping), and the backlog's
# margin over what a step is expected to take.
RATE_GUESS = 1500.0
STARTUP_ALLOWANCE = 3.0
BACKLOG_MARGIN = 1.3
WARMUP = {True: 2.0, False: 4.0}
WINDOW = {True: 3.0, False: 10.0}
# Records done by the new workers before the warm-up clock starts (they are importing).
FIRST_RECORDS = 64
START_TIMEOUT = 120.0
# Near-linear: at least this share of k times the one-process rate.
LINEAR_SHARE = 0.8
# Machine busy share at which the cores count as run out.
SATURATED = 0.9


def _machine_busy() -> tuple[float, float]:
    """(busy CPU seconds, total CPU seconds) of the whole machine so far."""
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    total = sum(times)
    return total - idle, total


def _measure(stack: Stack, redis, url: str, devserver_pid: int, k: int, quick: bool) -> dict:
    start_done = campaign_progress(redis.url, "scaling").done
    workers = [stack.worker(servers=[url], redis_url=redis.url, concurrency=CONCURRENCY) for _ in range(k)]
    try:
        wait_done(redis.url, "scaling", start_done + FIRST_RECORDS, timeout=START_TIMEOUT, stack=stack)
        time.sleep(WARMUP[quick])
        pids = [w.proc.pid for w in workers]
        redis_pid = redis.process.proc.pid

        def sample() -> tuple:
            return (
                campaign_progress(redis.url, "scaling").done,
                time.monotonic(),
                sum(tree_cpu_seconds(p) for p in pids),
                main_cpu_seconds(devserver_pid),
                main_cpu_seconds(redis_pid),
                *_machine_busy(),
            )

        before = sample()
        time.sleep(WINDOW[quick])
        after = sample()
        pending = campaign_progress(redis.url, "scaling").pending
    finally:
        for worker in workers:
            worker.stop(timeout=stack.stop_timeout)
    if pending < 16 * CONCURRENCY * k:
        raise RuntimeError(f"the backlog ran dry during k={k} ({pending} left): raise BACKLOG_MARGIN")
    done, wall, workers_cpu, dev_cpu, redis_cpu, busy, total = (a - b for a, b in zip(after, before, strict=True))
    cores = psutil.cpu_count() or 1
    ours = workers_cpu + dev_cpu + redis_cpu
    return {
        "processes": k,
        "records_per_s": done / wall,
        "records": done,
        "workers_cores": workers_cpu / wall,
        "devserver_cores": dev_cpu / wall,
        "redis_cores": redis_cpu / wall,
        "machine_busy": busy / total,
        "machine_cores": cores,
        # CPU the rest of the machine used meanwhile (this harness sleeps; other users' jobs).
        "other_cores": max(0.0, busy / total * cores - ours / wall),
    }


def run(quick: bool) -> list[Result]:
    with Stack("scaling") as stack:
        redis = stack.redis()
        devserver, url = stack.devserver("--slots", str(SLOTS), "--mean-output-tokens", str(MEAN_OUTPUT_TOKENS))
        runs: list[dict] = []
        for k in PROCESSES:
            # Top the backlog up to what k processes could take if they scaled linearly from
            # the previous step (each step's batches in flight at the stop go back to the queue).
            rate = runs[-1]["records_per_s"] * k / runs[-1]["processes"] if runs else RATE_GUESS * k
            needed = rate * (WARMUP[quick] + WINDOW[quick] + STARTUP_ALLOWANCE) * BACKLOG_MARGIN
            pending = campaign_progress(redis.url, "scaling").pending
            if pending < needed:
                rows = int((needed - pending) / SAMPLES) + 1
                enqueue_backlog(
                    redis.url,
                    write_rows(stack.dir / f"rows-{k}.jsonl", rows, seed=100 + k),
                    "scaling",
                    max_new_tokens=MAX_NEW_TOKENS,
                    temperature=0.6,
                    samples=SAMPLES,
                )
            runs.append(_measure(stack, redis, url, devserver.proc.pid, k, quick))
    base = runs[0]["records_per_s"]
    results = []
    for r in runs:
        k = r["processes"]
        ratio = r["records_per_s"] / base
        linear = ratio >= LINEAR_SHARE * k
        saturated = r["machine_busy"] >= SATURATED
        where = (
            f"CPU: workers {r['workers_cores']:.2f}, devserver {r['devserver_cores']:.2f}, "
            f"redis {r['redis_cores']:.2f}, other processes {r['other_cores']:.2f} cores; "
            f"machine {100 * r['machine_busy']:.0f} % busy of "
            f"{r['machine_cores']} cores"
        )
        if k == 1:
            note = f"baseline; {where}"
        elif linear:
            note = f"near-linear; {where}"
        elif saturated:
            note = f"cores ran out (machine >= {100 * SATURATED:.0f} % busy): {where}"
        else:
            note = f"sub-linear with idle CPU left: {where}"
        results.append(
            Result(
                number=7,
                figure=f"scaling: {k} worker process{'es' if k > 1 else ''} x --concurrency {CONCURRENCY}",
                ours=r["records_per_s"],
                baseline=base,
                unit="records/s",
                baseline_name="1 process",
                target="near-linear until the cores run out" if k > 1 else "-",
                met=None if k == 1 else (linear or saturated),
                note=note,
                ratio=ratio,
                details=r,
            )
        )
    return results
