"""#26.6 Worker RSS over a long run: flat after warm-up with malloc arenas capped.

Setup: one private Redis, one zero-latency devserver (short answers), a backlog of RECORDS
prompts (rows enqueued with --n samples each, so templating stays cheap), one worker at its
default batch threads.

Measurement: the worker process tree's RSS sampled every second with the campaign's done
count; RSS at WARM_SHARE of the records (after warm-up) against RSS at the end. Run twice, the
worker as shipped (glibc arenas capped: workers/memory.py) and with EAGLE_SYNTH_MALLOC_ARENAS=0
(glibc's default arenas, what the worker did before), each on its own campaign. The full size
(1M) runs the shipped setting only: the second run would double its 30+ minutes.
"""

from __future__ import annotations

import threading
import time

from benchmarks.common import Result, Stack, campaign_progress, enqueue_backlog, tree_rss, wait_done, write_rows

RECORDS = {True: 100_000, False: 1_000_000}
SAMPLES_PER_ROW = 20
WARM_SHARE = 0.2
GROWTH_TARGET = 1.1
RUN_TIMEOUT = 3600.0


def _one(stack: Stack, url: str, redis_url: str, name: str, records: int, env: dict[str, str]) -> dict:
    rows = write_rows(stack.dir / f"{name}.jsonl", records // SAMPLES_PER_ROW, seed=26)
    # Enqueued while the worker drains: the producer's backlog cap (200k prompts) would stop a
    # 1M backlog enqueued beforehand.
    producer = threading.Thread(
        target=enqueue_backlog,
        args=(redis_url, rows, name),
        kwargs={"max_new_tokens": 64, "samples": SAMPLES_PER_ROW},
        daemon=True,
    )
    import os

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        worker = stack.worker(servers=[url], redis_url=redis_url, concurrency=128)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    samples: list[tuple[int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                samples.append((campaign_progress(redis_url, name).done, tree_rss(worker.proc.pid)))
            except (OSError, ValueError, ConnectionError):  # a sample lost to a race is skipped
                pass
            stop.wait(1.0)

    thread = threading.Thread(target=sample, daemon=True)
    producer.start()
    thread.start()
    started = time.perf_counter()
    try:
        wait_done(redis_url, name, records, timeout=RUN_TIMEOUT, stack=stack)
    finally:
        stop.set()
        thread.join()
        producer.join(timeout=60)
    wall = time.perf_counter() - started
    worker.stop(timeout=stack.stop_timeout)
    if not samples:
        raise RuntimeError("no RSS sample was taken")
    warm = next((rss for done, rss in samples if done >= WARM_SHARE * records), samples[-1][1])
    end = max(rss for done, rss in samples if done >= 0.9 * records) if samples else 0
    return {"warm": warm, "end": end, "peak": max(rss for _, rss in samples), "wall": wall, "samples": samples}


def run(quick: bool) -> list[Result]:
    records = RECORDS[quick]
    with Stack("worker-memory") as stack:
        redis = stack.redis()
        _, url = stack.devserver("--mean-output-tokens", "32")
        capped = _one(stack, url, redis.url, "capped", records, {})
        runs = [("arenas capped, batch threads started up front (as shipped)", capped)]
        if quick:
            default = _one(stack, url, redis.url, "default", records, {"EAGLE_SYNTH_MALLOC_ARENAS": "0"})
            runs.append(("glibc default arenas", default))
    rows = []
    for label, run_ in runs:
        rows.append(
            Result(
                number=26,
                figure=f"worker RSS growth after warm-up, {records:,} records, {label}",
                ours=run_["end"] / 2**20,
                baseline=run_["warm"] / 2**20,
                unit="MiB",
                baseline_name=f"RSS at {WARM_SHARE:.0%} of the records",
                target=f"<= {GROWTH_TARGET}x" if run_ is capped else "-",
                met=(run_["end"] <= GROWTH_TARGET * run_["warm"]) if run_ is capped else None,
                note=f"peak {run_['peak'] / 2**20:.0f} MiB; wall {run_['wall']:.0f} s; default batch threads (128)",
                details={"samples": run_["samples"][:: max(1, len(run_["samples"]) // 50)]},
            )
        )
    return rows
