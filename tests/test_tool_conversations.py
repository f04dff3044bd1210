"""Conversations with tools on the model's own answers (`--history own`) through the whole path:
CLI enqueue -> Redis -> a real Celery worker -> devserver (SGLang's or vLLM's API) over HTTP ->
records -> status / failed.

The devserver answers a user turn that offers tools with calls to the tools that turn names
(written in Qwen3.5's format), and tool results with words. Every turn's prompt ids are checked
against the contract in docs/records.md, computed here with plain transformers and a parser of
this test's own; every record's `tool_calls` against that parser too.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import write_jsonl
from tests.helpers import assert_exactly_once, cli, status_json
from tests.test_conversations import wait_conversations_finished

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Today's weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
]


def call(name: str, arguments: dict, call_id: str | None = None) -> dict:
    return {
        **({"id": call_id} if call_id else {}),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


ROWS = [
    # One call, its result, words; then a user turn that calls again, its result, words.
    {
        "id": "single",
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Please lookup 'river'."},
            {"role": "assistant", "content": "", "tool_calls": [call("lookup", {"word": "river"})]},
            {"role": "tool", "content": "a natural stream of water"},
            {"role": "assistant", "content": "A river is a natural stream of water."},
            {"role": "user", "content": "Thanks. And the weather in Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [call("weather", {"city": "Oslo"})]},
            {"role": "tool", "content": "rain, 7 C"},
            {"role": "assistant", "content": "Rainy and 7 C."},
        ],
    },
    # Parallel calls; the results come in another order than the calls, paired by id.
    {
        "id": "parallel",
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "You use tools."},
            {"role": "user", "content": "Use lookup and weather for Paris."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("lookup", {"word": "Paris"}, "c1"), call("weather", {"city": "Paris"}, "c2")],
            },
            {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c1", "content": "the capital of France"},
            {"role": "assistant", "content": "Paris is France's capital; it is sunny."},
        ],
    },
    # The model calls weather where the dataset called lookup.
    {
        "id": "other-function",
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "What is the weather in Rome?"},
            {"role": "assistant", "content": "", "tool_calls": [call("lookup", {"word": "Rome"})]},
            {"role": "tool", "content": "a city"},
            {"role": "assistant", "content": "Rome is a city."},
        ],
    },
    # The model calls a tool where the dataset answered in words.
    {
        "id": "words-in-dataset",
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Nothing, thanks."},
        ],
    },
    # No tools: the plain contract, no tool_calls in its records.
    {"id": "plain", "messages": [{"role": "user", "content": "Say hi."}]},
]
# How each row's conversation ends, and its number of turns (records).
EXPECTED = {
    "single": ("complete", 4),
    "parallel": ("complete", 2),
    "other-function": ("tool-call-mismatch", 1),
    "words-in-dataset": ("tool-call-mismatch", 1),
    "plain": ("complete", 1),
}
CALL = re.compile(r"<tool_call>\n<function=([^>\n]+)>\n(.*?)</function>\n</tool_call>", re.S)
PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>\n", re.S)


def model_turn(tokenizer, output_ids: list[int]) -> tuple[str | None, str, list[dict]]:
    """(reasoning, content, calls) of an answer, read with this test's own Qwen3.5 parser."""
    ids = list(output_ids)
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids.pop()
    think_close = tokenizer.convert_tokens_to_ids("</think>")
    reasoning = None
    if think_close in ids:
        cut = ids.index(think_close)
        reasoning, ids = tokenizer.decode(ids[:cut], skip_special_tokens=True).strip(), ids[cut + 1 :]
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    calls = [{"name": name, "arguments": dict(PARAMETER.findall(body))} for name, body in CALL.findall(text)]
    if not calls:
        return reasoning, tokenizer.decode(ids, skip_special_tokens=True).strip(), []
    return reasoning, text[: text.index("<tool_call>")].strip(), calls


def dataset_steps(row: dict) -> list[tuple[list[dict], list[dict], list[dict]]]:
    """Per point: (new messages before it, the dataset's calls after it, their results)."""
    messages = row["messages"]
    out, new = [], []
    for i, message in enumerate(messages):
        ends_run = message["role"] == "tool" and (i + 1 == len(messages) or messages[i + 1]["role"] != "tool")
        if message["role"] not in ("assistant", "tool"):
            new.append(message)
        if message["role"] == "user" or ends_run:
            answer = messages[i + 1] if i + 1 < len(messages) else {}
            calls = answer.get("tool_calls") or []
            results = []
            for later in messages[i + 2 :] if calls else []:
                if later["role"] != "tool":
                    break
                results.append(later)
            out.append((new, calls, results))
            new = []
    return out


def check_conversation(tokenizer, row: dict, turns: list) -> None:
    """Every turn's prompt ids are the documented contract's; the records count the calls."""
    steps = dataset_steps(row)
    tools = row.get("tools")
    messages = list(steps[0][0])
    for index, record in enumerate(turns):
        expected = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)["input_ids"]
        assert record.prompt_ids == list(expected), f"{row['id']} turn {index}: prompt ids differ from the contract"
        reasoning, content, calls = model_turn(tokenizer, record.output_ids)
        assert record.tool_calls == (len(calls) if tools else None), f"{row['id']} turn {index}"
        if index + 1 == len(turns):
            break
        assistant = {"role": "assistant", "content": content}
        if reasoning is not None:
            assistant["reasoning_content"] = reasoning
        _, dataset_calls, results = steps[index]
        if calls:
            assistant["tool_calls"] = [
                call(c["name"], c["arguments"], theirs.get("id")) for c, theirs in zip(calls, dataset_calls)
            ]
            by_id = {r.get("tool_call_id"): r for r in results}
            results = [by_id[c["id"]] for c in dataset_calls] if all(c.get("id") for c in dataset_calls) else results
        messages = [*messages, assistant, *results, *steps[index + 1][0]]


