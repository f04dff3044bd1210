"""#39 Prefix affinity: a `--history own` tool campaign on 4 and 8 servers that charge prefill.

Every later turn of a conversation resends the whole history; a server skips the prefill of what
its prefix cache holds, and only that server holds it. Setup: devservers with `--charge-prefill`
(docs/devserver.md), one `eagle-synth worker` on the first 4, then on all 8 of them; per server
count the same tool campaign twice from cold caches: with prefix affinity (the shipped default,
workers/affinity.py) and with EAGLE_SYNTH_PREFIX_AFFINITY=0 (each prompt to the server with the
most free tickets, which spreads a conversation's turns like round-robin). Greedy sampling, so
both runs generate exactly the same turns.

The rows: tool conversations of USER_TURNS user turns, each turn's user message naming the tool
the dataset's assistant calls, a long tool result, then words: two regeneration points per user
turn (the call, and the answer after its result), histories of thousands of tokens.

The emulated GPU is an H100 serving an 8B model shrunk from 64 to SLOTS running sequences, so this
2-core machine keeps up with 8 of them: decoding H100_DECODE_S_PER_TOKEN per token per sequence,
and the default --prefill-throughput (20,000 tokens/s, docs/benchmarks.md "Prefill cost") scaled
by SLOTS / 64, so prefill costs what it would beside decoding on a full H100.

Figures: output tokens/s (the records' output tokens over the span from the first request sent
to the last record written) and the cache-hit share (`status` cache_hit_share). Ratio =
affinity / round-robin tokens/s; target >= TARGET_RATIO at 8 servers.
"""

from __future__ import annotations

import json
import random
from functools import partial
from pathlib import Path

import requests

from benchmarks.common import _WORDS, Result, Stack, bench_tokenizer
from eagle_synth.testing.harness import wait_for
from workers.affinity import HOST_QUEUES_ENV

