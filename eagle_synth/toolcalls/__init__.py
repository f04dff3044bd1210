"""Tool calls in a model's answer: parse them, per model family, into OpenAI-style calls.

Used by `--history own` replay (issue 12): the model's own calls are parsed from its decoded
answer, paired with the dataset's tool results (pairing.py), and rendered back by the chat
template into the next prompt. Each family's format is written from its own chat template (the
text the template renders for an assistant's `tool_calls` is exactly what the model was trained
to write), one module per family; detect.py tells the family from the template text.

Parsers take decoded text, not ids: every marker is a special or plain token that decodes to
itself when the answer is decoded with `skip_special_tokens=False`, and text keeps the parsers
independent of any tokenizer. Decode with `clean_up_tokenization_spaces=False`, and split off
the reasoning first (eagle_synth.conversation.parse_answer does both): a call inside `<think>` is not one.
"""

from __future__ import annotations

from eagle_synth.errors import Malformed, ToolFormatError
from eagle_synth.toolcalls.answer import Cursor, ParsedAnswer, ToolFormat
from eagle_synth.toolcalls.deepseek import DEEPSEEK_V3, DEEPSEEK_V31
from eagle_synth.toolcalls.detect import detect_tool_format
from eagle_synth.toolcalls.dsml import DSML_FORMAT
from eagle_synth.toolcalls.glm import GLM45
from eagle_synth.toolcalls.hermes import HERMES
from eagle_synth.toolcalls.kimi_k2 import KIMI_K2
from eagle_synth.toolcalls.minimax import MINIMAX_M1, MINIMAX_M2
from eagle_synth.toolcalls.qwen3_coder import QWEN3_CODER
from eagle_synth.toolcalls.values import parameter_schemas

__all__ = [
    "TOOL_FORMATS",
    "ParsedAnswer",
    "ToolFormatError",
    "detect_tool_format",
    "parse_tool_calls",
    "resolve_tool_format",
]

FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (HERMES, QWEN3_CODER, KIMI_K2, DEEPSEEK_V3, DEEPSEEK_V31, DSML_FORMAT, GLM45, MINIMAX_M1, MINIMAX_M2)
}
# The values `--tool-format` accepts.
TOOL_FORMATS: tuple[str, ...] = tuple(FORMATS)


def resolve_tool_format(chat_template: str | dict | None, *, override: str | None = None) -> str:
    """The family to parse answers with: `override` (the `--tool-format` value, checked against
    TOOL_FORMATS) when given, else the one the template shows; ToolFormatError (one line,
    naming the flag and the choices) when neither works."""
    known = ", ".join(TOOL_FORMATS)
    if override is not None:
        if override not in FORMATS:
            raise ToolFormatError(f"--tool-format {override!r} is not a known format; choose one of: {known}")
        return override
    if (family := detect_tool_format(chat_template)) is None:
        raise ToolFormatError(
            f"the chat template's tool-call format is not one eagle-synth can parse; pass --tool-format with one of: {known}"
        )
    return family


def parse_tool_calls(text: str, *, family: str, tools: list[dict] | None = None) -> ParsedAnswer:
    """Split an answer (after its reasoning) into content and tool calls, in `family`'s format.

    `tools` are the row's OpenAI tool schemas: formats that write arguments as text (Qwen3-Coder,
    GLM, MiniMax-M2) use them to give each argument its JSON type. Never raises for a bad answer:
    a malformed or truncated call gives `unparsed=True` and the reason in `problem`. Raises
    ValueError for an unknown family (a programming or flag error).
    """
    if (form := FORMATS.get(family)) is None:
        raise ValueError(f"unknown tool-call format {family!r}; known: {', '.join(TOOL_FORMATS)}")
    body = _strip_end_markers(text, form.end_markers)
    start = body.find(form.start)
    if start < 0:
        return ParsedAnswer(content=body.strip())
    content = body[:start].strip()
    calls: list[dict] = []
    cursor = Cursor(body, start)
    try:
        form.parse_section(cursor, parameter_schemas(tools), calls)
        cursor.skip_space()
        if not cursor.at_end():
            raise Malformed(f"text after the tool calls: {body[cursor.pos : cursor.pos + 60]!r}")
    except Malformed as exc:
        return ParsedAnswer(content=content, tool_calls=calls, unparsed=True, problem=str(exc))
    return ParsedAnswer(content=content, tool_calls=calls)


def _strip_end_markers(text: str, markers: tuple[str, ...]) -> str:
    stripped = text.rstrip()
    while marker := next((m for m in markers if m and stripped.endswith(m)), None):
        stripped = stripped[: -len(marker)].rstrip()
    return stripped
