"""The devserver's vLLM mode held against the real vLLM server (issue 21, item 3).

The devserver stands in for vLLM in every other test, so the same requests go to both here:
good ones, a prompt over the context, one that leaves less room than max_tokens, an unknown
field, n > 1, stop ids, an id past the model's vocabulary, another model's name, and
/tokenize. Status codes, response keys and value types must be equal (the ids differ: the
devserver does not run the model). Where they differed, the devserver was changed.
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.vllm_fixtures import MARKS
from tests.vllm_server import MAX_MODEL_LEN, SERVED_NAME

pytestmark = MARKS

TIMEOUT = 120
# A chat prompt of the test tokenizer ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n").
PROMPT = [248045, 846, 198, 9707, 248046, 198, 248045, 74455, 198]


def shape(value):
    """Keys and value types, recursively (a list by its first element): what a client reads."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


@pytest.fixture(scope="module")
def twin(real_vllm, vllm_model, tmp_path_factory):
    """A devserver in vLLM mode configured like the real server (same tokenizer, context,
    served name, vocabulary and version)."""
    from eagle_synth.testing.harness import start_devserver

    vocab = json.loads((vllm_model / "config.json").read_text())["vocab_size"]
    process, url = start_devserver(
        tokenizer=vllm_model,
        logdir=tmp_path_factory.mktemp("twin"),
        args=[
            "--api",
            "vllm",
            "--context-length",
            str(MAX_MODEL_LEN),
            "--served-model-name",
            SERVED_NAME,
            "--vocab-size",
            str(vocab),
            "--vllm-version",
            "0.32.0",
            "--model-path",
            str(vllm_model),
        ],
    )
    yield url
    process.stop()


def both(real: str, dev: str, path: str, body: dict) -> tuple[requests.Response, requests.Response]:
    return tuple(requests.post(f"{url}{path}", json=body, timeout=TIMEOUT) for url in (real, dev))  # type: ignore[return-value]


def first_ids(url: str) -> int:
    reply = requests.post(
        f"{url}/v1/completions",
        json={"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "return_token_ids": True},
        timeout=TIMEOUT,
    )
    return reply.json()["choices"][0]["token_ids"][0]


def test_the_devserver_answers_what_vllm_answers(real_vllm, twin):
    base = {"model": SERVED_NAME, "prompt": PROMPT, "return_token_ids": True}
    stops = [first_ids(real_vllm.url), first_ids(twin)]
    cases = {
        "greedy": {**base, "max_tokens": 8, "temperature": 0},
        "seeded": {**base, "max_tokens": 8, "temperature": 1.0, "seed": 5},
        "no ids asked": {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
        "unknown field": {**base, "max_tokens": 4, "temperature": 0, "bogus_field": 1},
        "n 2": {**base, "max_tokens": 4, "temperature": 1.0, "n": 2, "seed": 3},
        "stop ids": {**base, "max_tokens": 8, "temperature": 0, "stop_token_ids": stops},
        "over the context": {**base, "prompt": list(range(10, 10 + MAX_MODEL_LEN + 6)), "max_tokens": 8},
        "filling the context": {**base, "prompt": list(range(10, 10 + MAX_MODEL_LEN)), "max_tokens": 8},
        "less room than max_tokens": {**base, "prompt": list(range(10, 10 + MAX_MODEL_LEN - 4)), "max_tokens": 8},
        "past the vocabulary": {**base, "prompt": [10**6], "max_tokens": 2},
        "another model": {**base, "model": "other", "max_tokens": 2},
        "greedy n 2": {**base, "max_tokens": 4, "temperature": 0, "n": 2},
    }
    for name, body in cases.items():
        real, dev = both(real_vllm.url, twin, "/v1/completions", body)
        assert real.status_code == dev.status_code, (name, real.text, dev.text)
        assert shape(real.json()) == shape(dev.json()), (name, real.text, dev.text)
        if real.status_code == 200:
            got = [c["token_ids"] for c in real.json()["choices"]], [c["token_ids"] for c in dev.json()["choices"]]
            assert [len(ids or []) for ids in got[0]] == [len(ids or []) for ids in got[1]], (name, got)
            finishes = [[(c["finish_reason"], c["stop_reason"]) for c in r.json()["choices"]] for r in (real, dev)]
            assert [f[0] for f in finishes[0]] == [f[0] for f in finishes[1]], (name, finishes)
        else:
            assert real.json()["error"]["type"] == dev.json()["error"]["type"], (name, real.text, dev.text)
    room = both(real_vllm.url, twin, "/v1/completions", cases["less room than max_tokens"])
    for reply in room:  # vLLM 0.32 shortens max_tokens to the room the prompt leaves
        assert reply.json()["choices"][0]["finish_reason"] == "length"
        assert len(reply.json()["choices"][0]["token_ids"]) == 4


def test_tokenize_health_models_and_version_match(real_vllm, twin):
    for body in (
        {"prompt": "<|im_end|>Grüße aus 東京", "add_special_tokens": False},
        {"prompt": "plain text"},
        {"model": SERVED_NAME, "prompt": "x"},
    ):
        real, dev = both(real_vllm.url, twin, "/tokenize", body)
        assert real.status_code == dev.status_code == 200
        assert real.json() == dev.json(), body  # the same tokenizer: the same ids
    for path in ("/health", "/v1/models", "/version"):
        real, dev = (requests.get(f"{url}{path}", timeout=TIMEOUT) for url in (real_vllm.url, twin))
        assert real.status_code == dev.status_code == 200, path
        if path != "/health":
            assert shape(real.json()) == shape(dev.json()), path
            if path == "/version":
                assert real.json() == dev.json()
        else:
            assert real.content == dev.content == b""
