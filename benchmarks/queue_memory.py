"""#6 Queue memory: Redis bytes per queued prompt, against JSON list-of-ints payloads.

A backlog of millions of prompts has to fit in the broker's RAM. Setup: PROMPTS chat rows
enqueued with the real producer (default batch of 16, msgpack with zstd uint32 ids) into a
private redis-server.

Measurement: `MEMORY USAGE <queue> SAMPLES 0` (every element counted) divided by the
prompts queued. The campaign's own keys (the dedup set of prompt keys, counters, settings)
are reported apart: they stay after the queue drains and grow with the campaign, not the
backlog.

Baselines, built from the very prompts read back from our queue and published with a
Celery app configured like ours but the `json` serializer, each into its own list:
  * per prompt (what a naive producer does, the ratio's baseline): one task per prompt whose
    argument is {campaign, sampling, key, row, sample, seed, source, turn, ids: [int, ...]};
  * same batching: one task per batch of 16 with the same fields as lists and ids as a list
    of int lists, so the share of the gain due to the id encoding alone is visible.
"""

from __future__ import annotations

import json

from benchmarks.common import Result, Stack, enqueue_backlog, queued_payloads, write_rows
from eagle_synth.payload import TASK_NAME
from eagle_synth.priorities import DEFAULT_PRIORITY, message_priority
from eagle_synth.queue import campaign_queue, queue_lists

PROMPTS = {True: 2000, False: 10000}
MAX_NEW_TOKENS = 2048
# The campaign's queue list (its own queue, the default priority's list).
QUEUE = queue_lists(campaign_queue("eagle-synth", "memory"))[message_priority(DEFAULT_PRIORITY)]
PER_PROMPT_QUEUE = "bench-json-per-prompt"
BATCHED_QUEUE = "bench-json-batched"
TARGET_RATIO = 0.5


def _memory(client, key: str) -> int:
    return int(client.memory_usage(key, samples=0) or 0)


def _campaign_bytes(client, campaign: str) -> int:
    from eagle_synth.state.keys import CampaignKeys

    prefix = CampaignKeys(campaign).settings.rsplit(":", 1)[0]
    return sum(_memory(client, key) for key in client.scan_iter(match=f"{prefix}:*", count=1000))


def run(quick: bool) -> list[Result]:
    from eagle_synth.queue import make_celery
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.redis_client import connect

    count = PROMPTS[quick]
    with Stack("queue-memory") as stack:
        redis = stack.redis()
        enqueue_backlog(
            redis.url,
            write_rows(stack.dir / "rows.jsonl", count, seed=6),
            "memory",
            max_new_tokens=MAX_NEW_TOKENS,
            temperature=0.6,
        )
        settings = broker_settings(redis_url=redis.url)
        client = connect(settings)
        ours = _memory(client, QUEUE)
        campaign_bytes = _campaign_bytes(client, "memory")
        messages = client.lrange(QUEUE, 0, -1)
        argsrepr = sum(len(json.loads(m)["headers"].get("argsrepr") or "") for m in messages)
        payloads = queued_payloads(redis.url)
        prompts = sum(len(p.items) for p in payloads)
        tokens = sum(len(i.ids) for p in payloads for i in p.items)

        app = make_celery(settings)
        for payload in payloads:
            for item in payload.items:
                app.send_task(
                    TASK_NAME,
                    args=[
                        {
                            "campaign": payload.campaign,
                            "sampling": payload.sampling.as_map(),
                            "key": item.key,
                            "row": item.row_id,
                            "sample": item.sample,
                            "seed": item.seed,
                            "source": item.source,
                            "turn": item.turn,
                            "ids": item.ids,
                        }
                    ],
                    queue=PER_PROMPT_QUEUE,
                    serializer="json",
                )
            app.send_task(
                TASK_NAME,
                args=[
                    {
                        "campaign": payload.campaign,
                        "batch": payload.batch,
                        "sampling": payload.sampling.as_map(),
                        "keys": [i.key for i in payload.items],
                        "rows": [i.row_id for i in payload.items],
                        "samples": [i.sample for i in payload.items],
                        "seeds": [i.seed for i in payload.items],
                        "sources": [i.source for i in payload.items],
                        "turns": [i.turn for i in payload.items],
                        "ids": [i.ids for i in payload.items],
                    }
                ],
                queue=BATCHED_QUEUE,
                serializer="json",
            )
        per_prompt = _memory(client, PER_PROMPT_QUEUE)
        batched = _memory(client, BATCHED_QUEUE)
        client.close()

    ours_pp, per_prompt_pp, batched_pp = ours / prompts, per_prompt / prompts, batched / prompts
    ratio = ours_pp / per_prompt_pp
    setup = f"{prompts:,} prompts, {tokens / prompts:.0f} tokens each on average, batches of 16"
    return [
        Result(
            number=6,
            figure="queue bytes per prompt",
            ours=ours_pp,
            baseline=per_prompt_pp,
            unit="B/prompt",
            baseline_name="Celery json, JSON list-of-ints, one prompt per task",
            target="<= 0.5x",
            met=ratio <= TARGET_RATIO,
            note=(
                f"{setup}; MEMORY USAGE of the queue list; Celery's argsrepr header is "
                f"{argsrepr / prompts:.0f} B/prompt of ours"
            ),
            details={
                "ours_bytes": ours,
                "per_prompt_bytes": per_prompt,
                "batched_bytes": batched,
                "prompts": prompts,
                "tokens": tokens,
                "argsrepr_bytes": argsrepr,
            },
        ),
        Result(
            number=6,
            figure="queue bytes per prompt (same batching)",
            ours=ours_pp,
            baseline=batched_pp,
            unit="B/prompt",
            baseline_name="Celery json, JSON list-of-ints, 16 prompts per task",
            target="-",
            met=None,
            note="the gain from the zstd uint32 id blob alone",
        ),
        Result(
            number=6,
            figure="campaign keys per prompt (kept after the queue drains)",
            ours=campaign_bytes / prompts,
            baseline=None,
            unit="B/prompt",
            baseline_name="-",
            target="-",
            met=None,
            note="dedup set of 32-hex prompt keys, counters, settings: grows with the campaign",
        ),
    ]
