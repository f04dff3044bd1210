"""Preflight: server settings that would change the records are refused or recorded; secrets
never reach provenance; the context check counts what SGLang counts; sampling 400s are told
apart from one bad prompt.

Pure functions first, then the same against real devserver processes over HTTP, driving
workers.servers.health.HealthGate (the worker's preflight) with a private redis-server.
"""

from __future__ import annotations

import json
import re
import time

import msgspec
import pytest
import requests

from eagle_synth.errors import BadRequest, BadSamplingParams, ConfigError, PreflightError, PromptMismatch
from eagle_synth.manifest import build_manifest
from eagle_synth.payload import PromptItem
from eagle_synth.sampling import SamplingParams
from eagle_synth.settings import broker_settings
from eagle_synth.state.campaign import Campaign
from eagle_synth.state.node_state import HEALTHY, REFUSED, NodeState, ServerState
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import free_port, port_open, start_devserver, wait_for
from workers.backends.base import redact_url
from workers.backends.sglang import (
    PROVENANCE_LAUNCH_ARGS,
    SGLangBackend,
    draft_reserved_tokens,
    provenance,
)
from workers.config import WorkerConfig, auto_inflight
from workers.replies import Sent, parse_generate_item
from workers.servers.client import ServerClient, ServerFacts, positive_int
from workers.servers.health import HealthGate
from workers.servers.model_check import ModelCheck
from workers.servers.preflight import check_server
from workers.servers.routing import CampaignRouter
from workers.servers.transport import error_for_status, is_sampling_error

SECRET, ADMIN_SECRET = "sk-live-not-for-records", "admin-not-for-records"
VOCAB = 248077
TIMEOUT = 10


def facts(
    server_info: dict | None = None, model_info: dict | None = None, *, context_length=4096, url="http://gpu-1:30000"
) -> ServerFacts:
    return ServerFacts(
        url=url,
        server_info={"version": "0.5.23", **(server_info or {})},
        model_info={"is_generation": True, **(model_info or {})},
        context_length=context_length,
        version="0.5.23",
    )


# ---- refusals, pure -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "setting", "says"),
    [
        ({"reasoning_parser": "deepseek-r1"}, "reasoning_parser", "reasoning parser"),
        ({"tool_call_parser": "qwen25"}, "tool_call_parser", "tool-call parser"),
        ({"skip_tokenizer_init": True}, "skip_tokenizer_init", "skips its tokenizer"),
        ({"allow_auto_truncate": True}, "allow_auto_truncate", "cuts prompts"),
        ({"preferred_sampling_params": '{"logit_bias": {"5": 2.0}}'}, "preferred_sampling_params", "logit_bias"),
        ({"preferred_sampling_params": {"json_schema": "{}"}}, "preferred_sampling_params", "json_schema"),
        ({"preferred_sampling_params": "{not json"}, "preferred_sampling_params", "not JSON"),
    ],
)
def test_each_refused_setting_names_itself_and_its_override(info, setting, says):
    with pytest.raises(PreflightError) as caught:
        check_server(facts(info), allowed_settings=())
    message = str(caught.value)
    assert says in message and f"--allow-server-setting {setting}" in message
    assert check_server(facts(info), allowed_settings={setting}) == [
        check_server(facts(info), allowed_settings=set(SGLangBackend.checks))[0]
    ]


def test_not_a_generation_model_is_refused():
    with pytest.raises(PreflightError, match="not a generation model"):
        check_server(facts(model_info={"is_generation": False}), allowed_settings=())


def test_allow_server_parsers_accepts_only_the_parser_settings():
    parsers = facts({"reasoning_parser": "qwen3", "tool_call_parser": "qwen25", "skip_tokenizer_init": True})
    assert len(check_server(parsers, allow_server_parsers=True, allowed_settings=())) == 3
    with pytest.raises(PreflightError, match="allow_auto_truncate") as caught:
        check_server(
            facts({"reasoning_parser": "qwen3", "allow_auto_truncate": True}),
            allow_server_parsers=True,
            allowed_settings=(),
        )
    assert "reasoning parser" not in str(caught.value)


