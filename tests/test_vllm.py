"""vLLM as a second server: the sampling translation, the reply checks, detection, preflight and
the devserver's vLLM contract (pure functions and real HTTP to devserver processes), then whole
campaigns on a mixed fleet and on a vLLM server that caps max_tokens behind the campaign's back."""

from __future__ import annotations

import json

import pytest
import requests

from eagle_synth.devserver.faults import MALFORMED_SHAPES, malform_completion
from eagle_synth.errors import (
    BadRequest,
    BadResponse,
    BadSamplingParams,
    ConfigError,
    PreflightError,
    PromptMismatch,
    ReplyAborted,
    SamplingOverridden,
    Unauthorized,
    UntranslatableSampling,
)
from eagle_synth.payload import PromptItem
from eagle_synth.sampling import SamplingParams, ServerSampling
from eagle_synth.state.node_state import HEALTHY, REFUSED, ServerState
from eagle_synth.testing.harness import port_open, start_devserver, wait_for
from tests.conftest import chat_rows
from tests.helpers import (
    VLLM_API_KEY_STATUSES,
    api_key_statuses,
    assert_exactly_once,
    campaign,
    cli,
    devserver_stats,
    enqueue_rows,
    status_json,
    wait_finished,
)
from tests.test_preflight import gate_state
from workers.backends import BACKENDS, backend_for_state
from workers.backends.base import SGLANG, VLLM
from workers.backends.sglang import SGLangBackend
from workers.backends.vllm import PROBE_TOKENS, VllmBackend, parse_completion
from workers.config import WorkerConfig
from workers.replies import Sent
from workers.servers.client import ServerClient
from workers.servers.preflight import preflight_server
from workers.servers.transport import error_for_status, is_sampling_error

VOCAB = 248077
TIMEOUT = 10
PROMPT = [1000, 1001, 1002, 1003]
EOS = 248046
# The --api-key of the fleet's "keyed" server.
API_KEY = "sk-devserver-not-for-records"


def campaign_sampling(**changes) -> dict:
    return {
        **SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, **changes).for_server(),
        "sampling_seed": 1234,
    }


def reply(*, token_ids=(5, 6, EOS), prompt_ids=PROMPT, finish="stop", stop_reason=None, **usage) -> dict:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "x",
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "token_ids": list(token_ids),
                "prompt_logprobs": None,
                "prompt_token_ids": list(prompt_ids),
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(token_ids),
            "total_tokens": len(prompt_ids) + len(token_ids),
            "prompt_tokens_details": None,
            **usage,
        },
    }


def parse(item, *, max_tokens: int = 64):
    sent = Sent(
        PromptItem(key="k", row_id="r", sample=0, ids=PROMPT), sampling=ServerSampling({"max_new_tokens": max_tokens})
    )
    return parse_completion(item, vocab_size=VOCAB, sent=sent)


# ---- the sampling translation ----------------------------------------------------------------


def test_every_campaign_value_is_sent_in_vllms_names():
    body = VllmBackend(model="served").request(PROMPT, campaign_sampling(stop_token_ids=(7,)))[1]
    assert body == {
        "model": "served",
        "prompt": PROMPT,
        "max_tokens": 64,
        "min_tokens": 0,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "stop": [],
        "stop_token_ids": [7],
        "ignore_eos": False,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": True,
        "include_stop_str_in_output": False,
        "n": 1,
        "seed": 1234,
        "return_token_ids": True,
        "stream": False,
        "echo": False,
        "add_special_tokens": False,
    }


def test_a_partial_sampling_dict_means_what_it_means_on_sglang():
    # vLLM would take left-out fields from the model's generation config (max_tokens from 16):
    # the translation sends SGLang's defaults instead, so both servers read the same request.
    fields = VllmBackend().translate_sampling({"max_new_tokens": 5})
    assert fields["max_tokens"] == 5 and fields["temperature"] == 1.0 and fields["top_k"] == -1
    assert fields["skip_special_tokens"] is True and "seed" not in fields


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"stop_regex": ["x"]}, "no vLLM /v1/completions equivalent"),
        ({"temperature": 0.005}, "raises temperatures below 0.01"),
        ({"temperature": 3.0}, "at most 2.0"),
        ({"n": 2}, "n must be 1"),
    ],
)
def test_sampling_without_a_vllm_equivalent_is_refused_with_the_reason(changes, why):
    with pytest.raises(UntranslatableSampling, match=why) as caught:
        VllmBackend().translate_sampling({**campaign_sampling(), **changes})
    assert isinstance(caught.value, BadSamplingParams)  # handled as a refusal of the campaign's sampling
    assert SGLangBackend().translate_sampling(campaign_sampling()) == campaign_sampling()


