"""Devserver knobs that emulate SGLang settings changing results, and malformed replies.

Real server processes over HTTP, as tests/test_devserver.py; all start at once (module fixture).
"""

from __future__ import annotations

import json
import time

import pytest
import requests

from eagle_synth.devserver.faults import MALFORMED_SHAPES
from eagle_synth.errors import BadResponse
from eagle_synth.payload import PromptItem
from eagle_synth.testing.harness import port_open, start_devserver, wait_for
from workers.replies import Sent, parse_generate_item

TIMEOUT = 10
VOCAB = 248077
PROMPT = list(range(1000, 1040))
SECRET, ADMIN_SECRET = "sk-live-not-for-records", "admin-not-for-records"
PREFERRED = {"max_new_tokens": 7, "frequency_penalty": 0.5}
# Requests carry the "rich" server's --api-key (the other servers check none).
HTTP = requests.Session()
HTTP.headers["Authorization"] = f"Bearer {SECRET}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tokenizer_path):
    logdir = tmp_path_factory.mktemp("devserver-settings")
    specs = {
        "rich": [
            "--context-length",
            "64",
            "--api-key",
            SECRET,
            "--admin-api-key",
            ADMIN_SECRET,
            "--enable-deterministic-inference",
            "--preferred-sampling-params",
            json.dumps(PREFERRED),
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
            "--slots",
            "8",
        ],
        "truncate": ["--context-length", "64", "--allow-auto-truncate"],
        "malformed": ["--malformed-rate", "1"],
        "old": ["--sglang-version", "0.5.6"],
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


def post(url: str, ids, **body) -> requests.Response:
    return HTTP.post(url + "/generate", json={"input_ids": ids, **body}, timeout=TIMEOUT)


def sent(ids: list[int]) -> Sent:
    """A reply's request: these prompt ids (the record's other fields do not matter here)."""
    return Sent(PromptItem(key="k", row_id="r", sample=0, ids=ids))


def stats(url: str) -> dict:
    return HTTP.get(url + "/dev/stats", timeout=TIMEOUT).json()


def test_the_api_key_guards_every_path_but_health_as_sglangs_does(fleet):
    url = fleet["rich"]
    for method, path in (("GET", "/server_info"), ("GET", "/model_info"), ("GET", "/v1/models"), ("POST", "/generate")):
        for headers in ({}, {"Authorization": "Bearer sk-other"}, {"Authorization": SECRET}):
            reply = requests.request(method, url + path, json={"input_ids": PROMPT}, headers=headers, timeout=TIMEOUT)
            assert (reply.status_code, reply.json()) == (401, {"error": "Unauthorized"}), (method, path, headers)
    assert requests.get(url + "/health", timeout=TIMEOUT).status_code == 200  # probes need no key
    assert HTTP.get(url + "/model_info", timeout=TIMEOUT).status_code == 200


def test_server_info_reports_settings_and_secrets_like_sglang(fleet):
    info = HTTP.get(fleet["rich"] + "/server_info", timeout=TIMEOUT).json()
    assert info["api_key"] == SECRET and info["admin_api_key"] == ADMIN_SECRET  # unredacted, as SGLang
    assert info["enable_deterministic_inference"] is True
    assert info["allow_auto_truncate"] is False
    assert json.loads(info["preferred_sampling_params"]) == PREFERRED  # the flag's JSON text
    assert (
        info["speculative_algorithm"],
        info["speculative_num_steps"],
        info["speculative_eagle_topk"],
        info["speculative_num_draft_tokens"],
    ) == ("EAGLE", 3, 1, 4)
    assert info["max_running_requests"] == 8
    assert info["max_total_num_tokens"] == 8 * 64
    assert info["max_req_input_len"] == 64 - 1 - 5
    model = HTTP.get(fleet["rich"] + "/model_info", timeout=TIMEOUT).json()
    assert json.loads(model["preferred_sampling_params"]) == PREFERRED


def test_current_and_deprecated_info_endpoints(fleet):
    url = fleet["old"]
    before = stats(url)["deprecated_info_calls"]
    assert HTTP.get(url + "/server_info", timeout=TIMEOUT).json()["version"] == "0.5.6"
    assert HTTP.get(url + "/model_info", timeout=TIMEOUT).json()["is_generation"] is True
    assert stats(url)["deprecated_info_calls"] == before
    assert HTTP.get(url + "/get_server_info", timeout=TIMEOUT).json()["version"] == "0.5.6"
    assert HTTP.get(url + "/get_model_info", timeout=TIMEOUT).json()["is_generation"] is True
    assert stats(url)["deprecated_info_calls"] == before + 2


def test_speculative_drafts_count_against_the_context(fleet):
    url = fleet["rich"]  # context 64, EAGLE reserves max(1 * 3, 4) = 4 slots
    params = {"max_new_tokens": 4, "ignore_eos": True}
    fits = post(url, list(range(1000, 1056)), sampling_params=params)  # 56 + 4 + 4 = 64
    assert fits.status_code == 200, fits.text
    too_long = post(url, list(range(1000, 1057)), sampling_params=params)  # 57 + 4 + 4 = 65
    assert too_long.status_code == 400
    assert "You requested a total of 65 tokens: 61 tokens from the input" in too_long.json()["error"]["message"]
    input_only = post(url, list(range(1000, 1060)), sampling_params=params)  # 60 + 4 >= 64
    assert input_only.json()["error"]["message"].startswith("The input (64 tokens) is longer")


def test_preferred_params_fill_only_what_the_request_leaves_out(fleet):
    url = fleet["rich"]
    left_out = post(url, PROMPT[:10], sampling_params={"temperature": 0, "ignore_eos": True}).json()
    assert left_out["meta_info"]["completion_tokens"] == PREFERRED["max_new_tokens"]
    sent = post(url, PROMPT[:10], sampling_params={"temperature": 0, "ignore_eos": True, "max_new_tokens": 3}).json()
    assert sent["meta_info"]["completion_tokens"] == 3


def test_scheduler_input_cap(fleet):
    url = fleet["rich"]  # max_req_len 63, so prompts of 58 (63 - 5) or more are refused
    below = post(url, list(range(1000, 1057)), sampling_params={"max_new_tokens": 1, "ignore_eos": True})
    assert below.status_code == 200
    at = post(url, list(range(1000, 1058)), sampling_params={"max_new_tokens": 1, "ignore_eos": True})
    assert at.status_code == 400  # 58 + 4 + 1 passes the context check, not the scheduler's
    assert at.json()["error"]["message"] == (
        "Input length (58 tokens) exceeds the maximum allowed length (58 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )


def test_auto_truncate_cuts_instead_of_refusing(fleet):
    url = fleet["truncate"]
    long = post(url, list(range(1000, 1100)), sampling_params={"max_new_tokens": 4, "ignore_eos": True})
    assert long.status_code == 200, long.text
    meta = long.json()["meta_info"]
    assert meta["prompt_tokens"] == 58 and meta["prompt_tokens"] != 100  # the prompt was cut, silently
    near = post(url, list(range(1000, 1050)), sampling_params={"max_new_tokens": 40, "ignore_eos": True})
    assert near.status_code == 200
    # max_new_tokens cut to 64 - 50 by the tokenizer check, then to max_req_len 63 - 50 - 1.
    assert near.json()["meta_info"]["completion_tokens"] == 12


def test_sampling_key_errors_are_400_since_0_5_23_and_500_before(fleet):
    new = post(fleet["rich"], PROMPT, sampling_params={"seed": 1})
    assert new.status_code == 400
    assert new.json() == {"error": {"message": "Unexpected keyword argument 'seed'"}}
    typed = post(fleet["rich"], PROMPT, sampling_params={"temperature": "hot"})
    assert typed.status_code == 400
    assert typed.json()["error"]["message"] == "Expected `float`, got `str` - at `$.sampling_params.temperature`"
    old = post(fleet["old"], PROMPT, sampling_params={"seed": 1})
    assert old.status_code == 500 and old.text == "Internal Server Error"
    assert post(fleet["old"], PROMPT, sampling_params={"temperature": "hot"}).status_code == 500


def test_malformed_rate_cycles_through_the_shapes(fleet):
    url = fleet["malformed"]
    HTTP.post(url + "/dev/reset_stats", timeout=TIMEOUT)
    seen = []
    for _ in range(len(MALFORMED_SHAPES)):
        r = post(url, [PROMPT, PROMPT[:20]], sampling_params={"max_new_tokens": 5, "ignore_eos": True})
        assert r.status_code == 200
        first, second = r.json()
        seen.append(first)
        # Only the first item is broken; the second is a normal item.
        assert parse_generate_item(second, vocab_size=VOCAB, sent=sent(PROMPT[:20])).completion_tokens == 5
    assert isinstance(seen[0], list) and all(isinstance(i, int) for i in seen[0])  # a bare list of ints
    assert isinstance(seen[1]["meta_info"], str)
    assert all(isinstance(i, str) for i in seen[2]["output_ids"])
    assert all(i < 0 for i in seen[3]["output_ids"])
    assert "output_ids" not in seen[4] and "meta_info" in seen[4]
    for item in seen:
        with pytest.raises(BadResponse):
            parse_generate_item(item, vocab_size=VOCAB, sent=sent(PROMPT))
    assert stats(url)["injected_malformed"] == len(MALFORMED_SHAPES)
    single = post(url, PROMPT, sampling_params={"max_new_tokens": 5})  # a single prompt: the item itself
    assert single.status_code == 200 and isinstance(single.json(), list)  # shape 1 again: a list of ints


@pytest.mark.integration
def test_bad_settings_are_refused_at_launch(tokenizer_path, tmp_path):
    import subprocess
    import sys

    for args, says in (
        (["--preferred-sampling-params", "[1]"], "must be a JSON object"),
        (["--speculative-algorithm", "MEDUSA"], "must be one of"),
        (["--malformed-rate", "0.6", "--fail-rate", "0.6"], "must not exceed 1"),
    ):
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "eagle_synth.devserver", "--tokenizer", str(tokenizer_path), *args],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert says in result.stderr.decode()
        assert time.monotonic() - started < 60
