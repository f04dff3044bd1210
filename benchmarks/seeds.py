"""#39 Seeds: what a per-request seed costs on a real vLLM (CPU build), seeded against unseeded.

The producer seeds every sample (docs/producer.md "Seeds"), so a record can be regenerated and
compared. vLLM gives each seeded request a torch.Generator of its own: its GPU sampler then
leaves the FlashInfer kernels for the PyTorch path and draws each seeded row's noise one request
at a time, a Python loop per decoding step (vllm/v1/sample/ops/topk_topp_sampler.py
`random_sample`, whose comment says as much); its CPU sampler draws one seed per seeded request
per step. There is no GPU here: this measures the CPU build only, which says nothing about
the GPU's cost and is reported as measured.

Setup: the tests' real vLLM server (tests/vllm_server.py, the tiny random Qwen3), PROMPTS
prompts of the bench rows (templated by the real producer), INFLIGHT in flight,
temperature 1, MAX_NEW_TOKENS each with ignore_eos (so both sides generate exactly as many
tokens); the same prompts sent ROUNDS times each way, interleaved (unseeded, seeded, ...),
one request per prompt on /v1/completions. Figure: output tokens/s; ratio = seeded / unseeded.
"""

from __future__ import annotations

import asyncio
import json
import time

from benchmarks.common import Result, Stack, bench_tokenizer, enqueue_backlog, queued_payloads, write_rows
from tests.vllm_server import SERVED_NAME, VllmServer, build_model

PROMPTS = {False: 128, True: 64}
INFLIGHT = 32
MAX_NEW_TOKENS = 64
ROUNDS = {False: 3, True: 2}
MAX_MODEL_LEN = 2048


async def _send_all(url: str, prompts: list[list[int]], *, seeded: bool) -> float:
    """Send every prompt once, INFLIGHT at a time; returns the seconds it took."""
    import aiohttp

    line = list(reversed(range(len(prompts))))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:

        async def client() -> None:
            while line:
                index = line.pop()
                body = {
                    "model": SERVED_NAME,
                    "prompt": prompts[index],
                    "max_tokens": MAX_NEW_TOKENS,
                    "temperature": 1.0,
                    "ignore_eos": True,
                }
                if seeded:
                    body["seed"] = 1000 + index
                async with session.post(f"{url}/v1/completions", json=body) as reply:
                    reply.raise_for_status()
                    await reply.read()

        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(INFLIGHT)))
        return time.monotonic() - started


def run(quick: bool) -> list[Result]:
    with Stack("seeds") as stack:
        model = build_model(bench_tokenizer())
        server = VllmServer(model=model, logdir=stack.dir / "logs", max_model_len=MAX_MODEL_LEN).start()
        try:
            redis = stack.redis()
            rows = write_rows(stack.dir / "rows.jsonl", PROMPTS[quick], seed=39)
            enqueue_backlog(redis.url, rows, "seeds", max_new_tokens=MAX_NEW_TOKENS)
            prompts = [item.ids for payload in queued_payloads(redis.url) for item in payload.items]
            asyncio.run(_send_all(server.url, prompts[:INFLIGHT], seeded=False))  # warm-up
            seconds: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(ROUNDS[quick]):
                for seeded in (False, True):
                    seconds[seeded].append(asyncio.run(_send_all(server.url, prompts, seeded=seeded)))
        finally:
            server.stop()
    tokens = len(prompts) * MAX_NEW_TOKENS
    rate = {seeded: tokens * len(spans) / sum(spans) for seeded, spans in seconds.items()}
    return [
        Result(
            number=39,
            figure="output tokens/s with a seed per request, real vLLM (CPU)",
            ours=rate[True],
            baseline=rate[False],
            unit="tokens/s",
            baseline_name="the same requests unseeded",
            target="measured (no GPU here)",
            met=None,
            note=(
                f"{len(prompts)} prompts x {MAX_NEW_TOKENS} tokens (ignore_eos), temperature 1, {INFLIGHT} in flight, "
                f"{ROUNDS[quick]} rounds each way interleaved: seeded {[round(s, 1) for s in seconds[True]]} s, "
                f"unseeded {[round(s, 1) for s in seconds[False]]} s; vLLM's GPU sampler takes another path for "
                "seeded requests (per-request generators, no FlashInfer): not measurable here"
            ),
            details={"seconds": {str(k): v for k, v in seconds.items()}},
        )
    ]


if __name__ == "__main__":
    import sys

    for result in run(quick="--quick" in sys.argv):
        print(json.dumps(result.to_dict(), indent=1))
