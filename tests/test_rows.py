"""Tests for producer.rows: row shapes, turn selection, system/tools handling and errors."""

from __future__ import annotations

import json

import pytest

from eagle_synth.errors import RowError
from producer.rows import ROLE_ALIASES, Conversation, conversations_from_row


def convs(data, **kwargs):
    kwargs.setdefault("source", "data/set.jsonl")
    kwargs.setdefault("line", 7)
    return conversations_from_row(data, **kwargs)


def one(data, **kwargs):
    (conv,) = convs(data, **kwargs)
    return conv


def error(data, **kwargs) -> RowError:
    with pytest.raises(RowError) as info:
        convs(data, **kwargs)
    return info.value


U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text: {"role": "assistant", "content": text}  # noqa: E731
S = lambda text: {"role": "system", "content": text}  # noqa: E731


# --------------------------------------------------------------------------- shapes


def test_openai_messages_last_turn_drops_old_answer():
    row = {"id": 12, "messages": [S("sys"), U("q1"), A("a1"), U("q2"), A("a2")]}
    assert one(row) == Conversation([S("sys"), U("q1"), A("a1"), U("q2")], None, "12", 1)


def test_all_turns_gives_one_conversation_per_user_turn_with_history():
    row = {"messages": [U("q1"), A("a1"), U("q2"), A("a2"), U("q3")]}
    out = convs(row, turns="all")
    assert [c.turn for c in out] == [0, 1, 2]
    assert [c.messages for c in out] == [
        [U("q1")],
        [U("q1"), A("a1"), U("q2")],
        [U("q1"), A("a1"), U("q2"), A("a2"), U("q3")],
    ]
    assert {c.row_id for c in out} == {"set.jsonl:7"}


def test_returned_messages_are_independent_copies():
    row = {"messages": [U("q1"), A("a1"), U("q2")]}
    first, second = convs(row, turns="all")
    first.messages[0]["content"] = "changed"
    assert second.messages[0]["content"] == "q1"
    assert row["messages"][0]["content"] == "q1"


def test_sharegpt_roles_are_mapped():
    row = {
        "conversations": [
            {"from": "system", "value": "s"},
            {"from": "human", "value": "h"},
            {"from": "gpt", "value": "g"},
            {"from": "function_call", "value": '{"name": "f"}'},
            {"from": "observation", "value": "42"},
            {"from": "chatgpt", "value": "c"},
            {"from": "USER", "value": "u"},
            {"from": "model", "value": "old answer"},
        ]
    }
    assert one(row).messages == [
        S("s"),
        U("h"),
        A("g"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}],
        },
        {"role": "tool", "content": "42"},
        A("c"),
        U("u"),
    ]


@pytest.mark.parametrize(
    ("alias", "role"),
    [
        ("bot", "assistant"),
        ("function", "tool"),
        ("function_response", "tool"),
        ("tool", "tool"),
        ("developer", "system"),
    ],
)
def test_more_role_aliases(alias, role):
    msgs = one({"conversations": [{"from": alias, "value": "x"}, {"from": "user", "value": "q"}]}).messages
    assert msgs[0] == {"role": role, "content": "x"}
    assert ROLE_ALIASES[alias] == role


def test_sharegpt_with_role_content_entries():
    assert one({"conversations": [{"role": "user", "content": "q"}]}).messages == [U("q")]


def test_prompt_string_becomes_one_user_message():
    assert one({"prompt": "hello"}) == Conversation([U("hello")], None, "set.jsonl:7", 0)


def test_messages_take_precedence_over_prompt_and_null_shapes_are_skipped():
    # Parquet rows carry every column; null ones must not count as a shape.
    row = {"messages": None, "conversations": [{"from": "human", "value": "c"}], "prompt": "p"}
    assert one(row).messages == [U("c")]
    assert one({"messages": [U("m")], "prompt": "p"}).messages == [U("m")]


def test_content_kept_exactly():
    text = "  leading and trailing  \n\n"
    assert one({"prompt": text}).messages[0]["content"] == text


def test_text_parts_are_joined_without_separator():
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}]}
    assert one(row).messages == [U("a b")]


def test_tool_calls_and_tool_messages_kept_and_null_keys_dropped():
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    normalised = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]
    row = {
        "messages": [
            {"role": "user", "content": "q", "name": None, "tool_calls": None},
            {"role": "assistant", "content": None, "tool_calls": call},
            {"role": "tool", "content": "7", "tool_call_id": "c1", "name": "f"},
            {"role": "user", "content": "and?"},
        ]
    }
    assert one(row).messages == [
        U("q"),
        {"role": "assistant", "content": "", "tool_calls": normalised},
        {"role": "tool", "content": "7", "tool_call_id": "c1", "name": "f"},
        U("and?"),
    ]