# ---- the reply checks ------------------------------------------------------------------------


def test_finish_matched_is_the_stop_id_string_or_eos_as_on_sglang():
    eos = parse(reply())
    assert (eos.output_ids, eos.finish_reason, eos.finish_matched) == ([5, 6, EOS], "stop", EOS)
    assert parse(reply(token_ids=(5, 7), stop_reason=7)).finish_matched == 7
    assert parse(reply(token_ids=(5, 8), stop_reason="</s>")).finish_matched == "</s>"
    full = parse(reply(token_ids=range(10, 74), finish="length"))
    assert (full.finish_reason, full.finish_matched, full.completion_tokens) == ("length", None, 64)
    assert parse(reply(prompt_tokens_details={"cached_tokens": 3})).cached_tokens == 3


def test_a_prompt_the_server_changed_is_a_prompt_mismatch_naming_the_change():
    with pytest.raises(PromptMismatch, match="put 1 ids in front .*BOS"):
        parse(reply(prompt_ids=[151643, *PROMPT]))
    with pytest.raises(PromptMismatch, match="dropped the first 2"):
        parse(reply(prompt_ids=PROMPT[2:]))
    with pytest.raises(PromptMismatch, match="first difference at position 1"):
        parse(reply(prompt_ids=[1000, 9, 1002, 1003]))


def test_length_before_max_tokens_is_a_server_side_cap():
    with pytest.raises(SamplingOverridden, match="caps max_tokens"):
        parse(reply(token_ids=range(10, 26), finish="length"))


@pytest.mark.parametrize("shape", MALFORMED_SHAPES)
def test_malformed_replies_are_bad_responses(shape):
    with pytest.raises(BadResponse):
        parse(malform_completion(reply(), shape))


@pytest.mark.parametrize(
    "broken",
    [
        {"prompt_token_ids": None},
        {"finish_reason": None},
        {"finish_reason": "error"},
        {"stop_reason": [1]},
        {"token_ids": [5, VOCAB]},
    ],
)
def test_other_malformed_choices_are_bad_responses(broken):
    item = reply()
    item["choices"][0].update(broken)
    with pytest.raises(BadResponse):
        parse(item)
    with pytest.raises(BadResponse, match="completion_tokens"):
        parse(reply(completion_tokens=9))


def test_an_aborted_choice_is_asked_again():
    with pytest.raises(ReplyAborted):
        parse(reply(finish="abort", token_ids=()))


