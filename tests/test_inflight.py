"""Per-prompt refill: a prompt that finishes frees its in-flight ticket at once, whatever its
batch-mates are doing (workers/inflight.py), against a real devserver and a real worker."""

from __future__ import annotations

import json

from eagle_synth.devserver.config import DevServerConfig
from eagle_synth.devserver.generation import Generator, ModelVocab
from eagle_synth.devserver.protocol import parse_generate_request
from eagle_synth.payload import PromptItem
from eagle_synth.templating import render_prompt_ids
from eagle_synth.testing.harness import wait_for
from tests.helpers import assert_exactly_once, cli, devserver_stats, enqueue_rows, wait_finished
from workers.affinity import PrefixAffinity, prefix_key
from workers.backends.sglang import SGLangBackend
from workers.inflight import InflightPool, Route

# Devserver lengths: lognormal, so a few prompts run far longer than the rest.
LENGTH_MEDIAN = 12
LENGTH_SIGMA = 1.6
TOKEN_LATENCY = 0.01
MAX_NEW_TOKENS = 1500


def _natural_lengths(tokenizer, tokenizer_path, questions: list[str]) -> list[int]:
    """Output lengths the devserver will give these prompts (it is deterministic)."""
    vocab = ModelVocab.load(tokenizer_dir=str(tokenizer_path))
    generator = Generator(
        vocab=vocab, mean_output_tokens=200, seed=0, length_median=LENGTH_MEDIAN, length_sigma=LENGTH_SIGMA
    )
    lengths = []
    for question in questions:
        ids = render_prompt_ids(tokenizer, [{"role": "user", "content": question}])
        request = parse_generate_request(
            {"input_ids": ids, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0}},
            DevServerConfig(tokenizer=str(tokenizer_path)),
            tokenize=None,
        )
        lengths.append(len(generator.complete(request.prompts[0]).output_ids))
    return lengths


def test_straggler_does_not_hold_its_batch_mates_tickets(tmp_path, redis_server, stack, tokenizer, tokenizer_path):
    questions = [f"Tell me about topic number {i}." for i in range(60)]
    lengths = _natural_lengths(tokenizer, tokenizer_path, questions)
    order = sorted(range(len(questions)), key=lengths.__getitem__)
    straggler, shorts = order[-1], order[:7]
    assert lengths[straggler] >= 10 * max(lengths[i] for i in shorts), "pick a seed with a real straggler"
    # Batch 1 = the straggler and three short prompts; batch 2 = four short prompts.
    picked = [straggler, *shorts]
    rows = [{"id": f"q{i}", "messages": [{"role": "user", "content": questions[i]}]} for i in picked]
    enqueue_rows(
        tmp_path, redis_server.url, "tail", rows, tokenizer=tokenizer_path, batch_size=4, max_new_tokens=MAX_NEW_TOKENS
    )
    _, url = stack.devserver(
        "--token-latency",
        str(TOKEN_LATENCY),
        "--length-median",
        str(LENGTH_MEDIAN),
        "--length-sigma",
        str(LENGTH_SIGMA),
        "--max-running",
        "8",
    )
    out = tmp_path / "out"
    # Two tickets: while the straggler holds one, the seven others must share the other.
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, args=["--inflight", "2"])
    wait_finished(redis_server.url, "tail", expected=8, stack=stack, timeout=120)
    records = assert_exactly_once(redis_server.url, "tail", out / "tail", expected=8)
    by_row = {r.id: r for r in records.values()}
    slow = by_row[f"q{straggler}"]
    assert len(slow.output_ids) == lengths[straggler]
    finished_before = [r for r in records.values() if r is not slow and r.created_at < slow.created_at]
    # Its three batch-mates and the whole second batch finished while it was still generating:
    # the batch-mates' tickets went to the next prompts at once.
    assert len(finished_before) == 7, sorted((r.id, r.created_at) for r in records.values())


def test_pool_refills_a_freed_ticket_while_a_long_request_runs(stack):
    _, url = stack.devserver("--token-latency", "0.01", "--max-running", "4")

    def tick(counts):
        return {url: Route(2, SGLangBackend())}

    pool = InflightPool(servers=[url], on_tick=tick)
    try:
        wait_for(pool.routable, timeout=10, what="the pool's first routing tick")
        (long,) = pool.submit_many(
            prompts=[([1, 2, 3], {"max_new_tokens": 300, "ignore_eos": True, "temperature": 0.0})],
            timeout=60,
            tag="c",
        )
        shorts = pool.submit_many(
            prompts=[([4, 5, i], {"max_new_tokens": 5, "ignore_eos": True, "temperature": 0.0}) for i in range(6)],
            timeout=60,
            tag="c",
        )
        for future in shorts:
            answer = future.result(timeout=30)
            assert answer.error is None, answer.error
            assert len(answer.item["output_ids"]) == 5
        assert not long.done(), "six 5-token prompts on one ticket must finish before a 300-token one"
        assert pool._busy == {url: 1}
        answer = long.result(timeout=30)
        assert len(answer.item["output_ids"]) == 300
    finally:
        pool.close()


def test_pool_answers_connection_refused_as_server_down():
    from eagle_synth.errors import ServerDown
    from eagle_synth.testing.harness import free_port

    url = f"http://127.0.0.1:{free_port()}"
    pool = InflightPool(servers=[url], on_tick=lambda counts: {url: Route(4, SGLangBackend())})
    try:
        wait_for(pool.routable, timeout=10, what="the pool's first routing tick")
        (future,) = pool.submit_many(prompts=[([1], {"max_new_tokens": 1})], timeout=5, tag="c")
        answer = future.result(timeout=10)
        assert isinstance(answer.error, ServerDown)
        assert answer.url == url
    finally:
        pool.close()


