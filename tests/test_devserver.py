"""The devserver, tested as clients meet it: real server processes on free ports, over HTTP.

All servers start at once (module fixture) because loading the tokenizer dominates the
runtime; each test then waits only for the server it uses.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import requests

from eagle_synth.devserver.faults import DROP, FAIL, FaultPlan
from eagle_synth.devserver.scheduler import BLOCK_TOKENS, PrefixCache
from tests.helpers import devserver_stats

# Every test here talks to the module's devserver processes.
pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
# Ids of the qwen3.5 fixture tokenizer (tests/fixture_tokenizer.py).
THINK, END_THINK, EOS, NEWLINE, BLANK_LINE = 248068, 248069, 248046, 198, 271
VOCAB = 248077
# A thinking-on prompt: "<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n<think>\n".
THINKING_PROMPT = [248045, 846, 198, 9419, 1543, 30, 248046, 198, 248045, 74455, 198, THINK, NEWLINE]
# The same with thinking off: the template closes an empty think block itself.
NO_THINK_PROMPT = THINKING_PROMPT + [NEWLINE, END_THINK, BLANK_LINE]
PLAIN_PROMPT = list(range(1000, 1040))
START_DEADLINE_S = 60.0
TIMEOUT = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


class Proc:
    """One `python -m eagle_synth.devserver` process with its log file.

    Parameters:
        args: devserver flags.
        tokenizer: the tokenizer folder it serves.
    """

    def __init__(self, *args: str, tokenizer: Path) -> None:
        self.port = _free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="devserver-", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        cmd = [
            sys.executable,
            "-m",
            "eagle_synth.devserver",
            "--tokenizer",
            str(tokenizer),
            "--host",
            HOST,
            "--port",
            str(self.port),
            *args,
        ]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def log_text(self) -> str:
        return Path(self.log.name).read_text()

    def wait_until(self, predicate, *, what: str, deadline_s: float = START_DEADLINE_S) -> None:
        deadline = time.monotonic() + deadline_s
        while not predicate():
            if self.proc.poll() is not None and what != "exit":
                pytest.fail(f"devserver exited ({self.proc.returncode}) waiting for {what}:\n{self.log_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}:\n{self.log_text()}")
            time.sleep(0.05)

    def ready(self) -> Proc:
        self.wait_until(lambda: _port_open(self.port), what="the port")
        return self

    def wait_exit(self, deadline_s: float = 10.0) -> int:
        self.wait_until(lambda: self.proc.poll() is not None, what="exit", deadline_s=deadline_s)
        return self.proc.returncode

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        os.unlink(self.log.name)

    def generate(self, input_ids, **body) -> requests.Response:
        return requests.post(self.url + "/generate", json={"input_ids": input_ids, **body}, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def fleet(tokenizer_path):
    proc = functools.partial(Proc, tokenizer=tokenizer_path)
    servers = {
        "lifecycle": proc("--startup-delay", "1", "--warmup", "2"),
        "main": proc(
            "--context-length",
            "4096",
            "--reasoning-parser",
            "qwen3",
            "--tool-call-parser",
            "qwen3_coder",
            "--mean-output-tokens",
            "60",
        ),
        # Token counts and timing are what the slot tests check; the prefix bug leaves both alone.
        "slow": proc(
            "--slots",
            "2",
            "--token-latency",
            "0.01",
            "--max-queued-requests",
            "2",
            "--prefix-bug",
            "3",
            "--skip-tokenizer-init",
        ),
        "faults": proc("--fail-rate", "0.25", "--drop-rate", "0.25", "--seed", "7"),
        # 2000 prefill tokens/s: a 1000-token prompt costs 0.5 s of the shared prefill engine.
        "prefill": proc("--charge-prefill", "--prefill-throughput", "2000", "--prefix-cache-tokens", "4096"),
        "oov": proc(),
        "die_after": proc("--die-after", "3"),
    }
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="module")
def main(fleet) -> Proc:
    return fleet["main"].ready()


def greedy(server: Proc, ids, **params):
    r = server.generate(ids, sampling_params={"temperature": 0, **params})
    assert r.status_code == 200, r.text
    return r.json()


# ---- lifecycle -------------------------------------------------------------------------------


def test_startup_delay_then_warmup_then_healthy(fleet):
    server = fleet["lifecycle"]
    server.wait_until(lambda: "loaded tokenizer" in server.log_text(), what="tokenizer load")
    loaded = time.monotonic()
    assert not _port_open(server.port), "port must stay closed during --startup-delay"
    server.ready()
    listening = time.monotonic()
    assert listening - loaded >= 0.8
    assert "devserver listening on http://" in server.log_text()

    assert requests.get(server.url + "/health", timeout=TIMEOUT).status_code == 503
    assert requests.get(server.url + "/health_generate", timeout=TIMEOUT).status_code == 503
    assert requests.get(server.url + "/get_model_info", timeout=TIMEOUT).status_code == 200
    assert server.generate(PLAIN_PROMPT).status_code == 200  # accepted while warming up

    server.wait_until(
        lambda: requests.get(server.url + "/health", timeout=TIMEOUT).status_code == 200,
        what="health 200",
        deadline_s=15,
    )
    assert time.monotonic() - listening >= 1.6
    assert requests.get(server.url + "/health_generate", timeout=TIMEOUT).status_code == 200
    stats = requests.get(server.url + "/dev/stats", timeout=TIMEOUT).json()
    assert stats["generate_calls_before_healthy"] == 1
    assert stats["generate_requests"] == 1
    assert stats["first_generate_at"] <= time.time()
    assert requests.post(server.url + "/dev/reset_stats", timeout=TIMEOUT).status_code == 200
    stats = requests.get(server.url + "/dev/stats", timeout=TIMEOUT).json()
    assert stats["generate_requests"] == 0 and stats["first_generate_at"] is None


# ---- shapes, determinism, finish reasons -----------------------------------------------------


def test_single_and_batch_shapes(main):
    one = greedy(main, PLAIN_PROMPT)
    assert set(one) == {"text", "output_ids", "meta_info"}
    meta = one["meta_info"]
    assert {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency"} <= set(meta)
    assert meta["prompt_tokens"] == len(PLAIN_PROMPT)
    assert meta["completion_tokens"] == len(one["output_ids"])

    batch = [PLAIN_PROMPT[:10], PLAIN_PROMPT[:20], PLAIN_PROMPT[:30]]
    r = main.generate(
        batch, rid=["a", "b", "c"], sampling_params=[{"max_new_tokens": k, "ignore_eos": True} for k in (3, 4, 5)]
    )
    items = r.json()
    assert isinstance(items, list) and len(items) == 3
    assert [i["meta_info"]["prompt_tokens"] for i in items] == [10, 20, 30]
    assert [i["meta_info"]["id"] for i in items] == ["a", "b", "c"]
    assert [len(i["output_ids"]) for i in items] == [3, 4, 5]


def test_generation_is_deterministic(main):
    a, b = greedy(main, PLAIN_PROMPT), greedy(main, PLAIN_PROMPT)
    assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
    long = greedy(main, PLAIN_PROMPT, max_new_tokens=300, ignore_eos=True)["output_ids"]
    short = greedy(main, PLAIN_PROMPT, max_new_tokens=10, ignore_eos=True)["output_ids"]
    assert short == long[:10]
    assert greedy(main, PLAIN_PROMPT[:-1])["output_ids"] != a["output_ids"]

    def sampled(seed):
        params = {"temperature": 0.8, "sampling_seed": seed, "max_new_tokens": 50}
        return main.generate(PLAIN_PROMPT, sampling_params=params).json()["output_ids"]

    assert sampled(1) == sampled(1)
    assert sampled(1) != sampled(2)


def test_finish_reasons(main):
    stop = greedy(main, PLAIN_PROMPT, max_new_tokens=3000)
    assert stop["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    assert stop["output_ids"][-1] == EOS  # the matched stop token is part of output_ids
    assert stop["output_ids"].count(EOS) == 1

    length = greedy(main, PLAIN_PROMPT, max_new_tokens=5)
    assert length["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert len(length["output_ids"]) == 5 and EOS not in length["output_ids"]

    n = len(stop["output_ids"]) + 20
    ignored = greedy(main, PLAIN_PROMPT, max_new_tokens=n, ignore_eos=True)
    assert ignored["meta_info"]["finish_reason"] == {"type": "length", "length": n}
    assert EOS not in ignored["output_ids"]

    body = stop["output_ids"][:-1]
    target = body[len(body) // 2]
    cut = body.index(target) + 1
    custom = greedy(main, PLAIN_PROMPT, max_new_tokens=3000, stop_token_ids=[target])
    assert custom["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert custom["output_ids"] == body[:cut]
    no_stop = greedy(main, PLAIN_PROMPT, max_new_tokens=cut + 5, stop_token_ids=[target], ignore_eos=True)
    assert no_stop["meta_info"]["finish_reason"]["type"] == "length"


def test_think_structure(main):
    out = greedy(main, THINKING_PROMPT, max_new_tokens=3000)["output_ids"]
    assert THINK not in out and out.count(END_THINK) == 1
    close = out.index(END_THINK)
    assert close > 0 and out[close + 1] == BLANK_LINE
    assert out[-1] == EOS and close + 2 < len(out) - 1  # an answer follows the reasoning

    plain = greedy(main, NO_THINK_PROMPT, max_new_tokens=3000)
    assert END_THINK not in plain["output_ids"] and plain["output_ids"][-1] == EOS
    assert "<|im_end|>" not in plain["text"]  # skip_special_tokens defaults to true


def test_n_samples_are_prompt_major(main):
    params = {"n": 3, "temperature": 0.9, "max_new_tokens": 30, "ignore_eos": True}
    items = main.generate([PLAIN_PROMPT[:11], PLAIN_PROMPT[:12]], rid=["p", "q"], sampling_params=params).json()
    assert [i["meta_info"]["prompt_tokens"] for i in items] == [11, 11, 11, 12, 12, 12]
    assert [i["meta_info"]["id"] for i in items] == ["p_0", "p_1", "p_2", "q_0", "q_1", "q_2"]
    assert len({tuple(i["output_ids"]) for i in items[:3]}) == 3  # samples differ
    single = main.generate(PLAIN_PROMPT, sampling_params={**params, "n": 2}).json()
    assert isinstance(single, list) and len(single) == 2


# ---- errors ----------------------------------------------------------------------------------


def test_context_length_is_a_400_for_the_whole_batch(main):
    r = main.generate(list(range(1, 4097)))
    assert r.status_code == 400
    message = "The input (4096 tokens) is longer than the model's context length (4096 tokens)."
    assert r.json() == {"error": {"message": message}}
    r = main.generate([PLAIN_PROMPT, list(range(1, 5001))])
    assert r.status_code == 400 and "(5000 tokens)" in r.json()["error"]["message"]
    r = main.generate(PLAIN_PROMPT, sampling_params={"max_new_tokens": 4096})
    assert r.status_code == 400 and "exceeds" in r.json()["error"]["message"]


def test_bad_requests(main):
    r = main.generate([])
    assert r.status_code == 400 and r.json()["error"]["message"] == "input_ids cannot be empty."
    r = main.generate(PLAIN_PROMPT, sampling_params={"seed": 1})  # 400 since SGLang 0.5.23 (500 before)
    assert r.status_code == 400 and r.json() == {"error": {"message": "Unexpected keyword argument 'seed'"}}
    for bad in (
        {"top_p": 0},
        {"top_k": 0},
        {"min_p": 1.5},
        {"max_new_tokens": -1},
        {"temperature": -1},
        {"repetition_penalty": 3},
    ):
        r = main.generate(PLAIN_PROMPT, sampling_params=bad)
        assert r.status_code == 400, (bad, r.text)
    assert main.generate([PLAIN_PROMPT, PLAIN_PROMPT], rid=["x", "x"]).status_code == 400
    assert greedy(main, PLAIN_PROMPT)  # the server survives all of it


def test_info_endpoints(main):
    for path in ("/get_server_info", "/server_info"):
        info = requests.get(main.url + path, timeout=TIMEOUT).json()
        assert info["reasoning_parser"] == "qwen3" and info["tool_call_parser"] == "qwen3_coder"
        assert info["skip_tokenizer_init"] is False and info["context_length"] == 4096
        assert info["model_path"] and info["version"]
    models = requests.get(main.url + "/v1/models", timeout=TIMEOUT).json()
    assert models["data"][0]["max_model_len"] == 4096
    assert requests.get(main.url + "/get_model_info", timeout=TIMEOUT).json()["is_generation"] is True


def test_prefix_cache_and_flush(main):
    prompt = list(range(2000, 2100))
    greedy(main, prompt, max_new_tokens=1)
    assert greedy(main, prompt, max_new_tokens=1)["meta_info"]["cached_tokens"] >= 80
    assert requests.post(main.url + "/flush_cache", timeout=TIMEOUT).status_code == 200
    assert greedy(main, prompt, max_new_tokens=1)["meta_info"]["cached_tokens"] == 0


def test_prefill_is_charged_per_uncached_token_on_one_shared_engine(fleet):
    server = fleet["prefill"].ready()
    requests.post(server.url + "/dev/reset_stats", timeout=TIMEOUT)
    two = [[4000 + i % 50, *range(1, 1000)] for i in range(2)]
    # Both admitted at once: the second waits for the first's prefill (0.5 s), then its own (0.5 s).
    assert server.generate(two, sampling_params={"max_new_tokens": 1}).status_code == 200
    stats = devserver_stats(server.url)
    assert stats["busy_slot_seconds"] == pytest.approx(1.5, abs=0.01)
    assert stats["prompt_tokens"] == 2000 and stats["cached_tokens"] == 0
    requests.post(server.url + "/dev/reset_stats", timeout=TIMEOUT)
    again = greedy(server, two[0], max_new_tokens=1)
    stats = devserver_stats(server.url)
    assert again["meta_info"]["cached_tokens"] == 992  # 62 whole blocks of 16
    assert stats["cached_tokens"] == 992 and stats["busy_slot_seconds"] == pytest.approx(8 / 2000, abs=0.005)


def test_prefix_cache_evicts_least_recently_used_leaves_under_its_budget(fleet):
    server = fleet["prefill"].ready()  # a budget of 4096 tokens: 256 blocks
    assert requests.post(server.url + "/flush_cache", timeout=TIMEOUT).status_code == 200
    first, second, third = ([9000 + k, *range(1, 1601)] for k in range(3))  # 100 blocks each
    for prompt in (first, second):
        greedy(server, prompt, max_new_tokens=1)
    assert greedy(server, first, max_new_tokens=1)["meta_info"]["cached_tokens"] == 1600  # used last
    greedy(server, third, max_new_tokens=1)  # 300 blocks > 256: the least recently used go
    assert greedy(server, first, max_new_tokens=1)["meta_info"]["cached_tokens"] == 1600
    assert greedy(server, second, max_new_tokens=1)["meta_info"]["cached_tokens"] < 1600


def test_prefix_cache_keeps_a_shared_prefix_while_its_branches_go():
    cache = PrefixCache(budget_tokens=10 * BLOCK_TOKENS)
    shared = list(range(1, 4 * BLOCK_TOKENS + 1))
    branch_a = shared + [7] * 3 * BLOCK_TOKENS
    branch_b = shared + [8] * 3 * BLOCK_TOKENS
    cache.insert(branch_a)
    cache.insert(branch_b)  # 10 blocks: full
    assert cache.lookup(branch_a + [0]) == 7 * BLOCK_TOKENS
    cache.insert(shared + [9] * 2 * BLOCK_TOKENS)  # 12 blocks: branch_b's two last leaves go
    assert cache.lookup(branch_b + [0]) == 5 * BLOCK_TOKENS  # the shared prefix and one block remain
    assert cache.lookup(branch_a + [0]) == 7 * BLOCK_TOKENS
    assert cache.lookup(shared + [1]) == 4 * BLOCK_TOKENS
    assert PrefixCache(budget_tokens=0).lookup(shared) == 0


def test_many_concurrent_connections(main):
    def one(i):
        with requests.Session() as s:
            r = s.post(main.url + "/generate", json={"input_ids": [5000 + i, 7, 8]}, timeout=30)
            return r.status_code

    with concurrent.futures.ThreadPoolExecutor(200) as pool:
        assert set(pool.map(one, range(300))) == {200}


# ---- slots, queue, abort ---------------------------------------------------------------------


def test_slots_queue_and_busy_time(fleet):
    slow = fleet["slow"].ready()
    params = {"max_new_tokens": 20, "ignore_eos": True}
    prompts = [[3000 + i, 1, 2] for i in range(5)]
    r = slow.generate(prompts, sampling_params=params)  # 2 run, 3 would wait > 2
    assert r.status_code == 503 and r.json()["message"] == "The request queue is full."
    requests.post(slow.url + "/dev/reset_stats", timeout=TIMEOUT)
    started = time.monotonic()
    assert slow.generate(prompts[:4], sampling_params=params).status_code == 200
    assert time.monotonic() - started >= 0.38  # two rounds of 20 tokens x 10 ms
    stats = requests.get(slow.url + "/dev/stats", timeout=TIMEOUT).json()
    assert stats["prompts"] == 4 and stats["output_tokens"] == 80 and stats["slots"] == 2
    assert stats["busy_slot_seconds"] == pytest.approx(0.8, abs=0.01)


def test_abort_request(fleet):
    slow = fleet["slow"].ready()
    result = {}
    params = {"max_new_tokens": 300, "ignore_eos": True}
    worker = threading.Thread(
        target=lambda: result.update(slow.generate([4000, 1], rid="victim", sampling_params=params).json())
    )
    worker.start()
    slow.wait_until(
        lambda: requests.get(slow.url + "/dev/stats", timeout=TIMEOUT).json()["running"] == 1,
        what="the request to run",
        deadline_s=5,
    )
    time.sleep(0.1)  # let it generate a few tokens before aborting
    assert requests.post(slow.url + "/abort_request", json={"rid": "victim"}, timeout=TIMEOUT).status_code == 200
    worker.join(TIMEOUT)
    assert result["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < result["meta_info"]["completion_tokens"] < 300


# ---- faults ----------------------------------------------------------------------------------


def test_fault_injection_is_seeded(fleet):
    server = fleet["faults"].ready()
    outcomes = []
    for _ in range(16):
        try:
            outcomes.append(server.generate(PLAIN_PROMPT).status_code)
        except requests.ConnectionError:
            outcomes.append("dropped")
    plan = FaultPlan(fail_rate=0.25, drop_rate=0.25, health_fail_rate=0, die_after=None, seed=7)
    expected = []
    for _ in range(16):
        action = plan.next_generate().action
        expected.append({FAIL: 500, DROP: "dropped"}.get(action, 200))
    assert outcomes == expected
    assert {200, 500, "dropped"} <= set(outcomes)
    stats = requests.get(server.url + "/dev/stats", timeout=TIMEOUT).json()
    assert stats["injected_failures"] == outcomes.count(500)
    assert stats["injected_drops"] == outcomes.count("dropped")


def test_out_of_vocab_id_kills_the_server(fleet):
    server = fleet["oov"].ready()
    assert server.generate(PLAIN_PROMPT).status_code == 200
    with pytest.raises(requests.ConnectionError):
        server.generate([1, 2, VOCAB])
    assert server.wait_exit() == 1
    assert not _port_open(server.port)
    assert "outside the vocabulary" in server.log_text()


def test_die_after(fleet):
    server = fleet["die_after"].ready()
    for _ in range(3):
        assert server.generate(PLAIN_PROMPT).status_code == 200
    assert server.wait_exit() == 1
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url + "/health", timeout=TIMEOUT)


def test_prefix_bug_and_skip_tokenizer_init(fleet):
    server = fleet["slow"].ready()
    item = greedy(server, PLAIN_PROMPT, max_new_tokens=5)
    assert "text" not in item
    completion = item["meta_info"]["completion_tokens"]
    assert len(item["output_ids"]) == completion + 3
    assert item["output_ids"][:3] == PLAIN_PROMPT[-3:]
    info = requests.get(server.url + "/get_server_info", timeout=TIMEOUT).json()
    assert info["skip_tokenizer_init"] is True