# --------------------------------------------------------------------------- id, system, tools


@pytest.mark.parametrize(
    ("value", "expected"), [("abc", "abc"), (3, "3"), (2.5, "2.5"), (None, "set.jsonl:7"), ("", "set.jsonl:7")]
)
def test_row_id(value, expected):
    assert one({"id": value, "prompt": "q"}).row_id == expected


def test_row_id_fallback_uses_basename_of_source():
    assert one({"prompt": "q"}, source="-", line=3).row_id == "-:3"
    assert one({"prompt": "q"}, source="/a/b/ds/train", line=9).row_id == "train:9"


def test_system_field_prepended_only_without_system_message():
    assert one({"system": "S", "prompt": "q"}).messages == [S("S"), U("q")]
    assert one({"system": "S", "messages": [S("own"), U("q")]}).messages == [S("own"), U("q")]


def test_default_system_applies_only_without_system_message_or_field():
    assert one({"prompt": "q"}, default_system="D").messages == [S("D"), U("q")]
    assert one({"prompt": "q", "system": "S"}, default_system="D").messages == [S("S"), U("q")]
    assert one({"messages": [S("own"), U("q")]}, default_system="D").messages == [S("own"), U("q")]
    # empty or null system columns (common in Parquet) count as absent
    assert one({"prompt": "q", "system": ""}, default_system="D").messages == [S("D"), U("q")]
    assert one({"prompt": "q", "system": None}).messages == [U("q")]


def test_system_is_prepended_to_every_turn_in_all_mode():
    out = convs({"system": "S", "messages": [U("a"), A("b"), U("c")]}, turns="all")
    assert [c.messages[0] for c in out] == [S("S"), S("S")]


def test_tools_list_and_json_string():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    assert one({"prompt": "q", "tools": tools}).tools == tools
    assert one({"prompt": "q", "tools": json.dumps(tools)}).tools == tools
    assert one({"prompt": "q", "tools": []}).tools is None
    assert one({"prompt": "q", "tools": ""}).tools is None


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("row", "reason", "field"),
    [
        ({"text": "x"}, "no-messages", None),
        ({"messages": []}, "empty-conversation", "messages"),
        ({"conversations": []}, "empty-conversation", "conversations"),
        ({"messages": [S("s"), A("a")]}, "no-user-turn", "messages"),
        ({"messages": "hi"}, "wrong-type", "messages"),
        ({"messages": [U("q"), 5]}, "wrong-type", "messages[1]"),
        ({"messages": [S("s"), {"role": "user", "content": 5}]}, "wrong-type", "messages[1].content"),
        ({"messages": [{"role": 1, "content": "q"}]}, "wrong-type", "messages[0].role"),
        ({"messages": [{"content": "q"}]}, "missing-field", "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "missing-field", "messages[0].content"),
        ({"messages": [{"role": "user", "content": None}]}, "missing-field", "messages[0].content"),
        (
            {"conversations": [{"from": "human", "value": "q"}, {"from": "narrator", "value": "x"}]},
            "unknown-role",
            "conversations[1].from",
        ),
        ({"messages": [{"role": "critic", "content": "x"}]}, "unknown-role", "messages[0].role"),
        ({"messages": [U("q"), A("a"), U("")]}, "empty-content", "messages[2].content"),
        ({"conversations": [{"from": "human", "value": " \n"}]}, "empty-content", "conversations[0].value"),
        ({"prompt": ""}, "empty-content", "prompt"),
        ({"prompt": ["a"]}, "wrong-type", "prompt"),
        ({"prompt": "q", "id": {"a": 1}}, "wrong-type", "id"),
        ({"prompt": "q", "system": 3}, "wrong-type", "system"),
        ({"prompt": "q", "tools": "{not json"}, "bad-json", "tools"),
        ({"prompt": "q", "tools": {"name": "f"}}, "wrong-type", "tools"),
        ({"prompt": "q", "tools": ["f"]}, "wrong-type", "tools[0]"),
    ],
)
def test_row_errors(row, reason, field):
    err = error(row)
    assert (err.reason, err.field) == (reason, field)
    if field:
        assert str(err).startswith(field)


def test_content_part_errors():
    image = {"type": "image_url", "image_url": {"url": "http://x"}}
    err = error({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, image]}]})
    assert (err.reason, err.field) == ("unsupported-content", "messages[0].content[1].type")
    assert "image_url" in str(err)
    err = error({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})
    assert (err.reason, err.field) == ("wrong-type", "messages[0].content[0].text")
    err = error({"messages": [{"role": "user", "content": ["a"]}]})
    assert (err.reason, err.field) == ("wrong-type", "messages[0].content[0]")
    err = error({"messages": [{"role": "user", "content": [{"text": "a"}]}]})
    assert (err.reason, err.field) == ("missing-field", "messages[0].content[0].type")