def test_vllm_errors_are_classified_like_sglang_ones():
    assert is_sampling_error("temperature must be in [0, 2], got 3.0.")
    assert is_sampling_error("min_tokens must be less than or equal to max_tokens=4, got 9.")
    assert is_sampling_error(
        "1 validation error: [{'loc': ('body', 'top_p'), 'msg': 'Input should be a valid number'}]"
    )
    assert not is_sampling_error("1 validation error: [{'loc': ('body', 'prompt'), 'msg': 'Input should be >= 0'}]")
    error = error_for_status(
        400,
        json.dumps(
            {
                "error": {
                    "message": "You passed 90 input tokens and requested 8 "
                    "output tokens. However, the model's context length is only 64 tokens",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
        ).encode(),
        path="/v1/completions",
        url="http://vllm:8000",
    )
    assert type(error) is BadRequest and "context length" in str(error)


def test_the_context_rule_is_each_servers_own():
    state = ServerState(context_length=64, backend=VLLM)
    assert VllmBackend().context_problem(prompt_len=56, max_new_tokens=8, state=state) is None
    assert "max_model_len" in VllmBackend().context_problem(prompt_len=57, max_new_tokens=8, state=state)
    # SGLang's scheduler keeps a token in hand and lowers max_new_tokens silently near the edge.
    assert SGLangBackend().context_problem(prompt_len=56, max_new_tokens=8, state=state) is not None


def test_backend_is_given_once_or_once_per_server():
    config = WorkerConfig(servers=("http://a", "http://b"), backend=("vllm", "sglang"))
    assert [config.backend_for(u) for u in config.servers] == ["vllm", "sglang"]
    assert WorkerConfig(servers=("http://a", "http://b"), backend=("vllm",)).backend_for("http://b") == "vllm"
    assert WorkerConfig(servers=("http://a",)).backend_for("http://a") == "auto"
    with pytest.raises(ConfigError, match="given 2 times for 3 servers"):
        WorkerConfig(servers=("http://a", "http://b", "http://c"), backend=("vllm", "sglang"))
    with pytest.raises(ConfigError, match="must be one of auto, sglang, vllm"):
        WorkerConfig(servers=("http://a",), backend=("tgi",))


# ---- against devservers speaking vLLM's API --------------------------------------------------


@pytest.fixture(scope="module")
def vllm_fleet(tmp_path_factory, tokenizer_path):
    logdir = tmp_path_factory.mktemp("vllm")
    specs = {
        "plain": ["--context-length", "64", "--served-model-name", "qwen-test"],
        "dev": [
            "--dev-mode",
            "--reasoning-parser",
            "qwen3",
            "--override-generation-config",
            json.dumps({"max_new_tokens": 4096, "temperature": 0.3}),
        ],
        "capped": ["--override-generation-config", json.dumps({"max_new_tokens": 2})],
        "no-tokenizer": ["--skip-tokenizer-init"],
        "sglang": ["--api", "sglang"],
        "keyed": ["--api-key", API_KEY],
    }
    servers = {
        name: start_devserver(
            tokenizer=tokenizer_path,
            logdir=logdir,
            wait=False,
            args=[*(["--api", "vllm"] if name != "sglang" else []), *args],
        )
        for name, args in specs.items()
    }
    for process, url in servers.values():
        port = int(url.rsplit(":", 1)[1])
        wait_for(lambda p=process, n=port: port_open(n) or not p.alive(), timeout=120, what=f"devserver {url}")
        assert process.alive(), process.log()
    yield {name: url for name, (_, url) in servers.items()}
    for process, _ in servers.values():
        process.stop()


def test_a_server_with_an_api_key_takes_the_workers_key_and_refuses_a_worker_without_it(vllm_fleet):
    """The devserver's vLLM API guards what vLLM does (tests/test_real_vllm.py holds real vLLM to
    the same statuses), and preflight refuses it (Unauthorized) without the key, or with another,
    naming the fix."""
    url = vllm_fleet["keyed"]
    assert api_key_statuses(url, API_KEY) == VLLM_API_KEY_STATUSES
    for key, says in ((None, "set EAGLE_SYNTH_SERVER_API_KEY to it"), ("sk-other", "is not the key")):
        with pytest.raises(Unauthorized, match=says) as refused:
            preflight_server(ServerClient(url, api_key=key))
        assert "401" in str(refused.value) and "sk-other" not in str(refused.value)
    assert preflight_server(ServerClient(url, api_key=API_KEY)).kind == VLLM


def test_the_devserver_answers_in_vllms_shapes(vllm_fleet):
    url = vllm_fleet["plain"]
    card = requests.get(f"{url}/v1/models", timeout=TIMEOUT).json()["data"][0]
    assert (card["id"], card["owned_by"], card["max_model_len"]) == ("qwen-test", "vllm", 64)
    assert requests.get(f"{url}/version", timeout=TIMEOUT).json() == {"version": "0.11.0"}
    assert requests.get(f"{url}/health", timeout=TIMEOUT).status_code == 200
    for path in ("/generate", "/server_info", "/get_model_info"):
        assert requests.get(f"{url}{path}", timeout=TIMEOUT).status_code == 404

    def post(**body):
        return requests.post(f"{url}/v1/completions", json={"prompt": PROMPT, **body}, timeout=TIMEOUT)

    wrong_model = post(model="other")
    assert wrong_model.status_code == 404
    assert wrong_model.json()["error"] == {
        "message": "The model `other` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    default = post(return_token_ids=True).json()["choices"][0]
    assert len(default["token_ids"]) <= 16 and default["prompt_token_ids"] == PROMPT  # max_tokens defaults to 16
    assert post().json()["choices"][0]["token_ids"] is None  # ids only when asked for
    too_long = post(prompt=list(range(1000, 1060)), max_tokens=8)
    assert too_long.status_code == 400 and "context length is only 64" in too_long.json()["error"]["message"]
    out_of_vocab = post(prompt=[VOCAB + 10], max_tokens=2)  # refused by vLLM, fatal only on SGLang
    assert out_of_vocab.status_code == 400 and "out of vocabulary" in out_of_vocab.text
    assert requests.get(f"{url}/health", timeout=TIMEOUT).status_code == 200
    mistyped = post(temperature="hot")
    assert mistyped.status_code == 400 and isinstance(
        error_for_status(400, mistyped.content, path="", url=url), BadSamplingParams
    )
    assert post(max_tokens=4, temperature=3.0).json()["error"]["message"] == "temperature must be in [0, 2], got 3.0."
    assert post(max_tokens=4, bogus_field=1).status_code == 200  # unknown fields are ignored, as vLLM does


def test_same_campaign_same_ids_on_either_api(vllm_fleet):
    sampling = campaign_sampling()
    generated = requests.post(
        f"{vllm_fleet['sglang']}/generate", json={"input_ids": PROMPT, "sampling_params": sampling}, timeout=TIMEOUT
    ).json()
    path, body = VllmBackend().request(PROMPT, sampling)
    # The dev server: its override (temperature 0.3) is beaten by the value every request sends.
    completed = requests.post(f"{vllm_fleet['dev']}{path}", json=body, timeout=TIMEOUT).json()
    assert completed["choices"][0]["token_ids"] == generated["output_ids"]


def test_detection_and_a_contradicting_backend(vllm_fleet):
    for name, kind in (("plain", VLLM), ("sglang", SGLANG)):
        checked = preflight_server(ServerClient(vllm_fleet[name]))
        assert (checked.kind, checked.accepted) == (kind, [])
        state = ServerState()
        BACKENDS[kind].apply_facts(state, checked.facts, accepted=[])
        assert state.backend == kind and state.provenance["backend"] == kind
    assert checked.facts.context_length == 32768
    with pytest.raises(PreflightError, match="--backend sglang was given for it, but it answers like vllm"):
        preflight_server(ServerClient(vllm_fleet["plain"]), forced=SGLANG)
    state = ServerState()
    VllmBackend.apply_facts(state, preflight_server(ServerClient(vllm_fleet["plain"])).facts, accepted=[])
    assert (state.context_length, state.sampling_seed_supported, state.provenance["served_model_name"]) == (
        64,
        True,
        "qwen-test",
    )
    backend = backend_for_state(state)
    assert isinstance(backend, VllmBackend) and backend.model == "qwen-test"


def test_dev_mode_settings_are_refused_by_name_then_accepted(vllm_fleet, redis_server):
    url = vllm_fleet["dev"]
    state, _ = gate_state(redis_server.url, url, allow_server_settings=())
    assert state.state == REFUSED
    assert "--allow-server-setting override_generation_config" in state.detail
    assert "caps every request's max_tokens at 4096" in state.detail
    assert "--allow-server-setting reasoning_parser" in state.detail
    state, _ = gate_state(
        redis_server.url, url, allow_server_settings=("override_generation_config",), allow_server_parsers=True
    )
    assert state.state == HEALTHY and state.backend == VLLM
    assert state.max_running_requests == 64  # scheduler_config.max_num_seqs, visible in dev mode
    assert state.provenance["launch_args_visible"] is True
    assert state.provenance["launch_args"]["model_config.override_generation_config"] == json.dumps(
        {"max_new_tokens": 4096, "temperature": 0.3}
    )
    assert [a.split(":")[0] for a in state.provenance["accepted_despite"]] == [
        "reasoning_parser",
        "override_generation_config",
    ]


def test_what_the_probe_shows_without_dev_mode(vllm_fleet):
    with pytest.raises(PreflightError, match=f"asked for exactly {PROBE_TOKENS} tokens"):
        preflight_server(ServerClient(vllm_fleet["capped"]))
    with pytest.raises(PreflightError, match="(?s)no text.*allow-server-setting skip_tokenizer_init"):
        preflight_server(ServerClient(vllm_fleet["no-tokenizer"]), allowed_settings=())
    accepted = preflight_server(ServerClient(vllm_fleet["no-tokenizer"]), allow_server_parsers=True).accepted
    assert [a.split(":")[0] for a in accepted] == ["skip_tokenizer_init"]


def test_worker_cli_refuses_a_backend_that_contradicts_the_server(vllm_fleet, tmp_path, redis_server):
    result = cli(
        "worker",
        "--server",
        vllm_fleet["plain"],
        "--backend",
        "sglang",
        "--out",
        str(tmp_path),
        "--redis",
        redis_server.url,
        check=False,
    )
    assert result.returncode == 2 and "answers like vllm" in result.stderr.decode()
    result = cli(
        "worker",
        "--server",
        vllm_fleet["plain"],
        "--server",
        vllm_fleet["sglang"],
        "--backend",
        "vllm",
        "--backend",
        "vllm",
        "--backend",
        "sglang",
        "--out",
        str(tmp_path),
        "--redis",
        redis_server.url,
        check=False,
    )
    assert result.returncode == 2 and "backend given 3 times for 2 servers" in result.stderr.decode()


# ---- whole campaigns ----------------------------------------------------------------------------


def test_one_worker_drives_sglang_and_vllm_together(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "mixed", chat_rows(24), tokenizer=tokenizer_path, batch_size=4)
    _, sglang_url = stack.devserver("--token-latency", "0.004", "--mean-output-tokens", "40", "--slots", "4")
    _, vllm_url = stack.devserver("--token-latency", "0.004", "--mean-output-tokens", "40", "--slots", "4", api="vllm")
    out = tmp_path / "out"
    stack.worker(
        servers=[sglang_url, vllm_url], out=out, redis_url=redis_server.url, concurrency=4, args=["--inflight", "4"]
    )
    wait_finished(redis_server.url, "mixed", expected=24, stack=stack)
    records = assert_exactly_once(redis_server.url, "mixed", out / "mixed", expected=24)
    by_backend = {kind: [r for r in records.values() if r.backend == kind] for kind in (SGLANG, VLLM)}
    assert by_backend[SGLANG] and by_backend[VLLM], "both servers took prompts"
    assert {r.server for r in by_backend[VLLM]} == {vllm_url}
    for record in records.values():  # each record is what its own server gives for its ids
        sglang = requests.post(
            f"{sglang_url}/generate",
            json={"input_ids": record.prompt_ids, "sampling_params": record.sampling},
            timeout=TIMEOUT,
        ).json()
        assert record.output_ids == sglang["output_ids"]
    kinds = {w["server"]: w["backend"] for w in status_json(redis_server.url, "mixed")["workers"]}
    assert kinds == {sglang_url: SGLANG, vllm_url: VLLM}
    servers = campaign(redis_server.url, "mixed").servers()
    assert {info["backend"] for info in servers.values()} == {SGLANG, VLLM}


def test_vllm_refusals_of_the_campaigns_sampling_are_recorded_once(tmp_path, redis_server, stack, tokenizer_path):
    """A campaign with no vLLM equivalent fails before anything is sent; a server capping
    max_tokens (no dev mode, so preflight cannot see it) is caught by the first reply."""
    _, url = stack.devserver(
        "--override-generation-config", json.dumps({"max_new_tokens": 16}), "--mean-output-tokens", "400", api="vllm"
    )
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, env={"EAGLE_SYNTH_BACKOFF_MAX": "0.05"})
    enqueue_rows(
        tmp_path, redis_server.url, "cold", chat_rows(8), tokenizer=tokenizer_path, batch_size=4, max_new_tokens=64
    )
    c = campaign(redis_server.url, "cold")
    wait_finished(redis_server.url, "cold", expected=8, stack=stack)
    assert_exactly_once(redis_server.url, "cold", out / "cold", expected=8)
    counts = c.failure_counts()
    assert set(counts) <= {"bad-sampling-params"} and sum(counts.values()) + c.progress().done == 8
    assert counts, "prompts longer than the cap end on length at 16 of the 64 tokens asked"
    assert "caps max_tokens" in next(c.iter_failures())[1].message

    from eagle_synth.sampling import SamplingParams as Params
    from eagle_synth.settings import broker_settings
    from producer.enqueue import EnqueueOptions, enqueue
    from tests.conftest import write_jsonl

    before = devserver_stats(url)["generate_requests"]
    path = write_jsonl(tmp_path / "tiny.jsonl", chat_rows(4))
    enqueue(
        EnqueueOptions(
            inputs=[str(path)],
            campaign="tiny",
            tokenizer=str(tokenizer_path),
            batch_size=4,
            sampling=Params(max_new_tokens=8, temperature=0.005),
            processes=1,
        ),
        broker=broker_settings(redis_url=redis_server.url),
    )
    wait_finished(redis_server.url, "tiny", expected=4, stack=stack)
    assert_exactly_once(redis_server.url, "tiny", out / "tiny", expected=4)
    tiny = campaign(redis_server.url, "tiny")
    assert tiny.failure_counts() == {"bad-sampling-params": 4}
    assert "raises temperatures below 0.01" in next(tiny.iter_failures())[1].message
    assert devserver_stats(url)["generate_requests"] == before, "nothing was sent"


def test_a_whole_number_sampling_value_samples_as_its_float(vllm_fleet):
    # vLLM's request model makes temperature, top_p and min_p floats, so `1` and `1.0` are one
    # request to it; the devserver's seeded sampling must not tell them apart either.
    url = vllm_fleet["plain"]
    body = {"prompt": PROMPT, "max_tokens": 12, "seed": 7, "return_token_ids": True, "top_p": 1, "min_p": 0}

    def ids(**sampling) -> list[int]:
        reply = requests.post(f"{url}/v1/completions", json=body | sampling, timeout=TIMEOUT)
        return reply.json()["choices"][0]["token_ids"]

    assert ids(temperature=1) == ids(temperature=1.0, top_p=1.0, min_p=0.0)