def test_preferred_params_we_always_send_are_harmless():
    # SGLang merges them UNDER the request's own; we send every one of these keys.
    preferred = {
        "temperature": 0.2,
        "top_p": 0.5,
        "max_new_tokens": 7,
        "frequency_penalty": 1.0,
        "min_new_tokens": 3,
        "stop": ["x"],
        "ignore_eos": True,
        "sampling_seed": 5,
        "n": 2,
    }
    assert check_server(facts({"preferred_sampling_params": json.dumps(preferred)}), allowed_settings=()) == []
    assert set(preferred) <= set(SamplingParams().for_server()) | {"sampling_seed"}


def test_allowed_settings_come_from_the_environment(monkeypatch):
    env = WorkerConfig.env_name("allow_server_settings")
    monkeypatch.setenv(env, " allow_auto_truncate , preferred_sampling_params,no_such_thing")
    with pytest.raises(ConfigError, match="no_such_thing"):
        WorkerConfig.load()
    monkeypatch.setenv(env, " allow_auto_truncate , preferred_sampling_params")
    assert set(WorkerConfig.load().allow_server_settings) >= {"allow_auto_truncate", "preferred_sampling_params"}
    monkeypatch.delenv(env)
    assert WorkerConfig.load().allow_server_settings == ()


# ---- provenance, pure ----------------------------------------------------------------------


def test_provenance_is_an_allow_list_without_secrets():
    info = {
        "api_key": SECRET,
        "admin_api_key": ADMIN_SECRET,
        "ssl_keyfile_password": "pw",
        "hf_token": "hf_x",
        "some_new_flag_2027": "??",
        "model_path": "/m/qwen",
        "tp_size": 2,
        "json_model_override_args": "{}",
        "lora_paths": ["/l"],
        "max_running_requests": 96,
    }
    kept = provenance(facts(info, url="http://ops:hunter2@gpu-1:30000"), accepted=["x: y"])
    text = json.dumps(kept)
    for secret in (SECRET, ADMIN_SECRET, "hunter2", "hf_x", '"pw"'):
        assert secret not in text
    assert set(kept["launch_args"]) <= set(PROVENANCE_LAUNCH_ARGS)
    assert kept["launch_args"]["model_path"] == "/m/qwen" and kept["launch_args"]["max_running_requests"] == 96
    assert kept["url"] == "http://ops:***@gpu-1:30000" and kept["accepted_despite"] == ["x: y"]


def test_no_allow_listed_argument_looks_like_a_secret():
    looks_secret = re.compile(r"key|password|secret|credential|token$|auth", re.IGNORECASE)
    assert [name for name in PROVENANCE_LAUNCH_ARGS if looks_secret.search(name)] == []


def test_redact_url():
    assert redact_url("http://gpu:30000") == "http://gpu:30000"
    assert redact_url("https://u:p@gpu:8443/x") == "https://u:***@gpu:8443/x"


# ---- the context check, pure ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "reserved"),
    [
        ({}, 0),
        (
            {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
            },
            4,
        ),
        (
            {
                "speculative_algorithm": "EAGLE3",
                "speculative_num_steps": 5,
                "speculative_eagle_topk": 8,
                "speculative_num_draft_tokens": 32,
            },
            40,
        ),
        (
            {
                "speculative_algorithm": "nextn",
                "speculative_num_steps": 1,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 2,
            },
            2,
        ),
        (
            {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
                "max_speculative_num_draft_tokens": 16,
            },
            16,
        ),
        ({"speculative_algorithm": "STANDALONE", "speculative_num_steps": 3, "speculative_num_draft_tokens": 4}, 0),
        ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 12}, 0),
        (
            {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": None,
                "speculative_eagle_topk": None,
                "speculative_num_draft_tokens": None,
            },
            0,
        ),
    ],
)
def test_draft_reserved_tokens_follow_sglang(info, reserved):
    assert draft_reserved_tokens(info) == reserved


