"""The worker against a real vLLM server (CPU build) on a tiny random Qwen3 checkpoint.

Every other test runs on servers we wrote (the devserver); these hold the claims against
vLLM's own OpenAI server (tests/vllm_server.py): exact ids through the whole path, sampled
rows, a slow start, a server killed mid-campaign, vLLM's own refusals, `--history own`, a
tool row, preflight, and the model's padded vocabulary. Each whole-path test ends in the exact
accounting check. One server serves the session (tests/vllm_fixtures.py); the kill test starts
its own, and kills it. Prompts are few and short: on 2 cores the server generates a few hundred tokens/s.
"""

from __future__ import annotations

import functools
import json

import requests

from eagle_synth.errors import BadRequest
from eagle_synth.testing.harness import free_port, wait_for
from tests.conftest import write_jsonl
from tests.helpers import (
    VLLM_API_KEY_STATUSES,
    api_key_statuses,
    assert_exactly_once,
    campaign,
    cli,
    enqueue_rows,
    folder_text,
    redis_text,
    status_now,
    wait_finished,
)
from tests.tcp_forward import TcpForward
from tests.vllm_fixtures import MARKS
from tests.vllm_server import MAX_MODEL_LEN, SERVED_NAME
from workers.backends.base import VLLM
from workers.backends.vllm import VllmBackend
from workers.batch import classify_bad_request
from workers.servers.client import ServerClient
from workers.servers.preflight import preflight_server
from workers.servers.transport import error_for_status

pytestmark = MARKS

# Seconds a request to the real server may take (2 busy cores).
TIMEOUT = 120
# Tokens generated per prompt: enough to cross the padded vocabulary, little CPU.
NEW_TOKENS = 16


def user_rows(count: int, *, prefix: str = "q") -> list[dict]:
    rows = []
    for i in range(count):
        messages = [{"role": "user", "content": f"Question {i}: name a colour and the number {i * 13}."}]
        if i % 2:
            messages.insert(0, {"role": "system", "content": "You answer in one sentence."})
        rows.append({"id": f"{prefix}{i}", "messages": messages})
    return rows


@functools.cache
def plain_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def plain_template_ids(tokenizer_path, messages: list[dict], tools: list | None = None) -> list[int]:
    """apply_chat_template of plain transformers, nothing of ours in between."""
    plain = plain_tokenizer(str(tokenizer_path))
    return list(plain.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=False))


def fresh_ids(url: str, record, *, key: str | None = None) -> list[int]:
    """What the server generates now for the record's prompt and sampling (its seed included)."""
    path, body = VllmBackend(model=SERVED_NAME).request(record.prompt_ids, record.sampling)
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    reply = requests.post(f"{url}{path}", json=body, headers=headers, timeout=TIMEOUT)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["token_ids"]


def tokenizer_len(vllm_model) -> int:
    return json.loads((vllm_model / "tiny_qwen3.json").read_text())["tokenizer_tokens"]


def test_whole_path_ids_are_transformers_and_the_servers_own(
    tmp_path, redis_server, stack, real_vllm, vllm_model, tokenizer_path
):
    """Prompt ids equal plain transformers', outputs a fresh greedy call's; padded-vocabulary
    outputs are kept, and verify, inspect and vocab take them as legal (issue items 2 and 5)."""
    rows = user_rows(6)
    # The model folder as --tokenizer, as a user points at a checkpoint: its config.json says vocab_size.
    enqueue_rows(
        tmp_path, redis_server.url, "whole", rows, tokenizer=vllm_model, batch_size=3, max_new_tokens=NEW_TOKENS
    )
    out = tmp_path / "out"
    stack.worker(servers=[real_vllm.url], out=out, redis_url=redis_server.url)
    wait_finished(redis_server.url, "whole", expected=len(rows), timeout=600, stack=stack)
    records = assert_exactly_once(redis_server.url, "whole", out / "whole", expected=len(rows))
    assert campaign(redis_server.url, "whole").failure_counts() == {}
    by_id = {row["id"]: row for row in rows}
    for record in records.values():
        assert record.backend == VLLM and record.server == real_vllm.url
        assert record.prompt_ids == plain_template_ids(tokenizer_path, by_id[record.id]["messages"])
        assert record.output_ids == fresh_ids(real_vllm.url, record)
        assert record.completion_tokens == len(record.output_ids)
    size = tokenizer_len(vllm_model)
    padded = [r for r in records.values() if any(i >= size for i in r.output_ids)]
    assert padded, "the tiny model generates ids of its padded vocabulary; the records keep them"
    settings = campaign(redis_server.url, "whole").settings()
    assert settings is not None and settings.model_vocab_size > size == settings.vocab_size

    report = json.loads(cli("verify", str(out / "whole"), "--json").stdout)
    assert report["checks"]["id_out_of_vocab"]["count"] == 0
    assert report["settings"]["model_vocab_size"] == settings.model_vocab_size
    shown = cli("inspect", str(out / "whole"), padded[0].key).stdout.decode()
    assert "<padded id" in shown
    cli("vocab", str(out / "whole"), "--out", str(tmp_path / "vocab"), "--draft-vocab-size", "64")
    t2d = json.loads((tmp_path / "vocab" / "vocab_mapping.json").read_text())["t2d"]
    assert len(t2d) == settings.model_vocab_size, "vocab counts the padded ids the records hold"


