"""#26.8 `compact`'s zstd level and threads: shard bytes per token against compression CPU.

Setup: realistic records (benchmarks.storage.synth_records: chat-templated prompts and answers
from real text, the bench tokenizer) written as batch files of 16, as workers write them.

Measurement: each level's shard is written with ShardWriter from the same raw records, one
thread, timed by the process's CPU clock; bytes/token is the shard's size over the records'
tokens. The baseline is level 19, the level `compact` used before. The threads row writes the
chosen level's shard with zstd worker threads on every core and reports wall-clock tokens/s
against the single thread.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import Result

LEVELS = (3, 6, 9, 12, 15, 16, 19)
BASELINE_LEVEL = 19
TOKENS = {True: 400_000, False: 1_600_000}


def _shard(folder: Path, raws: list, *, level: int, threads: int) -> tuple[int, float, float]:
    """(bytes, CPU seconds, wall seconds) of one shard of `raws` written at `level`."""
    from eagle_synth.records import ShardWriter

    cpu, wall = time.process_time(), time.perf_counter()
    with ShardWriter(folder, campaign="bench", sources=[], level=level, threads=threads) as writer:
        for raw in raws:
            writer.add(raw)
        path = writer.commit()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    size = path.stat().st_size
    path.unlink()
    return size, cpu, wall


def run(quick: bool) -> list[Result]:
    from transformers import AutoTokenizer

    from benchmarks.common import bench_tokenizer
    from benchmarks.storage import synth_records
    from eagle_synth.records import read_raw_file, write_record_file
    from eagle_synth.tools.compact import DEFAULT_THREADS, SHARD_LEVEL

    tokenizer = AutoTokenizer.from_pretrained(str(bench_tokenizer()))
    records = synth_records(tokenizer, tokens=TOKENS[quick])
    tokens = sum(len(r.prompt_ids) + len(r.output_ids) for r in records)
    rows: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "bench"
        for index in range(0, len(records), 16):
            write_record_file(folder, campaign="bench", batch=f"{index:016x}", records=records[index : index + 16])
        raws = [raw for path in sorted((folder / "records").iterdir()) for raw in read_raw_file(path)]
        figures = {level: _shard(folder, raws, level=level, threads=0) for level in LEVELS}
        base_bytes, base_cpu, _ = figures[BASELINE_LEVEL]
        for level in LEVELS:
            size, cpu, _ = figures[level]
            chosen = " (compact's default)" if level == SHARD_LEVEL else ""
            rows.append(
                Result(
                    number=26,
                    figure=f"compact zstd-{level}{chosen}: tokens per CPU-second",
                    ours=tokens / cpu,
                    baseline=tokens / base_cpu,
                    unit="tokens/CPU-s",
                    baseline_name=f"zstd-{BASELINE_LEVEL}",
                    target="-",
                    met=None,
                    note=f"{size / tokens:.3f} B/token vs {base_bytes / tokens:.3f} at zstd-{BASELINE_LEVEL} "
                    f"({size / base_bytes:.2f}x the bytes); {tokens:,} tokens, one thread",
                )
            )
        _, cpu_one, wall_one = _shard(folder, raws, level=SHARD_LEVEL, threads=0)
        _, cpu_all, wall_all = _shard(folder, raws, level=SHARD_LEVEL, threads=DEFAULT_THREADS)
        rows.append(
            Result(
                number=26,
                figure=f"compact zstd-{SHARD_LEVEL}, zstd threads on every core: tokens per wall second",
                ours=tokens / wall_all,
                baseline=tokens / wall_one,
                unit="tokens/s",
                baseline_name="one thread",
                target="-",
                met=None,
                note=f"{os.cpu_count()} cores; CPU {cpu_all:.2f} s vs {cpu_one:.2f} s (zstd only threads "
                "frames of several MB: a shard's stream is one)",
            )
        )
    return rows