@pytest.mark.parametrize(
    ("prompt", "max_new", "state", "fits"),
    [
        (100, 28, ServerState(context_length=130), True),  # 100 + 28 <= 130 - 2
        (100, 29, ServerState(context_length=130), False),  # passes SGLang's 400 check, but cut to 28
        (100, 30, ServerState(context_length=130), False),  # 400
        (100, 24, ServerState(context_length=130, draft_reserved_tokens=6), True),
        (100, 25, ServerState(context_length=130, draft_reserved_tokens=6), False),  # 400: 100 + 6 + 25 > 130
        (124, 1, ServerState(context_length=130, max_req_input_len=124), False),  # the scheduler's input cap
        (123, 1, ServerState(context_length=130, max_req_input_len=124), True),
        (100, 20, ServerState(context_length=130, max_total_num_tokens=111), False),  # a small KV cache
        (100, 9, ServerState(context_length=130, max_total_num_tokens=111), True),
        (10**6, 10**6, ServerState(context_length=None), True),  # unknown: the server decides
    ],
)
def test_fits_context(prompt, max_new, state, fits):
    problem = SGLangBackend().context_problem(prompt_len=prompt, max_new_tokens=max_new, state=state)
    assert (problem is None) is fits
    if not fits:
        assert str(prompt) in problem


def test_limits_from_facts_and_from_the_node_state():
    info = {
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 2,
        "speculative_eagle_topk": 2,
        "speculative_num_draft_tokens": 3,
        "max_req_input_len": 4090,
        "max_total_num_tokens": 2000,
    }
    f = ServerFacts(
        url="u", server_info=info, model_info={}, context_length=4096, version=None, max_total_num_tokens=2000
    )
    kept = ServerState()
    SGLangBackend.apply_facts(kept, f, accepted=[])
    limits = (kept.context_length, kept.draft_reserved_tokens, kept.max_req_input_len, kept.max_total_num_tokens)
    assert limits == (4096, 4, 4090, 2000)
    state = ServerState(context_length=4096, draft_reserved_tokens=4, max_req_input_len=4090, max_total_num_tokens=2000)
    # The scheduler's max_req_len is min(4096, 2000) - 1 = 1999: 1990 + 8 + 1 fits, 1990 + 9 + 1 is cut to 8.
    for limited in (kept, state):
        assert SGLangBackend().context_problem(prompt_len=1990, max_new_tokens=8, state=limited) is None
        cut = SGLangBackend().context_problem(prompt_len=1990, max_new_tokens=9, state=limited)
        assert cut is not None and "lower max_new_tokens to 8" in cut


def test_server_state_round_trips_and_ignores_fields_it_does_not_know(redis_server):
    state = ServerState(
        state=HEALTHY,
        since=1.0,
        context_length=64,
        draft_reserved_tokens=4,
        max_req_input_len=58,
        max_running_requests=8,
        max_total_num_tokens=512,
        deterministic_inference=True,
        sampling_seed_supported=True,
        provenance={"version": "0.5.23"},
    )
    node = NodeState(connect(broker_settings(redis_url=redis_server.url)), "w@here")
    node.publish({"http://a:1": state}, consuming=True)
    newer = json.dumps({**msgspec.structs.asdict(state), "added_in_2027": 1})
    node.client.hset(node.key, mapping={"state:http://b:2": newer, "state:http://c:3": json.dumps({"state": HEALTHY})})
    states = node.states()
    assert states["http://a:1"] == state and states["http://b:2"] == state
    assert states["http://c:3"] == ServerState(state=HEALTHY)  # written by an older worker