def test_sampled_rows_with_n_2_carry_seeds_the_server_reproduces(tmp_path, redis_server, stack, real_vllm):
    from eagle_synth.sampling import SamplingParams
    from eagle_synth.settings import broker_settings
    from producer.enqueue import EnqueueOptions, enqueue

    rows = user_rows(3, prefix="s")
    path = write_jsonl(tmp_path / "sampled.jsonl", rows)
    enqueue(
        EnqueueOptions(
            inputs=[str(path)],
            campaign="sampled",
            tokenizer=str(real_vllm.model),
            batch_size=4,
            sampling=SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, top_p=1.0, n=2),
            processes=1,
        ),
        broker=broker_settings(redis_url=redis_server.url),
    )
    out = tmp_path / "out"
    stack.worker(servers=[real_vllm.url], out=out, redis_url=redis_server.url)
    wait_finished(redis_server.url, "sampled", expected=6, timeout=600, stack=stack)
    records = assert_exactly_once(redis_server.url, "sampled", out / "sampled", expected=6)
    assert campaign(redis_server.url, "sampled").failure_counts() == {}
    assert sorted(r.sample for r in records.values()) == [0, 0, 0, 1, 1, 1]
    seeds = {r.key: r.sampling.get("sampling_seed") for r in records.values()}
    assert all(isinstance(seed, int) for seed in seeds.values()) and len(set(seeds.values())) == 6
    for record in records.values():
        assert record.output_ids == fresh_ids(real_vllm.url, record), "a seeded re-request gives the record back"


def test_a_whole_number_sampling_value_samples_as_its_float(real_vllm):
    """vLLM's request model makes temperature, top_p and min_p floats: `1` and `1.0` sample the
    same ids under one seed (the devserver is held to the same in tests/test_vllm.py)."""
    body = {"model": SERVED_NAME, "prompt": [1, 2, 3, 4], "max_tokens": 8, "seed": 7, "return_token_ids": True}

    def ids(**sampling) -> list[int]:
        reply = requests.post(f"{real_vllm.url}/v1/completions", json=body | sampling, timeout=TIMEOUT)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["token_ids"]

    assert ids(temperature=1, top_p=1, min_p=0) == ids(temperature=1.0, top_p=1.0, min_p=0.0)


def test_prompt_over_the_context_is_recorded_prompt_too_long(tmp_path, redis_server, stack, real_vllm):
    """The worker fails it before sending (the server's max_model_len from /v1/models); vLLM's
    own 400 for such a prompt is what the worker records as prompt-too-long too."""
    long_text = " ".join(f"word{i}" for i in range(MAX_MODEL_LEN))
    rows = [*user_rows(2, prefix="ok"), {"id": "long", "messages": [{"role": "user", "content": long_text}]}]
    enqueue_rows(
        tmp_path,
        redis_server.url,
        "toolong",
        rows,
        tokenizer=real_vllm.model,
        batch_size=3,
        max_new_tokens=NEW_TOKENS,
        max_prompt_tokens=0,
    )
    out = tmp_path / "out"
    stack.worker(servers=[real_vllm.url], out=out, redis_url=redis_server.url)
    wait_finished(redis_server.url, "toolong", expected=3, timeout=600, stack=stack)
    records = assert_exactly_once(redis_server.url, "toolong", out / "toolong", expected=3)
    failures = dict(campaign(redis_server.url, "toolong").iter_failures())
    assert {r.id for r in records.values()} == {"ok0", "ok1"}
    (failure,) = failures.values()
    assert failure.reason == "prompt-too-long" and "max_model_len" in failure.message

    path, body = VllmBackend(model=SERVED_NAME).request(failure.item["ids"], {"max_new_tokens": NEW_TOKENS})
    status, raw = ServerClient(real_vllm.url).post_json(path, body, timeout=TIMEOUT)
    error = error_for_status(status, raw, path=path, url=real_vllm.url)
    assert status == 400 and isinstance(error, BadRequest)
    assert classify_bad_request(str(error)) == "prompt-too-long", str(error)


