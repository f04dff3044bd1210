"""Tool rows through the whole path: producer -> Redis -> worker -> devserver -> records.

OpenAI and ShareGPT rows with tools, parallel and multi-step calls are enqueued with
`--turns all` (the dataset's history, today's only mode); every record's prompt must be exactly
`apply_chat_template(prefix, tools=row_tools, add_generation_prompt=True)` of the prefix written
out by hand below (independently of producer.rows). The devserver answers the prompts that end
with a user turn with a Qwen3.5 tool call, and those after tool results in words.
"""

from __future__ import annotations

import json

from eagle_synth.toolcalls import parse_tool_calls
from tests.answer_text import split_reasoning
from tests.conftest import write_jsonl
from tests.helpers import assert_exactly_once, cli, wait_finished

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}},
    },
}


def user(text):
    return {"role": "user", "content": text}


def calls(*specs, content=""):
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {**({"id": i} if i else {}), "type": "function", "function": {"name": n, "arguments": a}}
            for n, a, i in specs
        ],
    }


def result(text, call_id=None):
    return {"role": "tool", "content": text, **({"tool_call_id": call_id} if call_id else {})}


ROWS = [
    {
        "id": "parallel",
        "tools": [WEATHER, SEARCH],
        "messages": [
            {"role": "system", "content": "Use tools."},
            user("Weather in Köln and Paris?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Köln", "days": 2}'},
                    },
                    {"id": "b", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}},
                ],
            },
            result("12C", "a"),
            result("18C", "b"),
            {"role": "assistant", "content": "Köln 12C, Paris 18C."},
        ],
    },
    {
        "id": "multistep",
        "tools": json.dumps([SEARCH, WEATHER]),
        "messages": [
            user("Find the capital of Norway, then its weather."),
            {
                "role": "assistant",
                "content": "Searching.",
                "tool_calls": [
                    {
                        "id": "s1",
                        "type": "function",
                        "function": {
                            "name": "search",
                            "arguments": '{"query": "capital of Norway", "filters": {"lang": ["en"]}}',
                        },
                    }
                ],
            },
            result("Oslo", "s1"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "w1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
                ],
            },
            result("3C", "w1"),
            {"role": "assistant", "content": "Oslo, 3C."},
            user("Thanks!"),
            {"role": "assistant", "content": "You're welcome."},
        ],
    },
    {
        "id": "sharegpt",
        "tools": json.dumps([WEATHER]),
        "conversations": [
            {"from": "human", "value": "weather for Rome"},
            {"from": "function_call", "value": '{"name": "weather", "arguments": {"city": "Rome"}}'},
            {"from": "observation", "value": "25C"},
            {"from": "gpt", "value": "25C in Rome."},
        ],
    },
    {"id": "no-tools", "messages": [user("Hi"), {"role": "assistant", "content": "Hello"}, user("Bye")]},
]

# Every regeneration point, written out by hand: (row id, turn) -> (messages prefix, tools).
EXPECTED = {
    ("parallel", 0): (
        [{"role": "system", "content": "Use tools."}, user("Weather in Köln and Paris?")],
        [WEATHER, SEARCH],
    ),
    ("parallel", 1): (
        [
            {"role": "system", "content": "Use tools."},
            user("Weather in Köln and Paris?"),
            calls(("weather", {"city": "Köln", "days": 2}, "a"), ("weather", {"city": "Paris"}, "b")),
            result("12C", "a"),
            result("18C", "b"),
        ],
        [WEATHER, SEARCH],
    ),
    ("multistep", 0): ([user("Find the capital of Norway, then its weather.")], [SEARCH, WEATHER]),
    ("multistep", 1): (
        [
            user("Find the capital of Norway, then its weather."),
            calls(("search", {"query": "capital of Norway", "filters": {"lang": ["en"]}}, "s1"), content="Searching."),
            result("Oslo", "s1"),
        ],
        [SEARCH, WEATHER],
    ),
    ("multistep", 2): (
        [
            user("Find the capital of Norway, then its weather."),
            calls(("search", {"query": "capital of Norway", "filters": {"lang": ["en"]}}, "s1"), content="Searching."),
            result("Oslo", "s1"),
            calls(("weather", {"city": "Oslo"}, "w1")),
            result("3C", "w1"),
        ],
        [SEARCH, WEATHER],
    ),
    ("multistep", 3): (
        [
            user("Find the capital of Norway, then its weather."),
            calls(("search", {"query": "capital of Norway", "filters": {"lang": ["en"]}}, "s1"), content="Searching."),
            result("Oslo", "s1"),
            calls(("weather", {"city": "Oslo"}, "w1")),
            result("3C", "w1"),
            {"role": "assistant", "content": "Oslo, 3C."},
            user("Thanks!"),
        ],
        [SEARCH, WEATHER],
    ),
    ("sharegpt", 0): ([user("weather for Rome")], [WEATHER]),
    ("sharegpt", 1): ([user("weather for Rome"), calls(("weather", {"city": "Rome"}, None)), result("25C")], [WEATHER]),
    ("no-tools", 0): ([user("Hi")], None),
    ("no-tools", 1): ([user("Hi"), {"role": "assistant", "content": "Hello"}, user("Bye")], None),
}