def enqueue(tmp_path, redis_url: str, tokenizer_path, name: str, *extra: str) -> None:
    rows = write_jsonl(tmp_path / f"{name}.jsonl", ROWS)
    args = ["--max-new-tokens", "256", "--temperature", "0.7", "--seed", "3", "--batch-size", "4"]
    done = cli(
        *("enqueue", str(rows), "--campaign", name, "--tokenizer", str(tokenizer_path), "--history", "own"),
        *args,
        *extra,
        "--redis",
        redis_url,
    )
    assert f"rows read {len(ROWS)} / enqueued {len(ROWS)}" in done.stdout.decode()


def by_conversation(records: dict) -> dict[str, list]:
    turns: dict[str, list] = {}
    for record in records.values():
        turns.setdefault(record.id, []).append(record)
    for listed in turns.values():
        listed.sort(key=lambda r: r.turn)
    return turns


def test_tool_conversations_replay_the_datasets_results_on_the_models_own_calls(
    tmp_path, redis_server, stack, tokenizer, tokenizer_path, server_api
):
    _, url = stack.devserver("--token-latency", "0.001", "--mean-output-tokens", "12", api=server_api)
    out = tmp_path / "out"
    enqueue(tmp_path, redis_server.url, tokenizer_path, "tools")
    # The same rows parsed as Hermes JSON calls: the model's Qwen3.5 calls do not parse.
    enqueue(tmp_path, redis_server.url, tokenizer_path, "hermes", "--tool-format", "hermes")
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, args=["--render-processes", "1"])
    status = wait_conversations_finished(redis_server.url, "tools", stack=stack)

    records = assert_exactly_once(redis_server.url, "tools", out / "tools", expected=status["enqueued"])
    assert {r.backend for r in records.values()} == {server_api}
    turns = by_conversation(records)
    assert {row: (len(t)) for row, t in turns.items()} == {row: n for row, (_, n) in EXPECTED.items()}
    for row in ROWS:
        check_conversation(tokenizer, row, turns[row["id"]])
    # The parallel step: two calls in the model's first turn, answered in the calls' order.
    assert turns["parallel"][0].tool_calls == 2
    second = tokenizer.decode(turns["parallel"][1].prompt_ids)
    assert second.index("the capital of France") < second.index("sunny")

    conversations = status_json(redis_server.url, "tools")["conversations"]
    assert conversations["total"] == len(ROWS) and conversations["in_progress"] == 0
    assert conversations["done"] == sum(1 for end, _ in EXPECTED.values() if end == "complete")
    assert conversations["stopped_by_reason"] == {"tool-call-mismatch": 2}
    stopped = json.loads(cli("failed", "tools", "--json", "--redis", redis_server.url).stdout)["conversations_stopped"]
    examples = {e["row_id"]: e for e in stopped["tool-call-mismatch"]["examples"]}
    assert set(examples) == {"other-function", "words-in-dataset"}
    assert "'weather' where the dataset called 'lookup'" in examples["other-function"]["message"]
    assert "where the dataset answered without tools" in examples["words-in-dataset"]["message"]

    hermes = wait_conversations_finished(redis_server.url, "hermes", stack=stack)["conversations"]
    # Every row with tools stops at its first turn: the model calls a tool there in Qwen3.5's format.
    assert hermes["stopped_by_reason"] == {"tool-call-unparsed": 4} and hermes["done"] == 1
    unparsed = assert_exactly_once(redis_server.url, "hermes", out / "hermes", expected=len(ROWS))
    assert sorted(r.tool_calls for r in unparsed.values() if r.tool_calls is not None) == [0, 0, 0, 0]

    exported = tmp_path / "tools.jsonl"
    cli("export", str(out / "tools"), "--out", str(exported))
    rows = [json.loads(line) for line in exported.read_text().splitlines()]
    assert {r["key"]: r["tool_calls"] for r in rows} == {r.key: r.tool_calls for r in records.values()}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tool-format", "nope"], "--tool-format 'nope' is not a known format"),
        (["--history", "dataset", "--tool-format", "hermes"], "--tool-format applies with --history own"),
    ],
)
def test_tool_format_flag_errors_name_the_flag(tmp_path, tokenizer_path, flags, message):
    rows = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    args = ["enqueue", str(rows), "--campaign", "c", "--tokenizer", str(tokenizer_path), "--dry-run"]
    if "--history" not in flags:
        args += ["--history", "own"]
    result = cli(*args, *flags, check=False)
    assert result.returncode == 2 and message in result.stderr.decode()


def test_rows_with_tools_are_skipped_with_the_fix_when_the_template_has_no_known_format(tmp_path, tokenizer_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    plain = tmp_path / "plain.jinja"
    plain.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    args = ["enqueue", str(rows), "--campaign", "c", "--tokenizer", str(tokenizer_path), "--history", "own"]
    result = cli(*args, "--dry-run", "--chat-template", str(plain)).stdout.decode()
    assert f"rows read {len(ROWS)} / would enqueue 1 / duplicate 0 / skipped {len(ROWS) - 1}" in result
    assert f"skipped no-tool-format: {len(ROWS) - 1}" in result
    assert f"{rows}:1: tools: the chat template's tool-call format is not one eagle-synth can parse" in result
    # Naming the format makes them regenerable.
    named = cli(*args, "--dry-run", "--chat-template", str(plain), "--tool-format", "hermes").stdout.decode()
    assert f"rows read {len(ROWS)} / would enqueue {len(ROWS)} / duplicate 0 / skipped 0" in named