# ---- sampling 400s, pure --------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        "Unexpected keyword argument 'seed'",
        "SamplingParams.__init__() got an unexpected keyword argument 'seed'",
        "Expected `float`, got `str` - at `$.sampling_params.temperature`",
        "'<' not supported between instances of 'str' and 'float'",
        "top_p must be in (0, 1], got 0.0.",
        "top_k must be -1 (disable) or at least 1, got 0.",
        "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 3.0.",
        "min_new_tokens must be in [0, max_new_tokens(4)], got 9.",
        "max_new_tokens must be at least 0, got -1.",
        "logit_bias must has keys in [0, 151935], got 999999.",
        "Only one of regex, json_schema, or ebnf can be set.",
    ],
)
def test_sampling_400s_are_recognised(message):
    assert is_sampling_error(message)


@pytest.mark.parametrize(
    "message",
    [
        "The input (4096 tokens) is longer than the model's context length (4096 tokens).",
        (
            "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of "
            "4100 tokens: 40 tokens from the input messages and 4060 tokens for the completion. Please reduce the number "
            "of tokens in the input messages or the completion to fit within the limit."
        ),
        (
            "Input length (58 tokens) exceeds the maximum allowed length (58 tokens). Use a shorter input or enable "
            "--allow-auto-truncate."
        ),
        "input_ids cannot be empty.",
        "Expected `int`, got `str` - at `$.input_ids[0][3]`",
        "Duplicate rids are not allowed in one batch request.",
    ],
)
def test_prompt_400s_are_not_sampling_errors(message):
    assert not is_sampling_error(message)


def test_a_capacity_the_server_reports_is_a_positive_int_or_unknown():
    # Infinity and NaN are JSON numbers to json.loads: a server reporting one is "unknown", not a crash.
    reported = json.loads('[8, 8.0, "8", 8.5, 0, -3, true, null, "eight", Infinity, -Infinity, NaN, [8]]')
    assert [positive_int(value) for value in reported] == [
        8,
        8,
        8,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    ]


# ---- against real devservers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tokenizer_path):
    logdir = tmp_path_factory.mktemp("preflight")
    specs = {
        "accepted": [
            "--api-key",
            SECRET,
            "--admin-api-key",
            ADMIN_SECRET,
            "--enable-deterministic-inference",
            "--preferred-sampling-params",
            json.dumps({"temperature": 0.2, "top_p": 0.5}),
            "--slots",
            "12",
        ],
        "refused": [
            "--context-length",
            "64",
            "--allow-auto-truncate",
            "--reasoning-parser",
            "deepseek-r1",
            "--preferred-sampling-params",
            json.dumps({"logit_bias": {"5": 2.0}, "temperature": 0.3}),
        ],
        "spec": [
            "--context-length",
            "64",
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-num-steps",
            "2",
            "--speculative-eagle-topk",
            "2",
            "--speculative-num-draft-tokens",
            "3",
        ],
        "plain": ["--context-length", "64"],
    }
    servers = {
        name: start_devserver(tokenizer=tokenizer_path, logdir=logdir, args=args, wait=False)
        for name, args in specs.items()
    }
    for process, url in servers.values():
        port = int(url.rsplit(":", 1)[1])
        wait_for(lambda p=process, n=port: port_open(n) or not p.alive(), timeout=120, what=f"devserver {url}")
        assert process.alive(), process.log()
    yield {name: url for name, (_, url) in servers.items()}
    for process, _ in servers.values():
        process.stop()


def gate_state(redis_url: str, url: str, **gate_options) -> tuple[ServerState, NodeState]:
    """Run the worker's health gate against one server until preflight decided."""
    node = NodeState(connect(broker_settings(redis_url=redis_url)), f"t{time.monotonic_ns()}@here")
    config = WorkerConfig(servers=(url,), **gate_options)
    router = CampaignRouter(client=node.client, base_queue="eagle-synth", check=ModelCheck({}))
    gate = HealthGate(config=config, node_state=node, router=router, on_consume=print, on_stop=print)
    deadline = time.monotonic() + 30
    while gate.tracked[url].state.state not in (HEALTHY, REFUSED):
        assert time.monotonic() < deadline, gate.tracked[url].state
        gate.tick()
        time.sleep(0.05)
    gate._publish()
    return node.states()[url], node


