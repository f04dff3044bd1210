"""DeepSeek-V4, whose folder ships a Python chat encoder (encoding_dsv4.py) instead of a chat
template, through the whole path: CLI enqueue (--trust-remote-code) -> Redis -> real Celery
workers whose only copy of the encoder is their own folder (`worker --tokenizer DIR`) ->
devserver (--trust-remote-code, writing DSML tool calls) -> records.

Every prompt id is checked against the model's own code, loaded here on its own: its
`encode_messages` and tokenizer for the same messages, as its server calls them (tools in a
system message put first, `thinking` choosing the mode, earlier reasoning dropped when the prompt
ends on a user message); the model's DSML calls are read with the encoder's own parser.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from eagle_synth.state.keys import tokenizer_blob
from eagle_synth.testing.harness import Stack
from tests.conftest import STACK_STOP_TIMEOUT, write_jsonl
from tests.deepseek_v4 import ENCODER, deepseek_v4_folder
from tests.fixture_tokenizer import FixtureTokenizerError
from tests.helpers import assert_exactly_once, campaign, cli, wait_finished
from tests.replay_check import check_record_tools, check_replayed_conversations, start_hosts
from tests.test_conversations import wait_conversations_finished
from tests.test_tool_conversations import ROWS

# The variants the campaigns run: the encoder's two thinking modes.
VARIANTS = [
    {"name": "thinking", "weight": 1, "chat_template_kwargs": {"thinking": True}},
    {"name": "chat", "weight": 1, "chat_template_kwargs": {"thinking": False}},
]
# Single prompts (`--history dataset`): a system prompt, an earlier exchange with reasoning.
SINGLE_ROWS = [
    {"id": f"single-{i}", "messages": [{"role": "user", "content": f"What is {i} plus {i}?"}]} for i in range(6)
] + [
    {
        "id": "history",
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Name a river."},
            {"role": "assistant", "content": "The Rhine.", "reasoning_content": "A European one."},
            {"role": "user", "content": "Another one?"},
        ],
    },
    # The dataset's own tool step (object arguments, parallel results by id), regenerated after its results.
    {"id": "with-tools", "tools": ROWS[1]["tools"], "messages": ROWS[1]["messages"]},
]


@pytest.fixture(scope="module")
def dsv4_path() -> Path:
    try:
        return deepseek_v4_folder()
    except FixtureTokenizerError as exc:
        missing = str(exc)
    pytest.fail(missing, pytrace=False)


def own_code_of(folder: Path):
    """(the model's encoder module, its plain tokenizer) from `folder`, loaded without eagle-synth."""
    from transformers import AutoTokenizer

    spec = importlib.util.spec_from_file_location("test_encoding_dsv4", folder / ENCODER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def own_code(dsv4_path):
    return own_code_of(dsv4_path)


def own_prompt_ids(own_code, messages: list[dict], *, tools, thinking: bool) -> list[int]:
    encoder, tokenizer = own_code
    # Arguments as the OpenAI API carries them (JSON text), which is what the encoder reads.
    listed = [
        {**m, "tool_calls": [text_arguments(call) for call in m["tool_calls"]]} if m.get("tool_calls") else dict(m)
        for m in messages
    ]
    if tools:
        listed.insert(0, {"role": "system", "tools": tools})
    text = encoder.encode_messages(
        listed, thinking_mode="thinking" if thinking else "chat", drop_thinking=listed[-1]["role"] == "user"
    )
    return tokenizer.encode(text, add_special_tokens=False)


def text_arguments(call: dict) -> dict:
    arguments = call["function"]["arguments"]
    if isinstance(arguments, str):
        return call
    return {**call, "function": {**call["function"], "arguments": json.dumps(arguments, ensure_ascii=False)}}


def own_answer(own_code, output_ids: list[int], *, thinking: bool) -> dict:
    """The model's answer as its own parser reads it; reasoning and words as the records contract
    states them (decoded without special tokens, stripped)."""
    encoder, tokenizer = own_code
    parsed = encoder.parse_message_from_completion_text(
        tokenizer.decode(output_ids, skip_special_tokens=False), thinking_mode="thinking" if thinking else "chat"
    )
    message = {"role": "assistant", "content": parsed["content"].strip()}
    if thinking:
        message["reasoning_content"] = parsed["reasoning_content"].strip()
    if parsed["tool_calls"]:
        message["tool_calls"] = parsed["tool_calls"]
    return message


def enqueue(tmp_path, redis_url: str, folder: Path, name: str, rows: list[dict], *extra: str) -> None:
    variants = tmp_path / "variants.json"
    variants.write_text(json.dumps(VARIANTS))
    done = cli(
        *("enqueue", str(write_jsonl(tmp_path / f"{name}.jsonl", rows)), "--campaign", name),
        *("--tokenizer", str(folder), "--trust-remote-code", "--variants", str(variants)),
        *("--max-new-tokens", "256", "--temperature", "0.7", "--seed", "3", "--batch-size", "4"),
        *extra,
        *("--redis", redis_url),
    )
    assert f"rows read {len(rows)} / enqueued {len(rows)}" in done.stdout.decode()


def host_copy(folder: Path, where: Path) -> Path:
    shutil.copytree(folder, where)
    return where


def test_deepseek_v4_prompts_are_its_encoders_own_and_tool_calls_replay_on_two_hosts(tmp_path, dsv4_path, own_code):
    with Stack(tmp_path / "run", tokenizer=dsv4_path, stop_timeout=STACK_STOP_TIMEOUT) as stack:
        hosts = [host_copy(dsv4_path, tmp_path / f"host{i}") for i in range(2)]
        redis_url = start_hosts(stack, *hosts)
        enqueue(tmp_path, redis_url, dsv4_path, "single", SINGLE_ROWS)
        enqueue(tmp_path, redis_url, dsv4_path, "tools", ROWS, "--history", "own")
        wait_finished(redis_url, "single", expected=len(SINGLE_ROWS), stack=stack)
        wait_conversations_finished(redis_url, "tools", stack=stack)
        out = stack.dir / "out"

        singles = assert_exactly_once(redis_url, "single", out / "single", expected=len(SINGLE_ROWS))
        rows = {row["id"]: row for row in SINGLE_ROWS}
        assert {r.variant for r in singles.values()} == {"thinking", "chat"}
        for record in singles.values():
            messages = rows[record.id]["messages"]
            if messages[-1]["role"] == "assistant":  # --turns last: the prompt before the last answer
                messages = messages[:-1]
            expected = own_prompt_ids(
                own_code, messages, tools=rows[record.id].get("tools"), thinking=record.variant == "thinking"
            )
            assert record.prompt_ids == expected, f"{record.id} ({record.variant})"

        tools = campaign(redis_url, "tools")
        settings = tools.settings()
        assert settings is not None and settings.tool_format == "dsml"
        assert set(settings.tokenizer_files) == {ENCODER, "tokenizer.json", "tokenizer_config.json"}
        # Nothing of the tokenizer is in Redis: the workers used their own folders.
        assert not tools.client.exists(tokenizer_blob(settings.tokenizer_fingerprint, settings.chat_template_hash))

        status = json.loads(cli("status", "tools", "--json", "--redis", redis_url).stdout)
        records = assert_exactly_once(redis_url, "tools", out / "tools", expected=status["enqueued"])

        def give_results(answer: dict, dataset_calls: list[dict], results: list[dict]) -> list[dict]:
            for mine, theirs in zip(answer["tool_calls"], dataset_calls):
                mine["id"] = theirs.get("id")  # the dataset's ids: DSML writes none
            return results

        called = check_replayed_conversations(
            records,
            own_prompt_ids=lambda messages, tools, variant: own_prompt_ids(
                own_code, messages, tools=tools, thinking=variant == "thinking"
            ),
            read_answer=lambda ids, variant: own_answer(own_code, ids, thinking=variant == "thinking"),
            give_results=give_results,
        )
        assert called >= 4  # the model's own DSML calls were replayed, not just words
        check_record_tools(out / "tools", hosts[1], shown="<｜Assistant｜>")
        # Both hosts rendered follow-up turns, each from its own folder.
        logs = stack.logs(tail=200_000)
        assert logs.count("rendering next turns with the tokenizer") == 2, logs[-3000:]


def test_a_worker_whose_folder_differs_or_is_missing_refuses_before_any_follow_up(tmp_path, dsv4_path):
    with Stack(tmp_path / "run", tokenizer=dsv4_path, stop_timeout=STACK_STOP_TIMEOUT) as stack:
        differing = host_copy(dsv4_path, tmp_path / "differing")
        with (differing / ENCODER).open("a") as f:
            f.write("\n# a local edit\n")
        redis_url = start_hosts(stack, differing)
        rows = ROWS[:2]
        enqueue(tmp_path, redis_url, dsv4_path, "tools", rows, "--history", "own")
        expected = len(rows)
        wait_finished(redis_url, "tools", expected=expected, stack=stack)
        failures = dict(campaign(redis_url, "tools").iter_failures())
        assert len(failures) == expected and not (stack.dir / "out" / "tools" / "records").exists()
        for failure in failures.values():
            assert failure.reason == "tokenizer-unavailable"
            assert "\n" not in failure.message
            assert f"differing/{ENCODER} differs from the campaign's" in failure.message

    with Stack(tmp_path / "bare", tokenizer=dsv4_path, stop_timeout=STACK_STOP_TIMEOUT) as stack:
        redis_url = start_hosts(stack, None)
        enqueue(tmp_path, redis_url, dsv4_path, "tools", ROWS[:1], "--history", "own")
        wait_finished(redis_url, "tools", expected=1, stack=stack)
        (failure,) = dict(campaign(redis_url, "tools").iter_failures()).values()
        assert "start the worker with --tokenizer DIR" in failure.message


def test_the_encoder_runs_only_on_explicit_trust(tmp_path, dsv4_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", SINGLE_ROWS)
    done = cli("enqueue", str(rows), "--campaign", "c", "--tokenizer", str(dsv4_path), "--dry-run", check=False)
    assert done.returncode != 0
    error = done.stderr.decode()
    assert "formats chats with Python code (encoding_dsv4.py)" in error and "--trust-remote-code" in error
    assert "Traceback" not in error
