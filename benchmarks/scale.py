"""#26 Scale: Redis bytes per prompt at a campaign's peak and after its end, and each command's
peak RSS and CPU per prompt, at two sizes, with the growth between them.

Setup (a private redis-server per size): a campaign's state is injected as the producer and
workers would leave it, without templating or generating (the issue is Redis state size):
N prompt keys, 99 % of them `done` (their records written to disk as shards of
tiny records, so `close` finds them), 1 % failed with 2,048-token prompts stored as workers
store them (Campaign.record_failure). Prompt ids are Zipf-distributed over a 150k vocabulary,
close to text's id statistics.

Measurement: Redis `used_memory` above an empty server's, at the peak (every key and failure
present) and after `eagle-synth close` (the campaign's end); each command run as a user would
(a process), its process tree's peak RSS and CPU sampled every 100 ms (benchmarks.common).
The 10M x 2k-token figure is extrapolated from the larger size's bytes per prompt plus the
backlog's byte cap (`enqueue --max-backlog-mb`, which holds the queue, the failures and the
outbox: the rest of a peak). A second part injects only failures (10k, then 100k of 2k tokens)
and runs `failed`, `failed --json`, `close` and `retry-failed` on them.

Baselines: the smaller size (growth, target <= 1.25x for memory), and for failure bytes the
JSON layout stored before (the same failures, MEMORY USAGE of both hashes).
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from benchmarks.common import Result, Stack, run_measured
from eagle_synth.queue import campaign_queue, queued_count

SIZES = {True: (10_000, 100_000), False: (100_000, 1_000_000)}
FAILURE_SIZES = (10_000, 100_000)
FAILED_SHARE = 0.01
PROMPT_TOKENS = 2048
VOCAB = 150_000
TARGET_PROMPTS = 10_000_000
PEAK_TARGET = 2e9
END_TARGET = 100e6
GROWTH_TARGET = 1.25
# Records per shard written for `close` to find.
SHARD_RECORDS = 50_000
# Keys written per pipeline round trip while injecting.
INJECT_CHUNK = 5_000
NAME = "scale"


def _key(i: int) -> str:
    return hashlib.blake2b(f"scale|{i}".encode(), digest_size=16).hexdigest()


def _ids(rng, count: int) -> list[int]:
    return ((rng.zipf(1.3, count) - 1) % VOCAB).tolist()


def _campaign(client):
    from eagle_synth.sampling import SamplingParams
    from eagle_synth.state.campaign import Campaign, CampaignSettings

    c = Campaign(client, NAME)
    c.register(
        CampaignSettings(
            name=NAME,
            tokenizer_path="/tok",
            tokenizer_fingerprint="f",
            chat_template_hash="h",
            sampling=SamplingParams(max_new_tokens=2048, temperature=0.6).to_dict(),
            batch_size=16,
            created_at=time.time(),
        )
    )
    return c


def _inject_failures(c, keys: list[str], rng) -> None:
    from eagle_synth.payload import PromptItem
    from eagle_synth.state.campaign import Failure

    pipe = c.client.pipeline(transaction=False)
    for n, key in enumerate(keys, 1):
        item = PromptItem(key=key, row_id=f"r{n}", sample=0, ids=_ids(rng, PROMPT_TOKENS), seed=n, source=f"in:{n}")
        failure = Failure(
            reason="server-error",
            message="HTTP 500 from the server",
            item=item.to_replay(),
            sampling={"max_new_tokens": 2048, "temperature": 0.6, "sampling_seed": n},
            at=time.time(),
            worker="w1@bench",
        )
        pipe.sadd(c.keys.enqueued, key)
        pipe.hset(c.keys.failed, key, failure.encode())
        pipe.hincrby(c.keys.failed_reasons, "server-error", 1)
        if n % 500 == 0:
            pipe.execute()
    pipe.execute()


def _inject_done(c, keys: list[str], folder: Path) -> None:
    from eagle_synth.records import RawRecord, ShardWriter

    for start in range(0, len(keys), INJECT_CHUNK):
        chunk = keys[start : start + INJECT_CHUNK]
        pipe = c.client.pipeline(transaction=False)
        pipe.sadd(c.keys.done, *chunk)  # a done key is in `done` only (layout 2)
        pipe.hincrby(c.keys.counters, "records", len(chunk))
        pipe.execute()
    for start in range(0, len(keys), SHARD_RECORDS):
        with ShardWriter(folder, campaign=NAME, sources=[], level=1) as writer:
            for key in keys[start : start + SHARD_RECORDS]:
                meta = {"key": key, "id": key[:8], "sample": 0, "turn": 0, "finish_reason": "stop"}
                meta.update(finish_matched=2, prompt_tokens=1, completion_tokens=1, campaign=NAME, batch="b")
                writer.add(RawRecord(meta=meta, prompt_u32=b"\x01\x00\x00\x00", output_u32=b"\x02\x00\x00\x00"))
            writer.commit()


def _used(client) -> int:
    """used_memory once lazily freed objects (UNLINK) are gone."""
    from eagle_synth.testing.harness import wait_for

    wait_for(lambda: int(client.info("memory").get("lazyfree_pending_objects", 0)) == 0, timeout=60, what="lazy free")
    return int(client.info("memory")["used_memory"])


def _cli(redis_url: str, *args: str):
    return run_measured([sys.executable, "-m", "eagle_synth", *args, "--redis", redis_url], timeout=3600)


def _size_run(size: int) -> dict:
    import numpy

    from eagle_synth.settings import broker_settings
    from eagle_synth.state.redis_client import connect

    rng = numpy.random.default_rng(size)
    failed = int(size * FAILED_SHARE)
    keys = [_key(i) for i in range(size)]
    with Stack(f"scale-{size}") as stack:
        redis = stack.redis()
        client = connect(broker_settings(redis_url=redis.url))
        empty = _used(client)
        c = _campaign(client)
        out = stack.dir / "out"
        _inject_done(c, keys[failed:], out / NAME)
        sets = _used(client) - empty
        _inject_failures(c, keys[:failed], rng)
        peak = _used(client) - empty
        commands = {
            "status": _cli(redis.url, "status", NAME, "--json"),
            "failed": _cli(redis.url, "failed", NAME),
            "failed --json": _cli(redis.url, "failed", NAME, "--json"),
            "close": _cli(redis.url, "close", NAME, "--out", str(out)),
        }
        after = _used(client) - empty
        commands["retry-failed (reads the state back)"] = _cli(redis.url, "retry-failed", NAME)
    return {"size": size, "failed": failed, "sets": sets, "peak": peak, "after": after, "commands": commands}


def _failure_run(count: int) -> dict:
    import json

    import msgspec
    import numpy

    from eagle_synth.settings import broker_settings
    from eagle_synth.state.campaign import Failure
    from eagle_synth.state.redis_client import connect

    rng = numpy.random.default_rng(count)
    keys = [_key(i) for i in range(count)]
    with Stack(f"scale-failures-{count}") as stack:
        redis = stack.redis()
        client = connect(broker_settings(redis_url=redis.url))
        c = _campaign(client)
        _inject_failures(c, keys, rng)
        compact = int(client.memory_usage(c.keys.failed, samples=0) or 0)
        # The same failures in the JSON layout stored before, for the bytes baseline (a sample).
        sample = [Failure.decode(raw) for raw in client.hmget(c.keys.failed, keys[:2000])]
        pipe = client.pipeline(transaction=False)
        for key, failure in zip(keys[:2000], sample):
            pipe.hset("bench:json-failures", key, json.dumps(msgspec.structs.asdict(failure)))
        pipe.execute()
        json_bytes = int(client.memory_usage("bench:json-failures", samples=0) or 0) / len(sample)
        client.delete("bench:json-failures")
        out = stack.dir / "out"
        commands = {
            "failed": _cli(redis.url, "failed", NAME),
            "failed --json": _cli(redis.url, "failed", NAME, "--json"),
            "close": _cli(redis.url, "close", NAME, "--out", str(out)),
            "retry-failed (reads the state back)": _cli(redis.url, "retry-failed", NAME),
        }
        queued = queued_count(client, campaign_queue("eagle-synth", NAME))
    return {"count": count, "compact": compact / count, "json": json_bytes, "commands": commands, "tasks": queued}


def _command_rows(small: dict, big: dict, *, what: str, unit_count: str) -> list[Result]:
    rows = []
    for name, measured in big["commands"].items():
        base = small["commands"][name]
        n_big, n_small = big[unit_count], small[unit_count]
        rows.append(
            Result(
                number=26,
                figure=f"`{name}` peak RSS, {n_big:,} {what}",
                ours=measured.peak_rss / 2**20,
                baseline=base.peak_rss / 2**20,
                unit="MiB",
                baseline_name=f"{n_small:,} {what}",
                target=f"flat (<= {GROWTH_TARGET}x)",
                met=measured.peak_rss <= GROWTH_TARGET * base.peak_rss,
                note=f"CPU {1e6 * measured.cpu / n_big:.1f} us per {what[:-1]} (vs {1e6 * base.cpu / n_small:.1f} "
                f"at {n_small:,}); wall {measured.wall:.1f} s",
            )
        )
    return rows


def run(quick: bool) -> list[Result]:
    from producer.options import DEFAULT_MAX_BACKLOG_MB

    small_size, big_size = SIZES[quick]
    small, big = _size_run(small_size), _size_run(big_size)
    rows: list[Result] = []
    for phase, label in (("peak", "peak"), ("sets", "key sets alone"), ("after", "after close")):
        rows.append(
            Result(
                number=26,
                figure=f"Redis bytes per prompt, {label}, {big['size']:,} prompts",
                ours=big[phase] / big["size"],
                baseline=small[phase] / small["size"],
                unit="B/prompt",
                baseline_name=f"{small['size']:,} prompts",
                target="-",
                met=None,
                note=f"used_memory above an empty Redis: {big[phase] / 1e6:.1f} MB"
                + (f"; 1 % failed with {PROMPT_TOKENS}-token prompts" if phase == "peak" else "")
                + ("; the queue is not included (bounded by --max-backlog-mb)" if phase != "after" else ""),
            )
        )
    # At 10M the queue, the failures and the outbox together stay under the byte cap (a failure
    # is smaller than its queued batch share), so the peak is the key sets plus the cap.
    sets_per_prompt = big["sets"] / big["size"]
    peak = sets_per_prompt * TARGET_PROMPTS + DEFAULT_MAX_BACKLOG_MB * 1e6
    after = big["after"] / big["size"] * TARGET_PROMPTS
    rows.append(
        Result(
            number=26,
            figure="Redis peak, 10M x 2k-token prompts (extrapolated)",
            ours=peak / 1e9,
            baseline=None,
            unit="GB",
            baseline_name="-",
            target=f"< {PEAK_TARGET / 1e9:g} GB",
            met=peak < PEAK_TARGET,
            note=f"key sets {sets_per_prompt:.1f} B/prompt x 10M + the default backlog cap {DEFAULT_MAX_BACKLOG_MB} MB "
            "(queue, failures, outbox)",
        )
    )
    rows.append(
        Result(
            number=26,
            figure="Redis after close, 10M x 2k-token prompts (extrapolated)",
            ours=after / 1e6,
            baseline=None,
            unit="MB",
            baseline_name="-",
            target=f"< {END_TARGET / 1e6:g} MB",
            met=after < END_TARGET,
            note=f"{big['after'] / big['size']:.2f} B/prompt x 10M (settings, counters and the `ended` marker stay)",
        )
    )
    rows.extend(_command_rows(small, big, what="prompts", unit_count="size"))
    few, many = (_failure_run(count) for count in FAILURE_SIZES)
    rows.append(
        Result(
            number=26,
            figure=f"Redis bytes per failure, {PROMPT_TOKENS}-token prompt",
            ours=many["compact"],
            baseline=many["json"],
            unit="B/failure",
            baseline_name="JSON failures with the ids as a list (before)",
            target="-",
            met=None,
            note=f"MEMORY USAGE of the failed hash over {many['count']:,} failures; baseline on 2,000 of them",
        )
    )
    rows.extend(_command_rows(few, many, what="failures", unit_count="count"))
    rows.append(
        Result(
            number=26,
            figure=f"`retry-failed` tasks for {many['count']:,} failures",
            ours=float(many["tasks"]),
            baseline=many["count"] / 16,
            unit="tasks",
            baseline_name="the campaign's batch size, 16",
            target="batches of 16 (<= 1.01x)",
            met=many["tasks"] <= 1.01 * many["count"] / 16,
            note="before: one task per prompt (the seed was part of the grouping: 99,998 tasks for 100k); "
            "a key HSCAN lists twice (it may, while the hash shrinks) leaves one batch short",
        )
    )
    return rows