# Server counts measured, and the one the target is for.
SERVER_COUNTS = (4, 8)
TARGET_SERVERS = 8
TARGET_RATIO = 1.3
# Worker processes (hosts) the cross-host figure splits the servers over.
HOSTS = 2
# Seconds between samples of the host queues (the measured wait of a next turn there).
DWELL_SAMPLE = 0.02
# Conversations per server (the fleet is sized to its work, so 8 servers get twice the
# conversations of 4), and user turns per conversation (two regeneration points each).
CONVERSATIONS_PER_SERVER = {True: 4, False: 8}
USER_TURNS = {True: 4, False: 6}
# Decoding speed of one of 64 sequences of an 8B model on an H100: about 50 tokens/s (vLLM's
# release benchmark ran about 6,200 output tokens/s with up to 256 sequences, vllm PR 7117).
H100_DECODE_S_PER_TOKEN = 0.02
H100_SLOTS = 64
H100_PREFILL_TOKENS_PER_S = 20_000
# Sequences the emulated GPU runs at once (see the docstring).
SLOTS = 4
# Mean output tokens of a words answer (tool calls are what their arguments make them); the cap
# stays far above, so no conversation is cut by truncation.
MEAN_OUTPUT_TOKENS = 40
MAX_NEW_TOKENS = 512
# Words of a tool result and of a user message (the history grows by both every turn).
RESULT_WORDS = 400
USER_WORDS = 50
# Seconds a campaign may take at worst (a loaded machine).
RUN_TIMEOUT = 600.0
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
    for name, description in (
        ("search_docs", "Search the project's documentation and return the matching passages."),
        ("run_query", "Run a read-only query against the analytics database and return the rows."),
    )
]


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def tool_rows(count: int, user_turns: int, *, seed: int = 39) -> list[dict]:
    """Tool conversations: every user turn names one tool, the dataset calls it, a long result
    comes back, the assistant answers in words."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        messages: list[dict] = [{"role": "system", "content": f"You are agent {i}. Use the tools to answer."}]
        for turn in range(user_turns):
            tool = TOOLS[(i + turn) % len(TOOLS)]["function"]["name"]
            question = f"Task {i}, step {turn}: call {tool} about {_words(rng, USER_WORDS)}."
            call = {"type": "function", "function": {"name": tool, "arguments": {"query": _words(rng, 4)}}}
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": _words(rng, RESULT_WORDS)})
            messages.append({"role": "assistant", "content": _words(rng, 30)})
        rows.append({"id": f"agent-{i}", "tools": TOOLS, "messages": messages})
    return rows


def _devserver_args() -> list[str]:
    decode = H100_DECODE_S_PER_TOKEN
    prefill = H100_PREFILL_TOKENS_PER_S * SLOTS / H100_SLOTS
    return [
        *("--charge-prefill", "--prefill-throughput", str(prefill), "--token-latency", str(decode)),
        *("--slots", str(SLOTS), "--mean-output-tokens", str(MEAN_OUTPUT_TOKENS)),
    ]


def _enqueue(redis_url: str, rows_path: Path, name: str) -> None:
    from eagle_synth.sampling import SamplingParams
    from eagle_synth.settings import broker_settings
    from producer.enqueue import EnqueueOptions, enqueue

    options = EnqueueOptions(
        inputs=[str(rows_path)],
        campaign=name,
        tokenizer=str(bench_tokenizer()),
        processes=1,
        history="own",
        sampling=SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=0.0),
    )
    summary = enqueue(options, broker=broker_settings(redis_url=redis_url))
    if not summary.accounted or summary.rows_skipped:
        raise RuntimeError(f"enqueue skipped rows: {summary.to_dict()}")


def _finished(redis_url: str, name: str) -> dict | None:
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.redis_client import connect
    from eagle_synth.tools.status import campaign_status

    client = connect(broker_settings(redis_url=redis_url))
    try:
        data = campaign_status(client, name)
    finally:
        client.close()
    conversations = data["conversations"] or {}
    busy = conversations.get("in_progress") or conversations.get("followups_waiting") or data["queued"]
    return data if conversations.get("total") and not busy and not data["inflight"] else None


def _run(
    stack: Stack,
    redis_url: str,
    servers: list[str],
    name: str,
    rows_path: Path,
    *,
    affinity: bool,
    hosts: int = 1,
    env: dict[str, str] | None = None,
) -> dict:
    """One campaign from cold caches, through `hosts` workers that split `servers` between them;
    its throughput, cache-hit share and conversation ends."""
    from eagle_synth.records import iter_records

    for url in servers:
        requests.post(f"{url}/flush_cache", timeout=10).raise_for_status()
    _enqueue(redis_url, rows_path, name)
    env = (env or {}) | ({} if affinity else {"EAGLE_SYNTH_PREFIX_AFFINITY": "0"})
    out = stack.dir / "out"
    share = len(servers) // hosts
    workers = [
        stack.worker(
            servers=servers[host * share : (host + 1) * share],
            redis_url=redis_url,
            out=out,
            env=env,
            args=["--campaign", name],
            name=f"{name}-host{host}@bench",
        )
        for host in range(hosts)
    ]
    dwell = _HostQueueDwell(redis_url)
    try:
        status = wait_for(lambda: _finished(redis_url, name), timeout=RUN_TIMEOUT, interval=0.5, what=name)
    finally:
        dwell.stop()
        for worker in workers:
            worker.stop(timeout=stack.stop_timeout)
    records = list(iter_records(out / name))
    started = min(r.created_at - (r.e2e_latency or 0.0) for r in records)
    span = max(r.created_at for r in records) - started
    output_tokens = sum(len(r.output_ids) for r in records)
    return {
        "tokens_per_s": output_tokens / span,
        "cache_hit_share": status["cache_hit_share"],
        "records": len(records),
        "output_tokens": output_tokens,
        "prompt_tokens": sum(len(r.prompt_ids) for r in records),
        "longest_prompt": max(len(r.prompt_ids) for r in records),
        "seconds": span,
        "ends": status["conversations"]["stopped_by_reason"] | {"complete": status["conversations"]["done"]},
        "servers_per_conversation": _servers_per_conversation(records),
        "same_host_share": _same_host_share(records),
        "host_queue_dwell_s": dwell.summary(),
    }


class _HostQueueDwell:
    """Samples the host queues every DWELL_SAMPLE s on a thread: how long each message waited
    there before its worker took it (or it was handed on), to DWELL_SAMPLE's precision."""

    def __init__(self, redis_url: str) -> None:
        import threading

        from eagle_synth.settings import broker_settings
        from eagle_synth.state.redis_client import connect

        self.client = connect(broker_settings(redis_url=redis_url))
        self.seen: dict[bytes, list[float]] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        import hashlib
        import time

        from eagle_synth.queue import queue_lists
        from eagle_synth.state.keys import HOST_QUEUES

        while not self.done.wait(DWELL_SAMPLE):
            now = time.monotonic()
            for queue in self.client.hkeys(HOST_QUEUES):
                for name in queue_lists(queue.decode()):
                    for raw in self.client.lrange(name, 0, -1):
                        times = self.seen.setdefault(hashlib.blake2b(raw, digest_size=16).digest(), [now, now])
                        times[1] = now

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)

    def summary(self) -> dict:
        """Messages seen, and the median, 95th percentile and longest of their waits (seconds)."""
        waits = sorted(last - first for first, last in self.seen.values())
        if not waits:
            return {"messages": 0}
        return {
            "messages": len(waits),
            "median": round(waits[len(waits) // 2], 3),
            "p95": round(waits[int(0.95 * (len(waits) - 1))], 3),
            "max": round(waits[-1], 3),
        }


def _same_host_share(records: list) -> float:
    """Share of later turns generated by the worker of the turn before."""
    turns = sorted(records, key=lambda r: (r.conversation, r.turn))
    pairs = [(a, b) for a, b in zip(turns, turns[1:]) if a.conversation == b.conversation]
    return sum(a.worker == b.worker for a, b in pairs) / max(1, len(pairs))


def _servers_per_conversation(records: list) -> float:
    servers: dict[str, set[str]] = {}
    for record in records:
        servers.setdefault(record.conversation, set()).add(record.server)
    return sum(len(urls) for urls in servers.values()) / len(servers)


def _start_servers(stack: Stack, count: int) -> list[str]:
    """`count` devservers started at once (each loads the tokenizer for seconds); their URLs."""
    started = [stack.devserver(*_devserver_args(), wait=False) for _ in range(count)]
    for process, url in started:
        port = int(url.rsplit(":", 1)[1])
        if (said := process.listening_on(port, f"devserver {url}")) is not None:
            raise RuntimeError(f"devserver {url} exited:\n{said}")
    return [url for _, url in started]


def run(quick: bool) -> list[Result]:
    results = []
    with Stack("affinity") as stack:
        redis = stack.redis()
        servers = _start_servers(stack, max(SERVER_COUNTS))
        for count in SERVER_COUNTS:
            used = servers[:count]
            rows = tool_rows(count * CONVERSATIONS_PER_SERVER[quick], USER_TURNS[quick])
            rows_path = stack.dir / f"rows-{count}.jsonl"
            rows_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
            affine = _run(stack, redis.url, used, f"affine-{count}", rows_path, affinity=True)
            spread = _run(stack, redis.url, used, f"spread-{count}", rows_path, affinity=False)
            ratio = affine["tokens_per_s"] / spread["tokens_per_s"]
            targeted = count == TARGET_SERVERS
            results.append(
                Result(
                    number=39,
                    figure=f"output tokens/s, tool conversations on {count} servers, prefix affinity",
                    ours=affine["tokens_per_s"],
                    baseline=spread["tokens_per_s"],
                    unit="tokens/s",
                    baseline_name="the same campaign with EAGLE_SYNTH_PREFIX_AFFINITY=0 (by load alone)",
                    target=f">= {TARGET_RATIO}x" if targeted else "-",
                    met=ratio >= TARGET_RATIO if targeted else None,
                    note=(
                        f"cache-hit share {affine['cache_hit_share']:.1%} against {spread['cache_hit_share']:.1%}; "
                        f"servers per conversation {affine['servers_per_conversation']:.2f} against "
                        f"{spread['servers_per_conversation']:.2f}; {len(rows)} conversations, {affine['records']} "
                        f"turns, prompts up to {affine['longest_prompt']} tokens; devserver {' '.join(_devserver_args())}"
                    ),
                    details={"affinity": affine, "round_robin": spread},
                )
            )
        # Across hosts: the 8 servers split over HOSTS workers, affinity on each host in both runs;
        # host queues (workers/handoff.py) against none (a next turn to whichever host is free).
        count = TARGET_SERVERS
        rows = tool_rows(count * CONVERSATIONS_PER_SERVER[quick], USER_TURNS[quick])
        rows_path = stack.dir / "rows-hosts.jsonl"
        rows_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        run_hosts = partial(_run, stack, redis.url, servers[:count], rows_path=rows_path, affinity=True, hosts=HOSTS)
        kept = run_hosts(name="hosts-kept")
        free = run_hosts(name="hosts-free", env={HOST_QUEUES_ENV: "0"})
        results.append(
            Result(
                number=39,
                figure=f"output tokens/s, tool conversations on {count} servers over {HOSTS} worker hosts, host queues",
                ours=kept["tokens_per_s"],
                baseline=free["tokens_per_s"],
                unit="tokens/s",
                baseline_name=f"the same with {HOST_QUEUES_ENV}=0 (affinity within each host only)",
                target="-",
                met=None,
                note=(
                    f"later turns on the host of the turn before {kept['same_host_share']:.0%} against "
                    f"{free['same_host_share']:.0%}; cache-hit share {kept['cache_hit_share']:.1%} against "
                    f"{free['cache_hit_share']:.1%}; {len(rows)} conversations, {kept['records']} turns; "
                    f"a next turn's wait in its host queue (sampled every {DWELL_SAMPLE} s): {kept['host_queue_dwell_s']}"
                ),
                details={"host_queues": kept, "no_host_queues": free},
            )
        )
    return results


if __name__ == "__main__":
    import sys

    for result in run(quick="--quick" in sys.argv):
        print(json.dumps(result.to_dict(), indent=1))
