"""The devserver's emulated model answers a tools prompt with a tool call in Qwen3.5's format.

The call text is checked against the real template (an assistant message with the parsed calls
renders to exactly the generated answer) and parsed back with the project's qwen3_coder parser.
"""

from __future__ import annotations

import random

import pytest

from eagle_synth.devserver.generation import Generator, ModelVocab
from eagle_synth.devserver.protocol import PromptRequest, SamplingParams
from eagle_synth.devserver.toolcalls import (
    ToolCaller,
    chosen_tools,
    fill_arguments,
    render_calls,
)
from eagle_synth.toolcalls import parse_tool_calls
from tests.answer_text import split_reasoning

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "exact": {"type": "boolean"},
                    "filters": {"type": "object", "properties": {"tags": {"type": "array"}}},
                    "unit": {"enum": ["C", "F"]},
                    "score": {"type": ["number", "null"]},
                },
            },
        },
    },
]
# Long enough that a reasoning part plus the call is never cut.
MAX_NEW_TOKENS = 100_000


@pytest.fixture(scope="module")
def generator(tokenizer):
    return Generator(vocab=ModelVocab(tokenizer=tokenizer), mean_output_tokens=40, seed=0)


def complete(generator, ids, *, temperature=0.0, sample=0):
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=temperature, sampling_seed=sample)
    return generator.complete(
        PromptRequest(
            input_ids=ids, params=params, max_new_tokens=MAX_NEW_TOKENS, rid="r", group_rid="r", sample_index=sample
        )
    )


def answer_after_think(tokenizer, completion) -> tuple[str, str]:
    ids = completion.output_ids
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    return split_reasoning(tokenizer.decode(ids[:-1], skip_special_tokens=False))


@pytest.mark.parametrize("thinking", [True, False])
def test_tools_prompt_gets_a_call_the_template_renders_identically(tokenizer, generator, thinking):
    messages = [{"role": "user", "content": "What does search say, and the weather in Oslo?"}]
    ids = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, enable_thinking=thinking, return_dict=True
    )["input_ids"]
    completion = complete(generator, ids)
    reasoning, answer = answer_after_think(tokenizer, completion)
    assert bool(reasoning) == thinking
    parsed = parse_tool_calls(answer, family="qwen3_coder", tools=TOOLS)
    assert not parsed.unparsed and parsed.content == ""
    assert [c["name"] for c in parsed.tool_calls] == ["search", "weather"]  # order of mention: parallel calls
    assert set(parsed.tool_calls[1]["arguments"]) == {"city", "days"}
    assert isinstance(parsed.tool_calls[1]["arguments"]["days"], int)
    # The real template renders the parsed calls back to exactly the generated text.
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in parsed.tool_calls
        ],
    }
    rendered = tokenizer.apply_chat_template(messages + [message], tools=TOOLS, tokenize=False)
    assert rendered.endswith(answer + "<|im_end|>\n")
    # Deterministic: the same prompt gets the same call.
    assert complete(generator, ids).output_ids == completion.output_ids


def test_tool_results_are_answered_in_words(tokenizer, generator):
    messages = [
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo", "days": 1}}}
            ],
        },
        {"role": "tool", "content": "3C"},
    ]
    ids = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    _, answer = answer_after_think(tokenizer, complete(generator, ids))
    assert "<tool_call>" not in answer and parse_tool_calls(answer, family="qwen3_coder").tool_calls == []


def test_prompt_without_tools_keeps_its_exact_stream(tokenizer, generator):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    plain = Generator(vocab=generator.vocab, mean_output_tokens=40, seed=0)
    plain.tool_caller = None
    assert complete(generator, ids).output_ids == complete(plain, ids).output_ids


def test_first_tool_when_none_is_named_and_samples_vary_arguments(tokenizer, generator):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Help me plan a trip."}],
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=True,
        enable_thinking=False,
        return_dict=True,
    )["input_ids"]
    calls = []
    for sample in range(4):
        _, answer = answer_after_think(tokenizer, complete(generator, ids, temperature=1.0, sample=sample))
        (call,) = parse_tool_calls(answer, family="qwen3_coder", tools=TOOLS).tool_calls
        calls.append(call)
    assert {c["name"] for c in calls} == {"weather"}
    assert len({str(c["arguments"]) for c in calls}) > 1


def test_caller_only_for_templates_it_can_write(tokenizer):
    assert ToolCaller.for_tokenizer(tokenizer).family == "qwen3_coder"

    class NoTemplate:
        chat_template = None

    assert ToolCaller.for_tokenizer(NoTemplate()) is None
    with pytest.raises(ValueError, match="cannot write"):
        ToolCaller(family="glm45", call_token_id=1, decode=str)


def test_argument_filling_and_tool_choice():
    rng = random.Random(3)
    args = fill_arguments(TOOLS[1]["function"]["parameters"], rng)
    assert set(args) == {"query", "exact", "filters", "unit", "score"}
    assert isinstance(args["exact"], bool) and args["unit"] in ("C", "F") and isinstance(args["filters"], dict)
    functions = [t["function"] for t in TOOLS]
    # a name counts only as a whole word: "weather.com" and "weathers" do not mention it
    assert [n for n, _ in chosen_tools(functions[::-1], "see weather.com about weathers")] == ["search"]
    assert [n for n, _ in chosen_tools(functions, "search then weather")] == ["search", "weather"]
    assert [n for n, _ in chosen_tools(functions, "nothing named")] == ["weather"]
    assert (
        render_calls([{"name": "f", "arguments": {"a": 1}}], family="hermes")
        == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    )
    # DeepSeek's DSML and Kimi's sections, read back by the project's parsers.
    calls = [{"name": "f", "arguments": {"a": 1, "b": "x y"}}, {"name": "g", "arguments": {}}]
    for family in ("dsml", "kimi_k2"):
        parsed = parse_tool_calls(render_calls(calls, family=family), family=family)
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in parsed.tool_calls] == calls
