"""Campaign settings, failures and server states are msgspec structs; what the dataclass version
stored in Redis (and what a newer version may add) still reads back. The literals below were
written by the code before the change."""

from __future__ import annotations

import json

import msgspec
import redis

from eagle_synth.state.campaign import CampaignSettings, Failure
from eagle_synth.state.node_state import NodeState, ServerState

FAILURE = Failure(
    "server-error",
    "boom",
    {"key": "k" * 32, "row_id": "r1", "sample": 0, "ids": [1, 2, 300000], "seed": 7, "source": "f.jsonl:1", "turn": 0},
    {"temperature": 0.7, "sampling_seed": 7},
    1700000000.5,
    "w1",
)
FAILURE_HEX = (
    "4631207365727665722d6572726f720a28b52ffd2078ed0200440595a4626f6f6dcb41d954fc40200000a2773182ab74656d70657261"
    "74757265cb3fe666ad73616d706c696e675f736565640797d9206ba2723100c40c0100000002000000e093040007a9662e6a736f6e6c"
    "3a3100020041875d800c"
)
OLD_FAILURE_JSON = (
    '{"reason": "server-error", "message": "boom", "item": {"key": "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk", "row_id": "r1",'
    ' "sample": 0, "ids": [1, 2, 300000], "seed": 7, "source": "f.jsonl:1", "turn": 0}, "sampling": {"temperature":'
    ' 0.7, "sampling_seed": 7}, "at": 1700000000.5, "worker": "w1"}'
)
SETTINGS = CampaignSettings(
    name="c1",
    tokenizer_path="/tok",
    tokenizer_fingerprint="fp",
    chat_template_hash="h",
    chat_template_kwargs={"enable_thinking": False},
    sampling={"temperature": 0.7, "max_new_tokens": 8},
    vocab_size=151936,
    eos_token_ids=[151645],
    think_open_id=151667,
    max_prompt_tokens=4096,
    created_at=1700000000.25,
    history="own",
    max_turns=3,
    variants=[{"name": "v1", "sampling": {"top_p": 0.5}}],
    tool_format="hermes",
    batch_size=16,
    model_vocab_size=152064,
    tokenizer_canary={"ids": [1, 2]},
)
OLD_SETTINGS_JSON = (
    '{"batch_size": 16, "chat_template_hash": "h", "chat_template_kwargs": {"enable_thinking": false}, "created_at":'
    ' 1700000000.25, "eos_token_ids": [151645], "history": "own", "max_prompt_tokens": 4096, "max_turns": 3,'
    ' "model_vocab_size": 152064, "name": "c1", "sampling": {"max_new_tokens": 8, "temperature": 0.7},'
    ' "system_prompt": null, "think_close_id": null, "think_open_id": 151667, "tokenizer_canary": {"ids": [1, 2]},'
    ' "tokenizer_fingerprint": "fp", "tokenizer_path": "/tok", "tool_format": "hermes", "variants": [{"name": "v1",'
    ' "sampling": {"top_p": 0.5}}], "vocab_size": 151936}'
)
STATE = ServerState(
    state="healthy",
    since=1700000000.5,
    detail="ok",
    context_length=4096,
    provenance={"backend": "sglang"},
    draft_reserved_tokens=4,
    max_req_input_len=4090,
    max_running_requests=8,
    max_total_num_tokens=20000,
    deterministic_inference=True,
    sampling_seed_supported=True,
    backend="sglang",
)
OLD_STATE_JSON = (
    '{"state": "healthy", "since": 1700000000.5, "detail": "ok", "context_length": 4096, "provenance": {"backend":'
    ' "sglang"}, "draft_reserved_tokens": 4, "max_req_input_len": 4090, "max_running_requests": 8,'
    ' "max_total_num_tokens": 20000, "deterministic_inference": true, "sampling_seed_supported": true,'
    ' "backend": "sglang"}'
)


def test_a_failure_encodes_to_the_same_compact_bytes_and_reads_both_layouts():
    assert FAILURE.encode().hex() == FAILURE_HEX
    assert Failure.decode(bytes.fromhex(FAILURE_HEX)) == FAILURE
    assert Failure.decode(OLD_FAILURE_JSON) == Failure.decode(OLD_FAILURE_JSON.encode()) == FAILURE
    assert json.dumps(msgspec.structs.asdict(FAILURE)) == OLD_FAILURE_JSON
    assert Failure.reason_of(OLD_FAILURE_JSON) == Failure.reason_of(bytes.fromhex(FAILURE_HEX)) == "server-error"
    newer = json.dumps({**json.loads(OLD_FAILURE_JSON), "added_later": 1})
    assert Failure.decode(newer) == FAILURE


def test_settings_stored_by_the_dataclass_version_read_back_equal():
    assert CampaignSettings.from_json(OLD_SETTINGS_JSON) == SETTINGS
    assert CampaignSettings.from_json(OLD_SETTINGS_JSON.encode()) == SETTINGS
    assert json.loads(SETTINGS.to_json()) == json.loads(OLD_SETTINGS_JSON)
    assert CampaignSettings.from_json(SETTINGS.to_json()) == SETTINGS
    # An older version's settings (fields missing) and a newer one's (fields added).
    old = {k: v for k, v in json.loads(OLD_SETTINGS_JSON).items() if k not in ("tokenizer_canary", "model_vocab_size")}
    assert CampaignSettings.from_json(json.dumps(old)) == msgspec.structs.replace(
        SETTINGS, tokenizer_canary={}, model_vocab_size=None
    )
    assert CampaignSettings.from_json(json.dumps({**json.loads(OLD_SETTINGS_JSON), "new": [1]})) == SETTINGS
    assert SETTINGS.differences(msgspec.structs.replace(SETTINGS, created_at=1.0, batch_size=4)) == []
    assert SETTINGS.differences(msgspec.structs.replace(SETTINGS, sampling={"temperature": 1.0})) == [
        "sampling.max_new_tokens: campaign has 8, this run has None",
        "sampling.temperature: campaign has 0.7, this run has 1.0",
    ]


def test_server_states_written_by_the_dataclass_version_read_back(redis_server):
    node = NodeState(redis.Redis.from_url(redis_server.url), "w@host")
    node.publish({"http://a:1": STATE}, consuming=True)
    node.client.hset(node.key, "state:http://b:2", OLD_STATE_JSON)
    node.client.hset(node.key, "state:http://c:3", json.dumps({"state": "loading", "added_in_2027": 1}))
    states = node.states()
    assert states == {"http://a:1": STATE, "http://b:2": STATE, "http://c:3": ServerState(state="loading")}
    assert node.snapshot()["server_states"]["http://b:2"] == json.loads(OLD_STATE_JSON)
