"""The model's vocabulary and the tokenizer canary (eagle_synth/model_identity.py, workers/servers/model_check.py).

The whole-path versions run on the real vLLM server (tests/test_real_vllm.py); these hold the
rules on their own and the canary check against the devserver's vLLM mode.
"""

from __future__ import annotations

import json

from eagle_synth.model_identity import UNKNOWN_VOCAB_BOUND, model_vocab_size, output_id_bound, tokenizer_canary
from eagle_synth.state.campaign import CampaignSettings
from eagle_synth.state.node_state import ServerState
from eagle_synth.tools.verify import CheckSettings
from workers.servers.client import ServerClient
from workers.servers.model_check import ModelCheck


def test_the_model_vocab_size_is_the_checkpoints(tmp_path):
    assert model_vocab_size(tmp_path) is None  # no config.json: unknown
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 151936}))
    assert model_vocab_size(tmp_path) == 151936
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 248320}}))
    assert model_vocab_size(tmp_path) == 248320
    (tmp_path / "config.json").write_text("not json")
    assert model_vocab_size(tmp_path) is None


def test_outputs_may_reach_the_padded_vocabulary_prompts_not():
    assert output_id_bound(tokenizer_size=151669, model_vocab=151936) == 151936
    assert output_id_bound(tokenizer_size=151669, model_vocab=None) == UNKNOWN_VOCAB_BOUND
    assert output_id_bound(tokenizer_size=200, model_vocab=100) == 200  # never below the tokenizer
    checked = CheckSettings(vocab_size=151669, eos_token_ids=frozenset(), model_vocab_size=151936)
    assert checked.output_bound == 151936 and checked.vocab_size == 151669


def test_the_canary_holds_special_tokens_and_their_ids(tokenizer):
    canary = tokenizer_canary(tokenizer)
    assert tokenizer.eos_token in canary["text"] and "<think>" in canary["text"]
    assert canary["ids"] == tokenizer.encode(canary["text"], add_special_tokens=False)
    assert tokenizer.eos_token_id in canary["ids"]


def test_a_server_with_another_tokenizer_is_named_with_the_campaigns(tmp_path, stack, tokenizer):
    from eagle_synth.demo.tokenizer import build_demo_tokenizer
    from eagle_synth.templating import load_tokenizer

    _, url = stack.devserver(api="vllm")
    state = ServerState(backend="vllm", provenance={"model_path": "/models/served", "served_model_name": None})
    check = ModelCheck({url: ServerClient(url)})
    same = CampaignSettings(
        name="same", tokenizer_path="/t", tokenizer_fingerprint="f1", chat_template_hash="h",
        tokenizer_canary=tokenizer_canary(tokenizer),
    )  # fmt: skip
    assert check.problem(url, state, same) is None
    other_tokenizer = load_tokenizer(build_demo_tokenizer(tmp_path / "demo"))
    other = CampaignSettings(
        name="other", tokenizer_path="/demo", tokenizer_fingerprint="f2", chat_template_hash="h",
        tokenizer_canary=tokenizer_canary(other_tokenizer),
    )  # fmt: skip
    line = check.problem(url, state, other)
    assert line is not None and "/models/served" in line and "campaign 'other'" in line and "/demo" in line
    assert "\n" not in line
    old = CampaignSettings(name="old", tokenizer_path="/t", tokenizer_fingerprint="f3", chat_template_hash="h")
    assert check.problem(url, state, old) is None  # enqueued before canaries: not checked