def test_unknown_role_message_names_the_value():
    err = error({"conversations": [{"from": "narrator", "value": "x"}]})
    assert "narrator" in str(err)


def test_empty_middle_user_turn_only_fails_when_it_is_answered():
    row = {"messages": [U(""), A("a"), U("q")]}
    assert one(row).turn == 1
    assert error(row, turns="all").field == "messages[0].content"


def test_no_messages_error_lists_row_keys():
    assert "instruction" in str(error({"instruction": "x", "output": "y"}))


def test_non_dict_row_and_bad_turns_argument():
    assert error(["x"]).reason == "wrong-type"
    with pytest.raises(ValueError, match="turns"):
        convs({"prompt": "q"}, turns="first")


def test_rows_read_back_from_parquet_lose_arrow_null_padding(tmp_path):
    # Arrow unifies struct fields across rows, so every message gains null
    # keys (tool_calls, tool_call_id, ...) that must not reach the template.
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from producer.sources import iter_source_rows

    call = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    normalised = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]
    rows = [
        {
            "messages": [
                U("q"),
                {"role": "assistant", "content": None, "tool_calls": call},
                {"role": "tool", "content": "r", "tool_call_id": "c"},
                U("q2"),
            ],
            "system": None,
        },
        {"messages": [U("hi")], "system": "S"},
    ]
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = [conversations_from_row(r.data, source=r.source, line=r.line) for r in iter_source_rows([str(path)])]
    assert [c.messages for (c,) in out] == [
        [
            U("q"),
            {"role": "assistant", "content": "", "tool_calls": normalised},
            {"role": "tool", "content": "r", "tool_call_id": "c"},
            U("q2"),
        ],
        [S("S"), U("hi")],
    ]
    assert [c.row_id for (c,) in out] == ["chat.parquet:1", "chat.parquet:2"]


# --------------------------------------------------------------------------- tool calls and regeneration points

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
T = lambda text, call_id=None: {"role": "tool", "content": text, **({"tool_call_id": call_id} if call_id else {})}  # noqa: E731


def calls_msg(*calls, content=""):
    """The normalised assistant message for (name, arguments[, id]) calls."""
    out = []
    for call in calls:
        name, arguments, *rest = call
        out.append(
            {
                **({"id": rest[0]} if rest else {}),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return {"role": "assistant", "content": content, "tool_calls": out}


def openai_call(name, arguments, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_openai_tool_row_every_point_with_parallel_calls_and_json_string_arguments():
    row = {
        "id": "t1",
        "tools": json.dumps([WEATHER]),
        "messages": [
            U("Weather in Paris and Köln?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    openai_call("weather", '{"city": "Paris"}', "c1"),
                    openai_call("weather", {"city": "Köln"}, "c2"),
                ],
            },
            T("18C", "c1"),
            T("12C", "c2"),
            A("Paris 18C, Köln 12C."),
            U("And Rome?"),
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [openai_call("weather", '{"city":"Rome"}', "c3")],
            },
            T("25C", "c3"),
            A("Rome 25C."),
        ],
    }
    out = convs(row, turns="all")
    assert [c.turn for c in out] == [0, 1, 2, 3]
    assert [c.messages[-1] for c in out] == [
        U("Weather in Paris and Köln?"),
        T("12C", "c2"),
        U("And Rome?"),
        T("25C", "c3"),
    ]
    assert out[1].messages[1] == calls_msg(("weather", {"city": "Paris"}, "c1"), ("weather", {"city": "Köln"}, "c2"))
    assert out[3].messages[-2] == calls_msg(("weather", {"city": "Rome"}, "c3"), content="Checking.")
    assert all(c.tools == [WEATHER] for c in out)
    # --turns last answers after the last tool result, not the last user turn
    assert one(row).messages == out[3].messages and one(row).turn == 3


def test_row_ending_with_tool_results_is_answered_after_them():
    row = {"messages": [U("q"), {"role": "assistant", "tool_calls": [openai_call("f", "{}", "a")]}, T("r", "a")]}
    conv = one(row)
    assert conv.messages[-1] == T("r", "a") and conv.turn == 1


def test_tool_results_before_the_first_user_turn_are_context_not_a_point():
    row = {"messages": [S("s"), T("cached"), U("q"), A("a")]}
    assert [c.turn for c in convs(row, turns="all")] == [0]
    assert one(row).messages == [S("s"), T("cached"), U("q")]


def test_rows_without_tools_keep_their_user_turn_numbering():
    row = {"messages": [U("q1"), A("a1"), U("q2"), A("a2")]}
    assert [(c.turn, c.messages[-1]) for c in convs(row, turns="all")] == [(0, U("q1")), (1, U("q2"))]


def test_empty_tool_result_is_still_a_point():
    row = {"messages": [U("q"), calls_msg(("f", {})), T("")]}
    assert one(row).messages[-1] == T("")


def test_legacy_function_call_flattened_calls_and_parameters_key():
    row = {
        "messages": [
            U("q"),
            {"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": '{"x": 1}'}},
            {"role": "function", "name": "f", "content": "1"},
            {"role": "assistant", "tool_calls": [{"id": "k", "name": "g", "arguments": {"y": [1, {"z": None}]}}]},
            T("2", "k"),
            {"role": "assistant", "tool_calls": [{"function": {"name": "h", "parameters": {"p": "v"}}}]},
            T("3"),
        ]
    }
    msgs = one(row).messages
    assert msgs[1] == calls_msg(("f", {"x": 1}))
    assert msgs[2] == {"role": "tool", "content": "1", "name": "f"}
    assert msgs[3] == calls_msg(("g", {"y": [1, {"z": None}]}, "k"))
    assert msgs[5] == calls_msg(("h", {"p": "v"}))


