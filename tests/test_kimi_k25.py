"""A Kimi-K2.5-shaped model (tests/kimi_fixture.py: a tiktoken tokenizer behind custom code loaded
through `auto_map`, Kimi's special tokens and turn structure) end to end on the devserver:
`enqueue --history own --trust-remote-code`, two worker hosts whose only copy of the tokenizer
code is their own folder, tool calls in Kimi's format replayed; a worker whose folder differs
refuses before any follow-up. Every prompt id is checked against the fixture's own template
through plain `transformers` with remote code.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from eagle_synth.state.keys import tokenizer_blob
from eagle_synth.testing.harness import Stack
from tests.conftest import STACK_STOP_TIMEOUT, write_jsonl
from tests.helpers import assert_exactly_once, campaign, cli, wait_finished
from tests.kimi_fixture import write_kimi_fixture
from tests.replay_check import check_record_tools, check_replayed_conversations, start_hosts
from tests.test_conversations import wait_conversations_finished
from tests.test_tool_conversations import ROWS

# The variants: Kimi's thinking on and off (the fixture's template reads `thinking`).
VARIANTS = [
    {"name": "thinking", "weight": 1, "chat_template_kwargs": {"thinking": True}},
    {"name": "instant", "weight": 1, "chat_template_kwargs": {"thinking": False}},
]
# A Kimi call as this test reads it: id, arguments.
CALL = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S)
SECTION = "<|tool_calls_section_begin|>"


@pytest.fixture(scope="module")
def kimi_path(tmp_path_factory):
    return write_kimi_fixture(tmp_path_factory.mktemp("kimi") / "Kimi-K2.5")


@pytest.fixture(scope="module")
def kimi_tokenizer(kimi_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(kimi_path), trust_remote_code=True)


def model_answer(tokenizer, output_ids: list[int]) -> dict:
    """The answer read with this test's own parser (reasoning and words as docs/records.md states)."""
    ids = list(output_ids)
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids.pop()
    think_close = tokenizer.convert_tokens_to_ids("</think>")
    message: dict = {"role": "assistant"}
    if think_close in ids:
        cut = ids.index(think_close)
        message["reasoning_content"] = tokenizer.decode(ids[:cut], skip_special_tokens=True).strip()
        ids = ids[cut + 1 :]
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    calls = CALL.findall(text)
    if not calls:
        message["content"] = tokenizer.decode(ids, skip_special_tokens=True).strip()
        return message
    message["content"] = text[: text.index(SECTION)].strip()
    message["tool_calls"] = [
        {"id": call_id.strip(), "type": "function", "function": {"name": call_id.split(".")[1].split(":")[0], "arguments": json.loads(arguments)}}
        for call_id, arguments in calls
    ]  # fmt: skip
    return message


def enqueue(tmp_path, redis_url: str, folder, name: str, rows: list[dict]) -> None:
    variants = tmp_path / "variants.json"
    variants.write_text(json.dumps(VARIANTS))
    done = cli(
        *("enqueue", str(write_jsonl(tmp_path / f"{name}.jsonl", rows)), "--campaign", name, "--history", "own"),
        *("--tokenizer", str(folder), "--trust-remote-code", "--variants", str(variants)),
        *("--max-new-tokens", "256", "--temperature", "0.7", "--seed", "3", "--batch-size", "4"),
        *("--redis", redis_url),
    )
    assert f"rows read {len(rows)} / enqueued {len(rows)}" in done.stdout.decode()


def test_kimi_k25_conversations_with_tools_on_two_hosts_with_their_own_tokenizer_code(
    tmp_path, kimi_path, kimi_tokenizer
):
    with Stack(tmp_path / "run", tokenizer=kimi_path, stop_timeout=STACK_STOP_TIMEOUT) as stack:
        hosts = [shutil.copytree(kimi_path, tmp_path / f"host{i}") for i in range(2)]
        redis_url = start_hosts(stack, *hosts)
        enqueue(tmp_path, redis_url, kimi_path, "kimi", ROWS)
        wait_conversations_finished(redis_url, "kimi", stack=stack)

        kimi = campaign(redis_url, "kimi")
        settings = kimi.settings()
        assert settings is not None and settings.tool_format == "kimi_k2"
        assert "tokenization_kimi_fixture.py" in settings.tokenizer_files
        assert not kimi.client.exists(tokenizer_blob(settings.tokenizer_fingerprint, settings.chat_template_hash))
        status = json.loads(cli("status", "kimi", "--json", "--redis", redis_url).stdout)
        records = assert_exactly_once(redis_url, "kimi", stack.dir / "out" / "kimi", expected=status["enqueued"])

        def own_prompt_ids(messages: list[dict], tools: list[dict] | None, variant: str) -> list[int]:
            kwargs = next(v["chat_template_kwargs"] for v in VARIANTS if v["name"] == variant)
            encoded = kimi_tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True, **kwargs
            )
            return list(encoded["input_ids"])

        called = check_replayed_conversations(
            records,
            own_prompt_ids=own_prompt_ids,
            read_answer=lambda ids, variant: model_answer(kimi_tokenizer, ids),
            # A result answers the model's call: its id is the model's own (functions.NAME:IDX).
            give_results=lambda answer, _, results: [
                {**r, "tool_call_id": c["id"]} for r, c in zip(results, answer["tool_calls"])
            ],
        )
        assert called >= 4
        check_record_tools(stack.dir / "out" / "kimi", hosts[0], shown="<|im_assistant|>assistant<|im_middle|>")
        logs = stack.logs(tail=200_000)
        assert logs.count("rendering next turns with the tokenizer") == 2, logs[-3000:]


def test_a_kimi_worker_whose_tokenizer_code_differs_refuses_before_any_follow_up(tmp_path, kimi_path):
    with Stack(tmp_path / "run", tokenizer=kimi_path, stop_timeout=STACK_STOP_TIMEOUT) as stack:
        differing = shutil.copytree(kimi_path, tmp_path / "differing")
        with (differing / "tokenization_kimi_fixture.py").open("a") as f:
            f.write("\n# a local edit\n")
        redis_url = start_hosts(stack, differing)
        enqueue(tmp_path, redis_url, kimi_path, "kimi", ROWS[:2])
        wait_finished(redis_url, "kimi", expected=2, stack=stack)
        failures = dict(campaign(redis_url, "kimi").iter_failures())
        assert len(failures) == 2 and not (stack.dir / "out" / "kimi" / "records").exists()
        for failure in failures.values():
            assert failure.reason == "tokenizer-unavailable" and "\n" not in failure.message
            assert "differing/tokenization_kimi_fixture.py differs from the campaign's" in failure.message