def test_tool_rows_every_point_end_to_end(tmp_path, redis_server, stack, tokenizer, tokenizer_path):
    rows_file = write_jsonl(tmp_path / "tools.jsonl", ROWS)
    _, url = stack.devserver("--token-latency", "0.0005", "--mean-output-tokens", "40")
    out = tmp_path / "out"
    enqueued = cli(
        "enqueue",
        str(rows_file),
        "--campaign",
        "tools",
        "--tokenizer",
        str(tokenizer_path),
        "--turns",
        "all",
        "--max-new-tokens",
        "4096",
        "--temperature",
        "0",
        "--batch-size",
        "4",
        "--redis",
        redis_server.url,
    )
    assert f"rows read {len(ROWS)} / enqueued {len(ROWS)} / duplicate 0 / skipped 0" in enqueued.stdout.decode()

    stack.worker(servers=[url], out=out, redis_url=redis_server.url, concurrency=2)
    wait_finished(redis_server.url, "tools", expected=len(EXPECTED), stack=stack)
    records = assert_exactly_once(redis_server.url, "tools", out / "tools", expected=len(EXPECTED))

    assert sorted((r.id, r.turn) for r in records.values()) == sorted(EXPECTED)
    for record in records.values():
        prefix, tools = EXPECTED[(record.id, record.turn)]
        expected = tokenizer.apply_chat_template(
            prefix, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        assert record.prompt_ids == expected, (record.id, record.turn)

        # The emulated model calls a tool after a user turn that offers tools, and answers
        # tool results (or a row without tools) in words.
        assert record.finish_reason == "stop"
        _, answer = split_reasoning(tokenizer.decode(record.output_ids[:-1], skip_special_tokens=False))
        parsed = parse_tool_calls(answer, family="qwen3_coder", tools=tools)
        assert not parsed.unparsed, (record.id, record.turn, answer)
        wants_call = tools is not None and prefix[-1]["role"] == "user"
        assert bool(parsed.tool_calls) == wants_call, (record.id, record.turn, answer)
        offered = {t["function"]["name"] for t in tools or ()}
        assert {c["name"] for c in parsed.tool_calls} <= offered


def test_template_wanting_text_arguments_gets_them(tmp_path, redis_server, tokenizer, tokenizer_path):
    """DeepSeek-V3.1's own template concatenates the arguments as text and rejects objects: the
    producer gives it JSON text, and the prompt is what that template renders for text arguments."""
    from tests.fixture_tokenizer import package_model_dir
    from tests.helpers import enqueue_rows, queued_items

    template = json.loads((package_model_dir().parent / "deepseek-v3.1" / "tokenizer_config.json").read_text())[
        "chat_template"
    ]
    template_file = tmp_path / "deepseek-v3.1.jinja"
    template_file.write_text(template)
    row = {
        "id": "ds",
        "tools": [WEATHER],
        "messages": [
            user("Weather in Köln?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {"name": "weather", "arguments": {"city": "Köln", "days": 2}},
                    }
                ],
            },
            result("12C", "a"),
        ],
    }
    summary = enqueue_rows(
        tmp_path, redis_server.url, "ds", [row], tokenizer=tokenizer_path, chat_template=str(template_file)
    )
    assert summary.prompts_enqueued == 1 and not summary.skipped
    (item,) = queued_items(redis_server.url)
    text_arguments = [
        user("Weather in Köln?"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Köln", "days": 2}'},
                }
            ],
        },
        result("12C", "a"),
    ]
    expected = tokenizer.apply_chat_template(
        text_arguments,
        tools=[WEATHER],
        chat_template=template,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    assert item.ids == expected
    assert "<｜tool▁sep｜>" + '{"city": "Köln", "days": 2}' in tokenizer.decode(item.ids)
