"""#1 Server slot occupancy: how full the worker keeps the server, against a direct client.

GPU hours are what a campaign costs, so the figure is the share of slot-time the server
spends generating. Setup: a devserver with SLOTS running slots, TOKEN_LATENCY seconds per
output token and MEAN_OUTPUT_TOKENS tokens per answer (so a prompt holds a slot ~0.5 s and
the server finishes ~64 prompts/s); a deep backlog enqueued with the real producer BEFORE
the worker starts; one `eagle-synth worker` with default settings (inflight 256 / batch 16 =
the default in-flight budget).

Measurement: after the first /generate and WARMUP seconds, /dev/reset_stats, wait WINDOW
seconds, read /dev/stats: occupancy = busy_slot_seconds / (SLOTS x window). The backlog is
checked to still be non-empty at the end, so the window is steady state.

Baseline (the ceiling): a fresh identical devserver driven by an aiohttp client that keeps
the same number of single-prompt /generate requests in flight, with the same prompts and
sampling parameters, measured the same way. Ratio = ours / ceiling.

If the default worker misses the target, the same measurement is repeated with
ALTERNATIVE_CONCURRENCY batch threads to show which setting reaches it.
"""

from __future__ import annotations

import asyncio
import itertools
import time

from benchmarks.common import (
    Result,
    Stack,
    campaign_progress,
    dev_stats,
    enqueue_backlog,
    queued_payloads,
    reset_stats,
    tree_cpu_seconds,
    tree_pss,
    wait_for,
    write_rows,
)
from workers.config import DEFAULT_INFLIGHT, default_concurrency

SLOTS = 32
TOKEN_LATENCY = 0.005
MEAN_OUTPUT_TOKENS = 100
# Cap on generated tokens: far above the mean, so almost every answer ends naturally.
MAX_NEW_TOKENS = 512
# Seconds after the first /generate before the window opens (pool start, first batches).
WARMUP = {True: 3.0, False: 8.0}
# Seconds of the measured window.
WINDOW = {True: 5.0, False: 20.0}
# Prompts finished per second at full occupancy, and the backlog margin over the run.
SERVER_RATE = SLOTS / (TOKEN_LATENCY * MEAN_OUTPUT_TOKENS)
BACKLOG_MARGIN = 1.6
# Seconds to wait for the worker's first /generate (process start, imports, health gate).
FIRST_GENERATE_TIMEOUT = 90.0
# Pool size tried when the default misses the target: one per core-ish, each with a batch.
ALTERNATIVE_CONCURRENCY = 4
# Seconds between samples of the running count during the window.
SAMPLE_EVERY = 0.1
TARGET_OCCUPANCY = 0.95
TARGET_RATIO = 0.95


def _devserver_args() -> tuple[str, ...]:
    return (
        "--slots",
        str(SLOTS),
        "--token-latency",
        str(TOKEN_LATENCY),
        "--mean-output-tokens",
        str(MEAN_OUTPUT_TOKENS),
    )


def _window(url: str, window: float) -> dict:
    """Reset the counters, wait `window` s, return the stats with `window` = the real span.

    busy_slot_seconds counts a prompt's whole stay when it leaves its slot, so prompts
    straddling the window's edges blur it a little; the running count sampled every
    SAMPLE_EVERY seconds (`sampled_occupancy`) is a cross-check free of that effect.
    """
    reset_stats(url)
    start = dev_stats(url)["uptime"]
    samples: list[int] = []
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        samples.append(dev_stats(url)["running"])
        time.sleep(min(SAMPLE_EVERY, max(0.0, deadline - time.monotonic())))
    stats = dev_stats(url)
    stats["window"] = stats["uptime"] - start
    stats["occupancy"] = stats["busy_slot_seconds"] / (stats["slots"] * stats["window"])
    stats["sampled_occupancy"] = sum(samples) / (len(samples) * stats["slots"])
    return stats


def _queued_prompts(redis_url: str) -> list[tuple[list[int], dict]]:
    """(ids, sampling_params) of every queued prompt, exactly as a worker would send them."""
    prompts = []
    for payload in queued_payloads(redis_url):
        for item in payload.items:
            prompts.append((item.ids, payload.sampling_for(item).as_map()))
    return prompts


