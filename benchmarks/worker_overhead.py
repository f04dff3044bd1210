"""#3 Worker overhead: worker CPU per record against a server that answers at once.

What a record costs the worker itself, beyond the work no design can avoid. Setup: a
devserver with zero token latency (answers as fast as it can), a backlog of
WARM + MEASURED prompts enqueued with the real producer, one `eagle-synth worker` with
--concurrency CONCURRENCY (default settings otherwise).

Measurement: user + system CPU of the worker's whole process tree (main process and every
batch thread, psutil) between the moment WARM records are done (imports, connections and
caches warm) and the moment WARM + MEASURED are done, divided by the records done between.

Baseline (the target's): the floor of the per-prompt design the worker uses (one request per
prompt, so a finished prompt frees its server slot at once; issue 10): a bare loop in this
process over the same prompts in the same batches, against the same server, one aiohttp POST
/generate per prompt (32 at once) with the same sampling parameters, Records built from the
answers, one record file written per batch with `write_record_file` (zstd msgpack, atomic, as
the worker does). Its CPU is `time.process_time()` over the loop. Ratio = ours / that loop.

Context, no target: the same loop with one `requests` POST of all 16 prompts of a batch. It is
cheaper per record (one request per 16), but a batch request holds its slots on a
continuous-batching server until its slowest prompt ends, which the worker must not do, so no
design of the worker can reach it; it shows what the per-prompt requests cost.
"""

from __future__ import annotations

import threading
import time

import requests

from benchmarks.common import (
    Result,
    Stack,
    campaign_progress,
    enqueue_backlog,
    main_cpu_seconds,
    queued_payloads,
    tree_cpu_seconds,
    wait_done,
    write_rows,
)
from eagle_synth.records import Record, write_record_file
from eagle_synth.testing.harness import free_port, wait_for

# Pool processes: one per core (the default 16 gives the same CPU per record within noise).
CONCURRENCY = 2
# Records done before the CPU clock starts, and records measured.
WARM = {True: 96, False: 160}
MEASURED = {True: 1600, False: 4000}
MEAN_OUTPUT_TOKENS = 100
MAX_NEW_TOKENS = 256
# Seconds a run may take at worst (a loaded machine).
RUN_TIMEOUT = 300.0
# Most the worker may use per record, as a multiple of the bare per-prompt loop's CPU.
TARGET_RATIO = 1.5
# Seconds between scrapes of the worker's /metrics in the --metrics-port run: 15x Prometheus'
# usual 15 s, so the scrapes' own CPU is counted generously.
SCRAPE_INTERVAL = 1.0


