"""The pairing rule: the model's i-th call gets the dataset's i-th result of the step, or a mismatch."""

from __future__ import annotations

import pytest

from eagle_synth.regeneration import regeneration_points
from eagle_synth.toolcalls import ParsedAnswer
from eagle_synth.toolcalls.pairing import (
    TOOL_CALL_MISMATCH,
    TOOL_CALL_UNPARSED,
    TOOL_RESULTS_UNPAIRED,
    Mismatch,
    Replay,
    ToolStep,
    assistant_message,
    dataset_step,
    pair_tool_results,
)
from producer.rows import conversations_from_row


def call(name, arguments=None, call_id=None):
    return {
        **({"id": call_id} if call_id else {}),
        "type": "function",
        "function": {"name": name, "arguments": arguments or {}},
    }


def result(content, call_id=None):
    return {"role": "tool", "content": content, **({"tool_call_id": call_id} if call_id else {})}


STEP = ToolStep(
    calls=[call("weather", {"city": "Paris"}, "d1"), call("weather", {"city": "Rome"}, "d2")],
    results=[result("18C", "d1"), result("25C", "d2")],
)


def answer(*names_and_args, content="", ids=None):
    calls = [{**({"id": ids[i]} if ids else {}), "name": n, "arguments": a} for i, (n, a) in enumerate(names_and_args)]
    return ParsedAnswer(content=content, tool_calls=calls)


def test_parallel_calls_pair_in_order_with_the_models_own_arguments():
    mine = answer(("weather", {"city": "Paris", "units": "C"}), ("weather", {"city": "Roma"}), content="Checking.")
    replay = pair_tool_results(mine, STEP, reasoning="two cities")
    assert replay == Replay(
        assistant={
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "two cities",
            "tool_calls": [
                call("weather", {"city": "Paris", "units": "C"}, "d1"),
                call("weather", {"city": "Roma"}, "d2"),
            ],
        },
        tool_messages=[result("18C", "d1"), result("25C", "d2")],
    )


def test_results_follow_the_calls_order_when_ids_pair_up():
    shuffled = ToolStep(
        calls=[call("a", call_id="x"), call("b", call_id="y")], results=[result("for b", "y"), result("for a", "x")]
    )
    replay = pair_tool_results(answer(("a", {}), ("b", {})), shuffled, reasoning="")
    assert [m["content"] for m in replay.tool_messages] == ["for a", "for b"]
    positional = ToolStep(calls=[call("a"), call("b")], results=[result("first"), result("second")])
    assert [
        m["content"] for m in pair_tool_results(answer(("a", {}), ("b", {})), positional, reasoning="").tool_messages
    ] == ["first", "second"]


def test_model_ids_win_and_rename_the_results():
    mine = answer(("weather", {}), ("weather", {}), ids=["functions.weather:0", "functions.weather:1"])
    replay = pair_tool_results(mine, STEP, reasoning="")
    assert [c["id"] for c in replay.assistant["tool_calls"]] == ["functions.weather:0", "functions.weather:1"]
    assert [m["tool_call_id"] for m in replay.tool_messages] == ["functions.weather:0", "functions.weather:1"]
    assert STEP.results[0]["tool_call_id"] == "d1", "the dataset's messages are not modified"


@pytest.mark.parametrize(
    ("mine", "reason", "words"),
    [
        (
            answer(("weather", {}), ("search", {})),
            TOOL_CALL_MISMATCH,
            "call 1 is 'search' where the dataset called 'weather'",
        ),
        (answer(("weather", {})), TOOL_CALL_MISMATCH, "1 call(s) (weather) where the dataset made 2"),
        (answer(("weather", {}), ("weather", {}), ("weather", {})), TOOL_CALL_MISMATCH, "3 call(s)"),
        (
            ParsedAnswer(content="It is sunny."),
            TOOL_CALL_MISMATCH,
            "no tool call where the dataset called weather, weather",
        ),
        (
            ParsedAnswer(
                content="", tool_calls=[{"name": "weather", "arguments": {}}], unparsed=True, problem="truncated: x"
            ),
            TOOL_CALL_UNPARSED,
            "truncated: x",
        ),
    ],
)
def test_departures_are_mismatches(mine, reason, words):
    outcome = pair_tool_results(mine, STEP, reasoning="")
    assert isinstance(outcome, Mismatch) and outcome.reason == reason and words in outcome.detail


def test_a_call_where_the_dataset_answered_in_text_is_a_mismatch():
    outcome = pair_tool_results(answer(("weather", {})), ToolStep(), reasoning="")
    assert outcome == Mismatch(TOOL_CALL_MISMATCH, "called weather where the dataset answered without tools")


def test_text_answer_where_the_dataset_answered_in_text_replays_without_tools():
    outcome = pair_tool_results(ParsedAnswer(content="Sunny."), ToolStep(), reasoning="r")
    assert outcome == Replay(
        assistant={"role": "assistant", "content": "Sunny.", "reasoning_content": "r"}, tool_messages=[]
    )


def test_dataset_step_without_one_result_per_call():
    short = ToolStep(calls=STEP.calls, results=STEP.results[:1])
    outcome = pair_tool_results(answer(("weather", {}), ("weather", {})), short, reasoning="")
    assert outcome == Mismatch(TOOL_RESULTS_UNPAIRED, "the dataset's step has 2 call(s) but 1 result(s)")


def test_assistant_message_copies_arguments():
    mine = answer(("f", {"deep": {"x": 1}}))
    message = assistant_message(mine, reasoning="")
    message["tool_calls"][0]["function"]["arguments"]["deep"]["x"] = 2
    assert mine.tool_calls[0]["arguments"] == {"deep": {"x": 1}}


def test_dataset_step_at_each_regeneration_point_of_a_row():
    row = {
        "messages": [
            {"role": "user", "content": "Paris and Rome?"},
            {"role": "assistant", "content": "", "tool_calls": STEP.calls},
            *STEP.results,
            {"role": "assistant", "content": "18C and 25C."},
            {"role": "user", "content": "Thanks"},
        ]
    }
    (last,) = conversations_from_row(row, source="s", line=1)
    messages = row["messages"]
    points = regeneration_points(messages)
    assert points == [0, 3, 5] and last.turn == 2
    steps = [dataset_step(messages, p) for p in points]
    assert steps[0] == STEP
    assert steps[1] == ToolStep() and steps[2] == ToolStep()