def measure_worker(quick: bool, concurrency: int) -> tuple[dict, list[tuple[list[int], dict]]]:
    """Occupancy a worker with `concurrency` batch threads reaches; returns (stats + CPU,
    the queued prompts, for the ceiling client to send the same ones)."""
    backlog = int(SERVER_RATE * (WARMUP[quick] + WINDOW[quick]) * BACKLOG_MARGIN) + 200
    with Stack("occupancy") as stack:
        redis = stack.redis()
        _, url = stack.devserver(*_devserver_args())
        rows = write_rows(stack.dir / "rows.jsonl", backlog, seed=1)
        summary = enqueue_backlog(redis.url, rows, "occupancy", max_new_tokens=MAX_NEW_TOKENS)
        prompts = _queued_prompts(redis.url)
        worker = stack.worker(servers=[url], redis_url=redis.url, concurrency=concurrency)
        wait_for(
            lambda: dev_stats(url)["first_generate_at"] or not worker.alive(),
            timeout=FIRST_GENERATE_TIMEOUT,
            what="the worker's first /generate",
        )
        if not worker.alive():
            raise RuntimeError(f"worker exited:\n{stack.logs()}")
        time.sleep(WARMUP[quick])
        cpu_before = tree_cpu_seconds(worker.proc.pid)
        stats = _window(url, WINDOW[quick])
        cpu = tree_cpu_seconds(worker.proc.pid) - cpu_before
        pss = tree_pss(worker.proc.pid)
        pending = campaign_progress(redis.url, "occupancy").pending
        if pending <= SLOTS:
            raise RuntimeError(f"the backlog drained during the window ({pending} left): raise BACKLOG_MARGIN")
        return {
            "occupancy": stats["occupancy"],
            "sampled_occupancy": stats["sampled_occupancy"],
            "window_s": round(stats["window"], 2),
            "prompts_per_s": stats["prompts"] / stats["window"],
            "server_waiting_at_end": stats["waiting"],
            "worker_cpu_cores": cpu / stats["window"],
            "worker_pss_mib": pss / 2**20,
            "concurrency": concurrency,
            "backlog": summary["prompts_enqueued"],
        }, prompts


async def _drive(
    url: str, prompts: list[tuple[list[int], dict]], concurrency: int, warmup: float, window: float
) -> dict:
    """Keep `concurrency` single-prompt requests in flight; measure the window like the worker's."""
    import aiohttp

    cycle = itertools.cycle(prompts)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) as session:

        async def client() -> None:
            while True:
                ids, sampling = next(cycle)
                async with session.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": sampling}) as r:
                    await r.read()

        tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
        try:
            await asyncio.sleep(warmup)
            # The window's HTTP calls are blocking on purpose: they are few and short.
            return await asyncio.to_thread(_window, url, window)
        finally:
            for task in tasks:
                task.cancel()
            ended = await asyncio.gather(*tasks, return_exceptions=True)
            # A client that died of its own error would leave the ceiling silently low: say it.
            if failed := [e for e in ended if isinstance(e, Exception) and not isinstance(e, asyncio.CancelledError)]:
                raise RuntimeError(f"the ceiling client failed: {failed[0]!r}")


def measure_ceiling(quick: bool, concurrency: int, prompts: list[tuple[list[int], dict]]) -> dict:
    """Occupancy of the direct asyncio client on a fresh identical devserver."""
    with Stack("occupancy-ceiling") as stack:
        _, url = stack.devserver(*_devserver_args())
        stats = asyncio.run(_drive(url, prompts, concurrency, WARMUP[quick], WINDOW[quick]))
        return {
            "occupancy": stats["occupancy"],
            "sampled_occupancy": stats["sampled_occupancy"],
            "window_s": round(stats["window"], 2),
            "prompts_per_s": stats["prompts"] / stats["window"],
            "concurrency": concurrency,
        }


def run(quick: bool) -> list[Result]:
    concurrency = default_concurrency(inflight=DEFAULT_INFLIGHT, servers=1)
    ours, prompts = measure_worker(quick, concurrency)
    ceiling = measure_ceiling(quick, DEFAULT_INFLIGHT, prompts)
    ratio = ours["occupancy"] / ceiling["occupancy"]
    met = ours["occupancy"] >= TARGET_OCCUPANCY and ratio >= TARGET_RATIO
    setup = (
        f"S={SLOTS}, {TOKEN_LATENCY * 1000:g} ms/token, mean {MEAN_OUTPUT_TOKENS} tokens, "
        f"window {ours['window_s']:.0f} s"
    )
    note = (
        f"{setup}; running count sampled every {SAMPLE_EVERY:g} s: ours {100 * ours['sampled_occupancy']:.1f} %, "
        f"ceiling {100 * ceiling['sampled_occupancy']:.1f} %; default worker = {concurrency} batch threads "
        f"used {ours['worker_cpu_cores']:.2f} cores, "
        f"PSS {ours['worker_pss_mib']:.0f} MiB; ceiling: aiohttp, {DEFAULT_INFLIGHT} requests in flight"
    )
    details = {"ours": ours, "ceiling": ceiling}
    results = [
        Result(
            number=1,
            figure="slot occupancy, default worker",
            ours=100 * ours["occupancy"],
            baseline=100 * ceiling["occupancy"],
            unit="% slot-time",
            baseline_name="direct asyncio client (ceiling)",
            target=">= 95 %, >= 0.95 x ceiling",
            met=met,
            note=note,
            details=details,
        )
    ]
    if not met:
        alt, _ = measure_worker(quick, ALTERNATIVE_CONCURRENCY)
        alt_ratio = alt["occupancy"] / ceiling["occupancy"]
        results.append(
            Result(
                number=1,
                figure=f"slot occupancy, --concurrency {ALTERNATIVE_CONCURRENCY}",
                ours=100 * alt["occupancy"],
                baseline=100 * ceiling["occupancy"],
                unit="% slot-time",
                baseline_name="direct asyncio client (ceiling)",
                target=">= 95 %, >= 0.95 x ceiling",
                met=alt["occupancy"] >= TARGET_OCCUPANCY and alt_ratio >= TARGET_RATIO,
                note=f"same setup; worker used {alt['worker_cpu_cores']:.2f} cores, PSS {alt['worker_pss_mib']:.0f} MiB",
                details={"ours": alt},
            )
        )
    return results