def measure_worker(
    stack: Stack,
    redis_url: str,
    url: str,
    concurrency: int,
    warm: int,
    measured: int,
    campaign: str | list[str],
    start_done: int = 0,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> dict:
    """CPU of one worker's process tree per record, and its records/s, between `warm` and
    `warm + measured` records done, summed over `campaign` when it names several
    (benchmarks/replica_wait.py and routing.py use it too)."""
    names = [campaign] if isinstance(campaign, str) else campaign

    def done() -> int:
        return sum(campaign_progress(redis_url, name).done for name in names)

    def reached(count: int) -> None:
        if len(names) == 1:
            wait_done(redis_url, names[0], count, timeout=RUN_TIMEOUT, stack=stack)
        else:
            wait_for(lambda: done() >= count, timeout=RUN_TIMEOUT, interval=0.05, what=f"{count} records")

    worker = stack.worker(servers=[url], redis_url=redis_url, concurrency=concurrency, args=args, env=env)
    try:
        reached(start_done + warm)
        pid = worker.proc.pid
        main0, cpu0 = main_cpu_seconds(pid), tree_cpu_seconds(pid)
        done0, t0 = done(), time.monotonic()
        reached(start_done + warm + measured)
        main1, cpu1 = main_cpu_seconds(pid), tree_cpu_seconds(pid)
        done1, t1 = done(), time.monotonic()
    finally:
        worker.stop(timeout=stack.stop_timeout)
    records = done1 - done0
    return {
        "cpu_ms_per_record": 1000 * (cpu1 - cpu0) / records,
        "main_process_ms_per_record": 1000 * (main1 - main0) / records,
        "records": records,
        "records_per_s": records / (t1 - t0),
        "cores": (cpu1 - cpu0) / (t1 - t0),
        "concurrency": concurrency,
    }


class _Scraper:
    """Fetches http://127.0.0.1:`port`/metrics every SCRAPE_INTERVAL s in a thread, as Prometheus would."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_INTERVAL):
            try:
                if "eagle_synth_worker_records_written_total" in requests.get(self.url, timeout=5).text:
                    self.scrapes += 1
            except requests.RequestException:
                pass  # not serving yet: the worker is starting


def _hook_cpu_per_record(records: int = 32_000, batch: int = 16) -> float:
    """CPU microseconds the metrics hooks of one record take with metrics on, in this process: a
    request sent, its first byte, its end, and its share of a batch's records_written."""
    from workers import metrics

    if not metrics.enabled():
        metrics.serve(port=free_port(), address="127.0.0.1", servers=["http://bench:1"])
    url = "http://bench:1"
    sample = [
        Record(
            key=str(i),
            id=str(i),
            sample=0,
            turn=0,
            prompt_ids=[1],
            output_ids=[2] * MEAN_OUTPUT_TOKENS,
            finish_reason="length",
            finish_matched=None,
            prompt_tokens=1,
            completion_tokens=MEAN_OUTPUT_TOKENS,
            server=url,
        )
        for i in range(batch)
    ]
    cpu0 = time.process_time()
    for _ in range(records // batch):
        for _ in range(batch):
            metrics.request_sent(url)
            metrics.first_byte(url, 0.01)
            metrics.request_ended(url, 0.02, None)
        metrics.records_written("bench", sample)
    return 1e6 * (time.process_time() - cpu0) / records


def _bare_loop(url: str, payloads: list, out) -> dict:
    """HTTP call + record write per batch, nothing else; returns CPU ms per record."""
    session = requests.Session()
    records_written = 0
    cpu0, t0 = time.process_time(), time.monotonic()
    for payload in payloads:
        sampling = [payload.sampling_for(i).as_map() for i in payload.items]
        response = session.post(
            f"{url}/generate",
            json={"input_ids": [i.ids for i in payload.items], "sampling_params": sampling},
            timeout=60,
        )
        response.raise_for_status()
        records = []
        for item, answer, params in zip(payload.items, response.json(), sampling, strict=True):
            records.append(_bare_record(url, payload, item, answer, params))
        write_record_file(out, campaign=payload.campaign, batch=payload.batch, records=records)
        records_written += len(records)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    return {
        "cpu_ms_per_record": 1000 * cpu / records_written,
        "records": records_written,
        "records_per_s": records_written / wall,
    }


def _bare_record(url: str, payload, item, answer: dict, params: dict) -> Record:
    """A Record from one SGLang reply item, with nothing the worker adds around it."""
    meta = answer["meta_info"]
    finish = meta["finish_reason"]
    return Record(
        key=item.key,
        id=item.row_id,
        sample=item.sample,
        turn=item.turn,
        prompt_ids=item.ids,
        output_ids=answer["output_ids"],
        finish_reason=finish["type"],
        finish_matched=finish.get("matched"),
        prompt_tokens=meta["prompt_tokens"],
        completion_tokens=meta["completion_tokens"],
        cached_tokens=meta.get("cached_tokens") or 0,
        campaign=payload.campaign,
        sampling=params,
        source=item.source,
        server=url,
        worker="bare",
        e2e_latency=meta.get("e2e_latency"),
        created_at=time.time(),
    )


async def _bare_prompt_loop_async(url: str, payloads: list, out, inflight: int) -> int:
    import asyncio

    import aiohttp

    written = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        gate = asyncio.Semaphore(inflight)

        async def one(payload, item) -> Record:
            params = payload.sampling_for(item).as_map()
            async with (
                gate,
                session.post(f"{url}/generate", json={"input_ids": item.ids, "sampling_params": params}) as response,
            ):
                answer = await response.json()
            return _bare_record(url, payload, item, answer, params)

        async def batch(payload) -> int:
            records = await asyncio.gather(*(one(payload, item) for item in payload.items))
            write_record_file(out, campaign=payload.campaign, batch=payload.batch, records=list(records))
            return len(records)

        for count in await asyncio.gather(*(batch(p) for p in payloads)):
            written += count
    return written


def _bare_prompt_loop(url: str, payloads: list, out, inflight: int = 32) -> dict:
    """The floor of a per-prompt design: one aiohttp POST per prompt (`inflight` at once), the
    records of a batch written together; returns CPU ms per record."""
    import asyncio

    cpu0, t0 = time.process_time(), time.monotonic()
    written = asyncio.run(_bare_prompt_loop_async(url, payloads, out, inflight))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    return {"cpu_ms_per_record": 1000 * cpu / written, "records": written, "records_per_s": written / wall}


def run(quick: bool) -> list[Result]:
    warm, measured = WARM[quick], MEASURED[quick]
    with Stack("worker-overhead") as stack:
        redis = stack.redis()
        _, url = stack.devserver("--mean-output-tokens", str(MEAN_OUTPUT_TOKENS))
        enqueue_backlog(
            redis.url,
            write_rows(stack.dir / "rows.jsonl", warm + measured, seed=3),
            "overhead",
            max_new_tokens=MAX_NEW_TOKENS,
        )
        payloads = queued_payloads(redis.url)
        ours = measure_worker(stack, redis.url, url, CONCURRENCY, warm, measured, "overhead")
        # The same prompts in the same batches, as many records as the worker was measured on.
        bare = _bare_loop(url, payloads[: measured // len(payloads[0].items)], stack.dir / "bare")
        bare_prompt = _bare_prompt_loop(url, payloads[: measured // len(payloads[0].items)], stack.dir / "bare2")
        # Again without Celery task events (Flower's task views need them; the backlog view does not).
        enqueue_backlog(
            redis.url,
            write_rows(stack.dir / "rows2.jsonl", warm + measured, seed=4),
            "overhead2",
            max_new_tokens=MAX_NEW_TOKENS,
        )
        quiet = measure_worker(
            stack, redis.url, url, CONCURRENCY, warm, measured, "overhead2", args=("--no-task-events",)
        )
        # Again with Prometheus metrics served and scraped (the default is off).
        enqueue_backlog(
            redis.url,
            write_rows(stack.dir / "rows3.jsonl", warm + measured, seed=5),
            "overhead3",
            max_new_tokens=MAX_NEW_TOKENS,
        )
        port = free_port()
        with _Scraper(port) as scraper:
            metered = measure_worker(
                stack, redis.url, url, CONCURRENCY, warm, measured, "overhead3", args=("--metrics-port", str(port))
            )
    hooks_us = _hook_cpu_per_record()
    ratio = ours["cpu_ms_per_record"] / bare_prompt["cpu_ms_per_record"]
    note = (
        f"--concurrency {CONCURRENCY}, zero-latency devserver, {ours['records']} records, batch 16, "
        f"~{MEAN_OUTPUT_TOKENS} output tokens; one worker process (batch threads, in-flight pool); "
        f"worker {ours['records_per_s']:.0f} rec/s on {ours['cores']:.2f} cores, "
        f"per-prompt loop {bare_prompt['records_per_s']:.0f} rec/s"
    )
    if ratio > TARGET_RATIO:
        note += (
            "; what is left above the floor is Celery's consumer, task events and acks, the batch's Redis "
            "round trips and the threads' hand-offs; see docs/benchmarks.md (known gaps)"
        )
    return [
        Result(
            number=3,
            figure="worker CPU per record",
            ours=ours["cpu_ms_per_record"],
            baseline=bare_prompt["cpu_ms_per_record"],
            unit="CPU ms/record",
            baseline_name="bare per-prompt loop: aiohttp POST per prompt + write_record_file per batch",
            target=f"<= {TARGET_RATIO}x per-prompt floor",
            met=ratio <= TARGET_RATIO,
            note=note,
            details={"ours": ours, "bare_prompt": bare_prompt},
        ),
        Result(
            number=3,
            figure="worker CPU per record, against a 16-prompt batch loop",
            ours=ours["cpu_ms_per_record"],
            baseline=bare["cpu_ms_per_record"],
            unit="CPU ms/record",
            baseline_name="bare batch loop: one POST /generate of 16 prompts + write_record_file per batch",
            target="-",
            met=None,
            note=(
                "context, no target: one request per 16 prompts is cheaper per record, but a batch request holds "
                "its server slots until its slowest prompt ends (issue 10), which the worker must not do; "
                f"bare batch loop {bare['records_per_s']:.0f} rec/s"
            ),
            details={"bare": bare},
        ),
        Result(
            number=3,
            figure="worker CPU per record, --no-task-events",
            ours=quiet["cpu_ms_per_record"],
            baseline=bare_prompt["cpu_ms_per_record"],
            unit="CPU ms/record",
            baseline_name="bare per-prompt loop (as above)",
            target="-",
            met=None,
            note=(
                f"as the first row with `eagle-synth worker --no-task-events` (task events are on by default, "
                f"for Flower); main process {quiet['main_process_ms_per_record']:.2f} ms/record"
            ),
            details={"ours": quiet},
        ),
        Result(
            number=3,
            figure="worker CPU per record, --metrics-port",
            ours=metered["cpu_ms_per_record"],
            baseline=ours["cpu_ms_per_record"],
            unit="CPU ms/record",
            baseline_name="the same worker without --metrics-port (the first row)",
            target="-",
            met=None,
            note=(
                f"as the first row with Prometheus metrics served and /metrics scraped every {SCRAPE_INTERVAL:g} s "
                f"({scraper.scrapes} scrapes with data); {metered['records_per_s']:.0f} rec/s; the hooks alone "
                f"cost {hooks_us:.1f} CPU us/record (in-process loop); a difference beyond that is a shared machine's noise"
            ),
            details={"ours": metered},
        ),
    ]