def test_secrets_never_reach_provenance_redis_or_the_manifest(fleet, redis_server):
    url = fleet["accepted"]
    state, node = gate_state(redis_server.url, url, allow_server_settings=(), server_api_key=SECRET)
    assert state.state == HEALTHY, state.detail
    assert state.deterministic_inference is True and state.sampling_seed_supported is True
    assert state.max_running_requests == 12 and state.max_total_num_tokens == 12 * 32768
    assert state.provenance["preferred_sampling_params"] == {"temperature": 0.2, "top_p": 0.5}
    assert state.provenance["preferred_sampling_params_applied"] == []  # both overridden by ours
    assert state.provenance["launch_args"]["enable_deterministic_inference"] is True
    client = node.client
    campaign = Campaign(client, "prov")
    campaign.note_server(url, state.provenance)
    manifest = json.dumps(build_manifest(campaign), default=str)
    everything = json.dumps({k.decode(): v.decode() for k, v in client.hgetall(node.key).items()})
    everything += json.dumps({k.decode(): v.decode() for k, v in client.hgetall(campaign.keys.servers).items()})
    for text in (json.dumps(state.provenance), everything, manifest):
        assert SECRET not in text and ADMIN_SECRET not in text
    assert "api_key" not in state.provenance["launch_args"]


def test_refused_server_names_every_setting_then_accepted_by_name(fleet, redis_server, monkeypatch):
    url = fleet["refused"]
    env = WorkerConfig.env_name("allow_server_settings")
    monkeypatch.delenv(env, raising=False)
    state, _ = gate_state(redis_server.url, url)  # WorkerConfig reads the environment, as the worker does
    assert state.state == REFUSED
    for setting in ("allow_auto_truncate", "preferred_sampling_params", "reasoning_parser"):
        assert f"--allow-server-setting {setting}" in state.detail
    assert "logit_bias" in state.detail and "temperature" not in state.detail.split("would apply")[1][:40]

    monkeypatch.setenv(env, "allow_auto_truncate,preferred_sampling_params")
    state, _ = gate_state(redis_server.url, url)
    assert state.state == REFUSED and "reasoning parser" in state.detail and "allow_auto_truncate" not in state.detail

    state, _ = gate_state(redis_server.url, url, allow_server_parsers=True)
    assert state.state == HEALTHY
    accepted = state.provenance["accepted_despite"]
    assert [a.split(":")[0] for a in accepted] == [
        "reasoning_parser",
        "allow_auto_truncate",
        "preferred_sampling_params",
    ]
    assert state.provenance["preferred_sampling_params_applied"] == ["logit_bias"]
    assert state.provenance["launch_args"]["allow_auto_truncate"] is True


def test_preflight_at_start_sorts_every_server_into_one_list(fleet):
    from workers.backends.base import AUTO
    from workers.servers.preflight import preflight_at_start as at_start

    def preflight_at_start(servers, **kwargs):
        return at_start(servers, forced=lambda url: AUTO, **kwargs)

    down = f"http://127.0.0.1:{free_port()}"
    found = preflight_at_start(
        [fleet["accepted"], fleet["refused"], down], allow_server_parsers=False, allowed_settings=(), api_key=SECRET
    )
    assert found.capacities == [12] and found.inflight() == auto_inflight(12)
    assert len(found.refused) == 1 and found.refused[0].startswith(f"refusing server {fleet['refused']}")
    assert [url for url, _ in found.not_answering] == [down]
    assert not found.all_refused
    alone = preflight_at_start([fleet["refused"]], allow_server_parsers=False, allowed_settings=())
    assert alone.all_refused and alone.inflight() == auto_inflight(None)
    accepted = preflight_at_start(
        [fleet["refused"]],
        allow_server_parsers=True,
        allowed_settings=("allow_auto_truncate", "preferred_sampling_params"),
    )
    assert not accepted.refused and len(accepted.capacities) == 1