def test_default_inflight_follows_the_servers_reported_capacity(tmp_path, redis_server, stack, tokenizer_path):
    from tests.conftest import chat_rows

    enqueue_rows(tmp_path, redis_server.url, "cap", chat_rows(48), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--max-running", "8", "--token-latency", "0.005")
    worker = stack.worker(servers=[url], out=tmp_path / "out", redis_url=redis_server.url, concurrency=8)
    wait_finished(redis_server.url, "cap", expected=48, stack=stack)
    assert_exactly_once(redis_server.url, "cap", tmp_path / "out" / "cap", expected=48)
    assert "keeping 10 prompts in flight (1.25 x the server's max_running_requests 8)" in worker.log()
    stats = devserver_stats(url)
    # 10 tickets: a full server (8 running) plus 2 waiting in its queue, never more.
    assert stats["peak_running"] == 8
    assert stats["peak_prompts"] == 10


# ---- prefix affinity (workers/affinity.py) ------------------------------------------------------


def test_affinity_prefers_the_remembered_server_and_falls_back_to_the_least_loaded():
    affinity = PrefixAffinity(capacity=2)
    free = {"a": 1, "b": 3}
    assert affinity.pick("c", "p", ["a", "b"], free) == "b"  # new: the most free tickets
    assert affinity.pick("c", "p", ["a", "b"], free) == "b"
    assert affinity.pick("c", "p", ["a"], free) == "a"  # b full or down: never wait for it
    assert affinity.pick("c", "p", ["a", "b"], free) == "a"  # a holds the prefix now
    assert affinity.pick("other", "p", ["a", "b"], free) == "b"  # per campaign
    assert affinity.pick("c", None, ["a", "b"], free) == "b" and len(affinity) == 2
    affinity.pick("c", "q", ["a", "b"], free)  # a third prefix: the least recently used goes
    assert len(affinity) == 2 and affinity.pick("c", "p", ["a", "b"], free) == "b"


def test_prefix_key_of_turns_and_samples():
    sample = PromptItem(key="k1", row_id="r", sample=0, ids=[1], turn=2)
    other = PromptItem(key="k2", row_id="r", sample=3, ids=[1], turn=2, variant="hot")
    earlier = PromptItem(key="k3", row_id="r", sample=0, ids=[1], turn=1)  # --turns all: a prefix of turn 2
    turn = PromptItem(key="k4", row_id="r", sample=0, ids=[1], turn=1, conversation={"key": "conv-r"})
    later = PromptItem(key="k5", row_id="r", sample=0, ids=[1], turn=2, conversation={"key": "conv-r"})
    assert prefix_key(sample) == prefix_key(other) == prefix_key(earlier)
    assert prefix_key(turn) == prefix_key(later) != prefix_key(sample)
    assert prefix_key(PromptItem(key="k6", row_id="s", sample=0, ids=[1], turn=2)) != prefix_key(sample)


def test_pool_sends_a_prefix_to_its_server_unless_full(stack):
    servers = [stack.devserver("--token-latency", "0.01")[1] for _ in range(2)]

    def tick(counts):
        return {url: Route(2, SGLangBackend()) for url in servers}

    pool = InflightPool(servers=servers, on_tick=tick, affinity=PrefixAffinity())
    params = {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0.0}
    try:
        wait_for(lambda: pool.routable() and len(pool._free_servers()) == 2, timeout=10, what="routing")
        # Three of one prefix at once: two fill its server, the third takes the other's free ticket.
        futures = pool.submit_many(
            prompts=[([7, 8, i], params) for i in range(3)], timeout=60, tag="c", prefixes=["p"] * 3
        )
        urls = [future.result(timeout=30).url for future in futures]
        assert urls[0] == urls[1] != urls[2]
        for _ in range(3):  # alone now: always where the prefix went last
            (future,) = pool.submit_many(prompts=[([9], params)], timeout=60, tag="c", prefixes=["p"])
            assert future.result(timeout=30).url == urls[2]
    finally:
        pool.close()


def test_every_sample_of_a_prompt_goes_to_one_server(tmp_path, redis_server, stack, tokenizer_path):
    """`--n 4` on two servers, tickets to spare: a row's four samples share a server, and all but
    the first find the prompt in its cache."""
    rows = [
        {"id": f"s{i}", "messages": [{"role": "user", "content": f"Write a long story about harbour {i}. " * 8}]}
        for i in range(6)
    ]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = ["--campaign", "samples", "--tokenizer", str(tokenizer_path), "--n", "4", "--seed", "1"]
    cli("enqueue", str(path), *args, "--temperature", "0.8", "--batch-size", "8", "--redis", redis_server.url)
    servers = [stack.devserver("--token-latency", "0.005", "--mean-output-tokens", "20")[1] for _ in range(2)]
    out = tmp_path / "out"
    stack.worker(servers=servers, out=out, redis_url=redis_server.url, args=["--inflight", "32"])
    wait_finished(redis_server.url, "samples", expected=24, stack=stack, timeout=120)
    records = assert_exactly_once(redis_server.url, "samples", out / "samples", expected=24)
    by_row: dict[str, list] = {}
    for record in records.values():
        by_row.setdefault(record.id, []).append(record)
    assert all(len({r.server for r in samples}) == 1 for samples in by_row.values())
    assert {samples[0].server for samples in by_row.values()} == set(servers), "rows spread over both"
    assert all(sum(r.cached_tokens > 0 for r in samples) >= 3 for samples in by_row.values())
