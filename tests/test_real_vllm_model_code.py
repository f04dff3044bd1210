"""Models whose tokenizer or chat format is code, on the real vLLM (CPU build): the Kimi-K2.5-shaped
fixture (the server started with --trust-remote-code) and DeepSeek-V4 (its encoding_dsv4.py), each
on a tiny checkpoint around its tokenizer (tests/tiny_qwen3.py copies the code in): whole
conversations, rows with tools among them, rendered by two workers from their own copies of the
model folder. Every prompt id is the model's own (the fixture's template through plain
transformers with remote code; DeepSeek-V4's encode_messages), every output id what the server
generates again.

The random model repeats the token it was given: a prompt with thinking off ends on `</think>`
in both,
so `--stop-token-ids` of that id ends each answer at once (an empty answer, history to build
on). It never writes a tool call, so a row whose dataset called a tool ends after its first
turn as tool-call-mismatch; calls in Kimi's format and DSML are replayed on the devserver
(tests/test_kimi_k25.py, tests/test_deepseek_v4.py).
"""

from __future__ import annotations

import json
import shutil

import pytest

from eagle_synth.testing.harness import Stack
from tests.conftest import STACK_STOP_TIMEOUT, write_jsonl
from tests.deepseek_v4 import deepseek_v4_folder
from tests.helpers import assert_exactly_once, campaign, cli
from tests.kimi_fixture import write_kimi_fixture
from tests.test_conversations import wait_conversations_finished
from tests.test_real_vllm import fresh_ids
from tests.test_tool_conversations import ROWS
from tests.vllm_fixtures import MARKS
from tests.vllm_server import VllmServer, build_model

# Starts servers and workers through helpers the automatic marking does not see.
pytestmark = [*MARKS, pytest.mark.integration]

# Answer length cap (the stop id ends every answer at once; a cap keeps a miss short).
NEW_TOKENS = 8
# Multi-turn rows without tools, and the tool rows whose end on a model that never calls is known.
CONVERSATIONS = [
    {
        "id": f"conv{i}",
        "messages": [
            {"role": "user", "content": f"Tell me about {i}."},
            {"role": "assistant", "content": "An old answer."},
            {"role": "user", "content": f"And about {i + 1}?"},
            {"role": "assistant", "content": "Another old answer."},
            {"role": "user", "content": "Thanks."},
        ],
    }
    for i in range(2)
]
TOOL_ROWS = [row for row in ROWS if row["id"] in ("single", "words-in-dataset")]
# Records per row: three user turns; a dataset call the model does not make; two words turns.
EXPECTED_TURNS = {"conv0": 3, "conv1": 3, "single": 1, "words-in-dataset": 2}


def start_server(tmp_path_factory, folder, *extra: str):
    """A vLLM server on a tiny checkpoint around the tokenizer `folder` (its code copied in)."""
    server = VllmServer(model=build_model(folder), logdir=tmp_path_factory.mktemp("vllm"), extra=list(extra))
    return server.start()


@pytest.fixture(scope="module")
def kimi_vllm(tmp_path_factory):
    """The Kimi-shaped tokenizer: custom code through auto_map, so --trust-remote-code."""
    server = start_server(
        tmp_path_factory, write_kimi_fixture(tmp_path_factory.mktemp("kimi") / "Kimi-K2.5"), "--trust-remote-code"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def dsv4_vllm(tmp_path_factory):
    """DeepSeek-V4's tokenizer.json and encoder: the server needs no code for ids, eagle-synth the encoder."""
    server = start_server(tmp_path_factory, deepseek_v4_folder())
    yield server
    server.stop()


def run_conversations(tmp_path, server, *, own_prompt_ids) -> None:
    """Enqueue CONVERSATIONS and TOOL_ROWS (thinking off) from the checkpoint folder, two workers
    with their own copies of it; check every record against `own_prompt_ids(messages, tools)`."""
    from transformers import AutoTokenizer

    model = server.model
    plain = AutoTokenizer.from_pretrained(str(model), trust_remote_code=True)
    think_close = plain.convert_tokens_to_ids("</think>")
    rows = CONVERSATIONS + TOOL_ROWS
    with Stack(tmp_path / "run", tokenizer=model, stop_timeout=STACK_STOP_TIMEOUT) as stack:
        redis_url = stack.redis().url
        done = cli(
            *("enqueue", str(write_jsonl(tmp_path / "rows.jsonl", rows)), "--campaign", "own", "--history", "own"),
            *("--tokenizer", str(model), "--trust-remote-code", "--chat-template-kwargs", '{"thinking": false}'),
            *("--stop-token-ids", str(think_close), "--max-new-tokens", str(NEW_TOKENS), "--temperature", "0"),
            *("--batch-size", "4", "--redis", redis_url),
        )
        assert f"rows read {len(rows)} / enqueued {len(rows)}" in done.stdout.decode()
        for index in range(2):
            host = shutil.copytree(model, tmp_path / f"host{index}")
            args = ["--render-processes", "1", "--tokenizer", str(host)]
            stack.worker(
                servers=[server.url], out=stack.dir / "out", redis_url=redis_url, args=args, name=f"host{index}@t"
            )
        status = wait_conversations_finished(redis_url, "own", stack=stack, timeout=600)

        records = assert_exactly_once(redis_url, "own", stack.dir / "out" / "own", expected=status["enqueued"])
        assert campaign(redis_url, "own").failure_counts() == {}
        turns: dict[str, list] = {}
        for record in records.values():
            turns.setdefault(record.id, []).append(record)
        assert {row: len(listed) for row, listed in turns.items()} == EXPECTED_TURNS
        conversations = json.loads(cli("status", "own", "--json", "--redis", redis_url).stdout)["conversations"]
        assert conversations["stopped_by_reason"] == {"tool-call-mismatch": 1}
        for row in rows:
            users = [m for m in row["messages"] if m["role"] in ("system", "user")]
            messages: list[dict] = []
            for record in sorted(turns[row["id"]], key=lambda r: r.turn):
                assert record.output_ids == [think_close] and record.finish_reason == "stop"
                messages.append(users[record.turn])
                assert record.prompt_ids == own_prompt_ids(messages, row.get("tools")), f"{row['id']} {record.turn}"
                assert record.output_ids == fresh_ids(server.url, record)
                messages.append({"role": "assistant", "content": ""})


def test_kimi_conversations_on_the_real_vllm_with_each_hosts_own_tokenizer_code(tmp_path, kimi_vllm):
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(str(kimi_vllm.model), trust_remote_code=True)

    def own_prompt_ids(messages: list[dict], tools: list[dict] | None) -> list[int]:
        encoded = plain.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, return_dict=True, thinking=False
        )
        return list(encoded["input_ids"])

    run_conversations(tmp_path, kimi_vllm, own_prompt_ids=own_prompt_ids)


def test_deepseek_v4_conversations_on_the_real_vllm_rendered_by_its_own_encoder(tmp_path, dsv4_vllm):
    from tests.test_deepseek_v4 import own_code_of, own_prompt_ids

    own = own_code_of(dsv4_vllm.model)
    run_conversations(
        tmp_path,
        dsv4_vllm,
        own_prompt_ids=lambda messages, tools: own_prompt_ids(own, messages, tools=tools, thinking=False),
    )
