"""The dataset's tool results paired with the model's own calls: what the next prompt carries.

With `--history own`, after a regenerated turn that calls tools, the next prompt holds the
model's assistant message (its own calls, parsed) followed by the dataset's tool results for
that step. The rule: the model's i-th call gets the dataset's i-th result of the step (parallel
calls too). The model must call the same functions, in the same number and order, as the
dataset did; when it departs, the conversation stops there with a Mismatch instead.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from itertools import takewhile

from eagle_synth.toolcalls.answer import ParsedAnswer

# Mismatch.reason slugs (recorded as failure reasons; stable).
TOOL_CALL_MISMATCH = "tool-call-mismatch"  # other function, other number of calls, a call where none was
TOOL_CALL_UNPARSED = "tool-call-unparsed"  # the model's answer opens a call that does not parse
TOOL_RESULTS_UNPAIRED = "tool-results-unpaired"  # the dataset's step has not one result per call


@dataclass(frozen=True, slots=True)
class ToolStep:
    """What the dataset did right after a regeneration point: its assistant's tool calls there
    (normalised OpenAI shape, as producer.rows gives them; [] for a text answer) and the tool
    messages that follow them, in dataset order."""

    calls: list[dict] = field(default_factory=list)
    results: list[dict] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Replay:
    """The model's turn as the next prompt carries it: its assistant message {"role",
    "content", "reasoning_content", "tool_calls"?}, then the dataset's results, each answering
    the model's call at its index (tool_call_id set to that call's id when there is one)."""

    assistant: dict
    tool_messages: list[dict]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The model departed from the dataset's step; `reason` is a slug above, `detail` says how."""

    reason: str
    detail: str


def dataset_step(messages: list[dict], point: int) -> ToolStep:
    """The dataset's step after the regeneration point at `messages[point]` (the row's full
    normalised messages; points from eagle_synth.regeneration.regeneration_points)."""
    answer = messages[point + 1] if point + 1 < len(messages) else None
    if answer is None or answer["role"] != "assistant" or not answer.get("tool_calls"):
        return ToolStep()
    results = list(takewhile(lambda message: message["role"] == "tool", messages[point + 2 :]))
    return ToolStep(calls=list(answer["tool_calls"]), results=results)


def assistant_message(answer: ParsedAnswer, *, reasoning: str, call_ids: list[str | None] | None = None) -> dict:
    """The assistant message for the model's turn: its content, reasoning and parsed calls.

    A call's id is the one the model wrote (Kimi-K2), else `call_ids[i]` (the dataset's), else none.
    """
    message: dict = {"role": "assistant", "content": answer.content, "reasoning_content": reasoning}
    if answer.tool_calls:
        calls = []
        for i, call in enumerate(answer.tool_calls):
            call_id = call.get("id") or (call_ids[i] if call_ids and i < len(call_ids) else None)
            calls.append(
                {
                    **({"id": call_id} if call_id else {}),
                    "type": "function",
                    "function": {"name": call["name"], "arguments": copy.deepcopy(call["arguments"])},
                }
            )
        message["tool_calls"] = calls
    return message


def pair_tool_results(answer: ParsedAnswer, step: ToolStep, *, reasoning: str) -> Replay | Mismatch:
    """Pair the model's calls with the dataset step's results, or say why they do not pair."""
    if answer.unparsed:
        return Mismatch(TOOL_CALL_UNPARSED, answer.problem or "the tool call does not parse")
    model_names = [call["name"] for call in answer.tool_calls]
    dataset_names = [call["function"]["name"] for call in step.calls]
    if len(model_names) != len(dataset_names):
        return Mismatch(TOOL_CALL_MISMATCH, _count_detail(model_names, dataset_names))
    for i, (mine, theirs) in enumerate(zip(model_names, dataset_names)):
        if mine != theirs:
            return Mismatch(TOOL_CALL_MISMATCH, f"call {i} is {mine!r} where the dataset called {theirs!r}")
    if not step.calls:
        return Replay(assistant=assistant_message(answer, reasoning=reasoning), tool_messages=[])
    results = _results_in_call_order(step)
    if len(results) != len(step.calls):
        return Mismatch(
            TOOL_RESULTS_UNPAIRED, f"the dataset's step has {len(step.calls)} call(s) but {len(results)} result(s)"
        )
    assistant = assistant_message(answer, reasoning=reasoning, call_ids=[c.get("id") for c in step.calls])
    tool_messages = [
        {**result, "tool_call_id": call["id"]} if call.get("id") else dict(result)
        for call, result in zip(assistant["tool_calls"], results)
    ]
    return Replay(assistant=assistant, tool_messages=tool_messages)


def _count_detail(model_names: list[str], dataset_names: list[str]) -> str:
    if not model_names:
        return f"no tool call where the dataset called {', '.join(dataset_names)}"
    if not dataset_names:
        return f"called {', '.join(model_names)} where the dataset answered without tools"
    return (
        f"{len(model_names)} call(s) ({', '.join(model_names)}) where the dataset made "
        f"{len(dataset_names)} ({', '.join(dataset_names)})"
    )


def _results_in_call_order(step: ToolStep) -> list[dict]:
    """The step's results ordered like its calls when every id pairs up, else as given."""
    ids = [call.get("id") for call in step.calls]
    by_id = {r.get("tool_call_id"): r for r in step.results if r.get("tool_call_id")}
    if all(ids) and len(set(ids)) == len(ids) and len(by_id) == len(step.results) and set(by_id) == set(ids):
        return [by_id[call_id] for call_id in ids]
    return list(step.results)
