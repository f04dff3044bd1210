"""The Kimi-K2.5-shaped fixture on the real vLLM (CPU build), started with --trust-remote-code on a
tiny checkpoint around that tokenizer (tests/tiny_qwen3.py copies its code in): whole
conversations, rows with tools among them, rendered by two workers from their own copies of the
model folder. Every prompt id is the fixture's template through plain transformers with remote
code, every output id what the server generates again.

The random model repeats the token it was given: a prompt with thinking off ends on `</think>`,
so `--stop-token-ids` of that id ends each answer at once (an empty answer, history to build
on). It never writes a tool call, so a row whose dataset called a tool ends after its first
turn as tool-call-mismatch; calls in Kimi's format are replayed on the devserver
(tests/test_kimi_k25.py).
"""

from __future__ import annotations

import json
import shutil

import pytest

from eagle_synth.harness import Stack
from tests.conftest import STACK_STOP_TIMEOUT, write_jsonl
from tests.helpers import assert_exactly_once, campaign, cli
from tests.kimi_fixture import write_kimi_fixture
from tests.test_conversations import wait_conversations_finished
from tests.test_real_vllm import fresh_ids
from tests.test_tool_conversations import ROWS
from tests.vllm_fixtures import MARKS
from tests.vllm_server import VllmServer, build_model

pytestmark = MARKS

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


@pytest.fixture(scope="module")
def kimi_vllm(tmp_path_factory):
    """A vLLM server on a tiny checkpoint around the Kimi-shaped tokenizer, --trust-remote-code."""
    folder = write_kimi_fixture(tmp_path_factory.mktemp("kimi-tokenizer") / "Kimi-K2.5")
    server = VllmServer(
        model=build_model(folder), logdir=tmp_path_factory.mktemp("kimi-vllm"), extra=["--trust-remote-code"]
    )
    yield server.start()
    server.stop()


def test_kimi_conversations_on_the_real_vllm_with_each_hosts_own_tokenizer_code(tmp_path, kimi_vllm):
    from transformers import AutoTokenizer

    model = kimi_vllm.model
    plain = AutoTokenizer.from_pretrained(str(model), trust_remote_code=True)
    think_close = plain.convert_tokens_to_ids("</think>")
    rows = CONVERSATIONS + TOOL_ROWS
    with Stack(tmp_path / "run", tokenizer=model, stop_timeout=STACK_STOP_TIMEOUT) as stack:
        redis_url = stack.redis().url
        done = cli(
            *("enqueue", str(write_jsonl(tmp_path / "rows.jsonl", rows)), "--campaign", "kimi", "--history", "own"),
            *("--tokenizer", str(model), "--trust-remote-code", "--chat-template-kwargs", '{"thinking": false}'),
            *("--stop-token-ids", str(think_close), "--max-new-tokens", str(NEW_TOKENS), "--temperature", "0"),
            *("--batch-size", "4", "--redis", redis_url),
        )
        assert f"rows read {len(rows)} / enqueued {len(rows)}" in done.stdout.decode()
        for index in range(2):
            host = shutil.copytree(model, tmp_path / f"host{index}")
            args = ["--render-processes", "1", "--tokenizer", str(host)]
            stack.worker(
                servers=[kimi_vllm.url], out=stack.dir / "out", redis_url=redis_url, args=args, name=f"host{index}@t"
            )
        status = wait_conversations_finished(redis_url, "kimi", stack=stack, timeout=600)

        records = assert_exactly_once(redis_url, "kimi", stack.dir / "out" / "kimi", expected=status["enqueued"])
        assert campaign(redis_url, "kimi").failure_counts() == {}
        turns: dict[str, list] = {}
        for record in records.values():
            turns.setdefault(record.id, []).append(record)
        assert {row: len(listed) for row, listed in turns.items()} == EXPECTED_TURNS
        conversations = json.loads(cli("status", "kimi", "--json", "--redis", redis_url).stdout)["conversations"]
        assert conversations["stopped_by_reason"] == {"tool-call-mismatch": 1}
        for row in rows:
            users = [m for m in row["messages"] if m["role"] in ("system", "user")]
            messages: list[dict] = []
            for record in sorted(turns[row["id"]], key=lambda r: r.turn):
                assert record.output_ids == [think_close] and record.finish_reason == "stop"
                messages.append(users[record.turn])
                expected = plain.apply_chat_template(
                    messages, tools=row.get("tools"), add_generation_prompt=True, return_dict=True, thinking=False
                )["input_ids"]
                assert record.prompt_ids == list(expected), f"{row['id']} turn {record.turn}"
                assert record.output_ids == fresh_ids(kimi_vllm.url, record)
                messages.append({"role": "assistant", "content": ""})