def test_own_history_conversations_and_a_tool_row(tmp_path, redis_server, stack, real_vllm, tokenizer_path):
    weather = {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    rows = [
        {
            "id": "conv",
            "messages": [
                {"role": "user", "content": "Tell me about 7."},
                {"role": "assistant", "content": "An old answer."},
                {"role": "user", "content": "And about 8?"},
            ],
        },
        {"id": "tool", "tools": [weather], "messages": [{"role": "user", "content": "Weather in Köln?"}]},
    ]
    enqueue_rows(
        tmp_path,
        redis_server.url,
        "own",
        rows,
        tokenizer=real_vllm.model,
        batch_size=2,
        max_new_tokens=NEW_TOKENS,
        history="own",
    )
    out = tmp_path / "out"
    stack.worker(servers=[real_vllm.url], out=out, redis_url=redis_server.url, args=["--render-processes", "1"])
    from tests.test_conversations import wait_conversations_finished

    status = wait_conversations_finished(redis_server.url, "own", stack=stack, timeout=600)
    records = assert_exactly_once(redis_server.url, "own", out / "own", expected=status["enqueued"])
    assert campaign(redis_server.url, "own").failure_counts() == {}
    turns = sorted((r.id, r.turn) for r in records.values())
    # The random model never writes EOS: each answer ends on length, which ends its conversation
    # (a cut answer is not history to build on), so every row has its first turn.
    assert turns == [("conv", 0), ("tool", 0)]
    assert {r.finish_reason for r in records.values()} == {"length"}
    first = {(r.id, r.turn): r for r in records.values()}
    assert first["conv", 0].prompt_ids == plain_template_ids(tokenizer_path, rows[0]["messages"][:1])
    assert first["tool", 0].prompt_ids == plain_template_ids(tokenizer_path, rows[1]["messages"], tools=[weather])
    for record in records.values():
        assert record.output_ids == fresh_ids(real_vllm.url, record)


def test_preflight_against_the_real_models_version_and_health(real_vllm, vllm_model):
    client = ServerClient(real_vllm.url)
    assert client.health(timeout=TIMEOUT)[0]
    checked = preflight_server(client)
    assert checked.kind == VLLM and checked.how == "/v1/models owned_by 'vllm'"
    facts = checked.facts
    assert facts.context_length == MAX_MODEL_LEN and facts.version == "0.32.0"
    assert facts.model_info["id"] == SERVED_NAME and facts.model_info["root"] == str(vllm_model)
    assert facts.probe["status"] == 200 and checked.accepted == []
    backend = VllmBackend.from_state(_applied(facts))
    assert backend.model == SERVED_NAME


def _applied(facts):
    from eagle_synth.state.node_state import ServerState

    state = ServerState()
    VllmBackend.apply_facts(state, facts, accepted=[])
    return state


def test_a_campaign_of_another_model_never_reaches_the_real_server(
    tmp_path, redis_server, stack, real_vllm, tokenizer_path
):
    """A shared fleet (issue 34): one worker with the real vLLM and a devserver of another model
    (a tokenizer trained on the spot), two campaigns, one of each model. The real server's
    /tokenize tells the campaigns apart: each campaign's records come from its own model's
    server only, the real server is never refused, both end exactly once."""
    from eagle_synth.demo.tokenizer import build_demo_tokenizer
    from eagle_synth.testing.harness import start_devserver

    other = build_demo_tokenizer(tmp_path / "other-tokenizer")
    enqueue_rows(tmp_path, redis_server.url, "other", user_rows(4, prefix="o"), tokenizer=other, batch_size=2,
                 max_new_tokens=NEW_TOKENS)  # fmt: skip
    enqueue_rows(tmp_path, redis_server.url, "own", user_rows(4), tokenizer=tokenizer_path, batch_size=2,
                 max_new_tokens=NEW_TOKENS)  # fmt: skip
    devserver, other_url = start_devserver(tokenizer=other, logdir=stack.logdir, args=["--api", "vllm"])
    stack.others.append(devserver)
    out = tmp_path / "out"
    stack.worker(servers=[real_vllm.url, other_url], out=out, redis_url=redis_server.url)
    wait_finished(redis_server.url, "own", expected=4, stack=stack, timeout=300)
    wait_finished(redis_server.url, "other", expected=4, stack=stack, timeout=300)
    own = assert_exactly_once(redis_server.url, "own", out / "own", expected=4)
    theirs = assert_exactly_once(redis_server.url, "other", out / "other", expected=4)
    assert {r.server for r in own.values()} == {real_vllm.url}
    assert {r.server for r in theirs.values()} == {other_url}
    shown = status_now(redis_server.url, "other")
    assert {w["server"]: w["state"] for w in shown["workers"]} == {real_vllm.url: "healthy", other_url: "healthy"}
    (why,) = shown["not_served"]
    assert why["server"] == real_vllm.url and "does not match campaign 'other'" in why["detail"]
    assert str(real_vllm.model) in why["detail"] and str(other) in why["detail"]
    logged = [line for line in stack.logs().splitlines() if "does not match campaign 'other'" in line]
    assert len(logged) == 1, logged


def test_worker_before_the_server_then_the_server_killed_and_restarted(
    tmp_path, redis_server, stack, own_vllm, real_vllm, vllm_model
):
    """A real slow start costs no prompt, retry or failure; a server killed mid-campaign shows
    as gone down after serving, and the campaign finishes once it is back, exactly once.

    The server that comes back at the worker's port is the session's vLLM behind a TCP
    forwarder (tests/tcp_forward.py): the same model, real vLLM replies, and one cold start
    of the server saved (2-5 minutes of 2 cores)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rows = user_rows(16, prefix="k")
    enqueue_rows(tmp_path, redis_server.url, "kill", rows, tokenizer=vllm_model, batch_size=2, max_new_tokens=48)
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url)
    c = campaign(redis_server.url, "kill")

    def state_of() -> dict | None:
        return next((w for w in status_now(redis_server.url, "kill")["workers"] if w["server"] == url), None)

    wait_for(
        lambda: (state_of() or {}).get("state") == "loading", timeout=60, what="the worker to see nothing listening"
    )
    server = own_vllm(port=port, wait=False)
    wait_for(lambda: c.progress().done >= 3, timeout=600, interval=0.5, what="the first records")
    assert c.failure_counts() == {}, "the slow start burned nothing"
    server.kill()
    went_down = wait_for(
        lambda: (s := state_of()) and s["state"] == "loading" and "went down" in s["detail"] and s,
        timeout=60,
        what="status to show the server went down",
    )
    assert "right after serving" in went_down["detail"]
    done_at_kill = c.progress().done
    assert done_at_kill < len(rows), "killed mid-campaign"
    forward = TcpForward(port, real_vllm.port)
    try:
        wait_finished(redis_server.url, "kill", expected=len(rows), timeout=600, stack=stack)
    finally:
        forward.close()
    records = assert_exactly_once(redis_server.url, "kill", out / "kill", expected=len(rows))
    assert c.failure_counts() == {} and len(records) == len(rows)


def test_a_server_with_an_api_key_takes_the_workers_key_and_refuses_a_worker_without_it(
    tmp_path, redis_server, stack, own_vllm, vllm_model
):
    """vLLM started with --api-key: what it guards (the devserver's vLLM API is held to the same
    in tests/test_vllm.py); a worker without the key, or with another, is refused at start
    (exit 2, one line naming EAGLE_SYNTH_SERVER_API_KEY); with it the whole path is exact, and
    the key is in no log, Redis value, record or manifest."""
    key = "sk-vllm-test-not-for-records"
    server = own_vllm(extra=("--api-key", key))
    assert api_key_statuses(server.url, key) == VLLM_API_KEY_STATUSES
    rows = user_rows(4, prefix="key")
    enqueue_rows(tmp_path, redis_server.url, "key", rows, tokenizer=vllm_model, batch_size=2, max_new_tokens=NEW_TOKENS)
    out = tmp_path / "out"
    start = ("worker", "--server", server.url, "--out", str(out), "--redis", redis_server.url)
    for given, says in (("", "set EAGLE_SYNTH_SERVER_API_KEY to it"), ("sk-other", "is not the key")):
        refused = cli(*start, check=False, env={"EAGLE_SYNTH_SERVER_API_KEY": given})
        stderr = refused.stderr.decode()
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert refused.returncode == 2 and len(errors) == 1, stderr
        assert says in errors[0] and "401" in errors[0] and (not given or given not in stderr), stderr
    worker = stack.worker(
        servers=[server.url], out=out, redis_url=redis_server.url, env={"EAGLE_SYNTH_SERVER_API_KEY": key}
    )
    wait_finished(redis_server.url, "key", expected=len(rows), timeout=600, stack=stack)
    records = assert_exactly_once(redis_server.url, "key", out / "key", expected=len(rows))
    assert campaign(redis_server.url, "key").failure_counts() == {}
    for record in records.values():
        assert record.output_ids == fresh_ids(server.url, record, key=key)
    c = campaign(redis_server.url, "key")
    for where, text in (("log", worker.log()), ("Redis", redis_text(c.client)), ("--out", folder_text(out))):
        assert key not in text, f"the API key is in the {where}"