def test_sharegpt_function_calling_shapes():
    row = {
        "tools": json.dumps([WEATHER]),
        "conversations": [
            {"from": "human", "value": "Paris and Rome?"},
            {
                "from": "function_call",
                "value": json.dumps(
                    [
                        {"name": "weather", "arguments": {"city": "Paris"}},
                        {"name": "weather", "arguments": '{"city": "Rome"}'},
                    ]
                ),
            },
            {"from": "observation", "value": "18C"},
            {"from": "observation", "value": "25C"},
            {"from": "gpt", "value": "Both mild."},
            {"from": "human", "value": "Köln?"},
            {"from": "function_call", "value": '{"name": "weather", "arguments": {"city": "Köln"}}'},
            {"from": "observation", "value": "12C"},
            {"from": "gpt", "value": "Cool."},
        ],
    }
    out = convs(row, turns="all")
    assert [c.messages[-1] for c in out] == [U("Paris and Rome?"), T("25C"), U("Köln?"), T("12C")]
    assert out[1].messages[1] == calls_msg(("weather", {"city": "Paris"}), ("weather", {"city": "Rome"}))
    assert out[3].messages[-2] == calls_msg(("weather", {"city": "Köln"}))
    assert out[0].tools == [WEATHER]


def test_returned_tool_calls_are_independent_copies():
    row = {"messages": [U("q"), calls_msg(("f", {"a": {"b": 1}})), T("r"), A("x"), U("q2")]}
    first, *_ = convs(row, turns="all")[1:]
    first.messages[1]["tool_calls"][0]["function"]["arguments"]["a"]["b"] = 2
    assert row["messages"][1]["tool_calls"][0]["function"]["arguments"]["a"]["b"] == 1
    assert convs(row, turns="all")[1].messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": {"b": 1}}


@pytest.mark.parametrize(
    ("message", "reason", "field"),
    [
        ({"role": "assistant", "tool_calls": {"name": "f"}}, "wrong-type", "messages[1].tool_calls"),
        ({"role": "assistant", "tool_calls": ["f"]}, "wrong-type", "messages[1].tool_calls[0]"),
        (
            {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]},
            "bad-tool-call",
            "messages[1].tool_calls[0].function.name",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "", "arguments": "{}"}}]},
            "bad-tool-call",
            "messages[1].tool_calls[0].function.name",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
            "bad-json",
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}]},
            "bad-tool-call",
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": 7, "function": {"name": "f"}}]},
            "wrong-type",
            "messages[1].tool_calls[0].id",
        ),
        (
            {"role": "assistant", "function_call": {"name": "f", "arguments": "nope"}},
            "bad-json",
            "messages[1].function_call.arguments",
        ),
        (
            {"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]},
            "bad-tool-call",
            "messages[1].tool_calls",
        ),
        ({"role": "tool"}, "missing-field", "messages[1].content"),
    ],
)
def test_tool_call_errors_name_the_field(message, reason, field):
    err = error({"messages": [U("q"), message, T("r"), U("q2")]})
    assert (err.reason, err.field) == (reason, field)
    assert str(err).startswith(field)


@pytest.mark.parametrize(
    ("value", "reason", "field"),
    [
        ("{not json", "bad-json", "conversations[1].value"),
        ("[]", "bad-tool-call", "conversations[1].value"),
        ('"f"', "wrong-type", "conversations[1].value"),
        ('{"arguments": {}}', "bad-tool-call", "conversations[1].value.name"),
        ('[{"name": "f"}, {"name": "g", "arguments": "x"}]', "bad-json", "conversations[1].value[1].arguments"),
        (None, "missing-field", "conversations[1].content"),
    ],
)
def test_sharegpt_function_call_errors(value, reason, field):
    err = error({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": value}]})
    assert (err.reason, err.field) == (reason, field)