def test_client_uses_current_info_endpoints_and_reads_capacity(fleet):
    url = fleet["spec"]
    before = requests.get(url + "/dev/stats", timeout=TIMEOUT).json()["deprecated_info_calls"]
    f = ServerClient(url).facts()
    assert requests.get(url + "/dev/stats", timeout=TIMEOUT).json()["deprecated_info_calls"] == before
    assert (f.context_length, f.version) == (64, "0.5.23")
    assert f.max_running_requests == 64 and f.max_total_num_tokens == 64 * 64
    state = ServerState()
    SGLangBackend.apply_facts(state, f, accepted=[])
    limits = (state.context_length, state.draft_reserved_tokens, state.max_req_input_len, state.max_total_num_tokens)
    assert limits == (64, 4, 58, 64 * 64)  # the scheduler's max_req_len: min(64, 64 * 64) - 1 = 63


@pytest.mark.parametrize("server", ["plain", "spec"])
def test_fits_context_agrees_with_the_server_at_every_edge(fleet, server):
    """The worker's check and the server agree token for token: context_problem says none exactly
    when the server generates the prompt as asked (no 400, no prompt or max_new_tokens cut)."""
    url = fleet[server]
    state = ServerState()
    SGLangBackend.apply_facts(state, ServerClient(url).facts(), accepted=[])
    backend = SGLangBackend.from_state(state)
    disagreements = []
    with requests.Session() as session:
        for prompt_len in range(48, 66):
            for max_new in (1, 2, 3, 5, 8, 13):
                ids = list(range(1000, 1000 + prompt_len))
                r = session.post(
                    url + "/generate",
                    timeout=TIMEOUT,
                    json={"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}},
                )
                served = (
                    r.status_code == 200
                    and r.json()["meta_info"]["completion_tokens"] == max_new
                    and r.json()["meta_info"]["prompt_tokens"] == prompt_len
                )
                assert r.status_code in (200, 400), r.text
                problem = backend.context_problem(prompt_len=prompt_len, max_new_tokens=max_new, state=state)
                if served != (problem is None):
                    disagreements.append((prompt_len, max_new, r.status_code, r.text[:120]))
    assert disagreements == []


def generate(url: str, ids: list[int], sampling: dict) -> dict:
    """POST one prompt to /generate as sent (any sampling keys) and read the reply's status as
    the in-flight pool reads it (raises its ClientError)."""
    path = SGLangBackend.path
    response = requests.post(url + path, json={"input_ids": ids, "sampling_params": sampling}, timeout=TIMEOUT)
    error = error_for_status(response.status_code, response.content, path=path, url=url)
    if error is not None:
        raise error
    return response.json()


def test_a_server_that_cuts_the_prompt_gives_a_prompt_mismatch(fleet):
    url = fleet["refused"]  # context 64, --allow-auto-truncate: a 70-token prompt is cut, not refused
    ids = list(range(1000, 1070))
    item = generate(url, ids, {"max_new_tokens": 4, "ignore_eos": True})
    with pytest.raises(PromptMismatch) as caught:
        parse_generate_item(item, vocab_size=VOCAB, sent=Sent(PromptItem(key="k", row_id="r", sample=0, ids=ids)))
    reported = re.search(r"a prompt of (\d+) tokens for the 70 sent", str(caught.value))
    assert reported is not None and int(reported[1]) < 70


def test_bad_sampling_params_are_told_apart_from_a_bad_prompt(fleet):
    url = fleet["plain"]
    good = SamplingParams(max_new_tokens=4).for_server()
    assert generate(url, [1000, 1001], good)["output_ids"]  # every key we send is accepted
    with pytest.raises(BadSamplingParams, match="Unexpected keyword argument 'seed'"):
        generate(url, [1000, 1001], {**good, "seed": 3})
    with pytest.raises(BadSamplingParams, match="top_p"):
        generate(url, [1000, 1001], {**good, "top_p": 0.0})
    with pytest.raises(BadRequest) as caught:
        generate(url, list(range(1000, 1100)), good)
    assert not isinstance(caught.value, BadSamplingParams)
    assert "context length" in str(caught.value)
