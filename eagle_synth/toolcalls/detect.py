"""Which tool-call format a chat template teaches its model, read from the template text.

Each family's template (or Python chat encoder, eagle_synth/encoders.py) renders an assistant's tool calls (or, for MiniMax-M1, describes them in
the tools prompt) with markers no other family uses; the checks run from the most specific
marker to the most generic (`<tool_call>` alone means Hermes-style JSON). A template whose
format is not one of TOOL_FORMATS gives None, and `--tool-format` has to name one.
"""

from __future__ import annotations

# (family, markers that must all appear in the template), most specific first.
TEMPLATE_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # MiniMax-M3 writes `]<]minimax[>[<tool_call>` with nested XML arguments: not supported.
    ("", ("]<]minimax[>[",)),
    ("kimi_k2", ("<|tool_call_argument_begin|>",)),
    # DeepSeek-V3.2 / V4's Python encoders (their text stands as the chat template).
    ("dsml", ("｜DSML｜",)),
    ("kimi_k2", ("<|im_system|>tool_declare",)),
    ("deepseek_v3", ("tool▁sep", "```json")),
    ("deepseek_v31", ("tool▁sep",)),
    ("glm45", ("<arg_key>",)),
    ("minimax_m2", ("<minimax:tool_call>",)),
    ("minimax_m1", ("<tool_calls>",)),
    ("qwen3_coder", ("<function=", "<parameter=")),
    ("hermes", ("<tool_call>",)),
)


def detect_tool_format(chat_template: str | dict | None) -> str | None:
    """The tool-call family a chat template writes, or None when it is none we parse.

    A dict of named templates (tokenizer_config's list form) is searched whole.
    """
    if not chat_template:
        return None
    text = chat_template if isinstance(chat_template, str) else "\n".join(map(str, chat_template.values()))
    for family, markers in TEMPLATE_MARKERS:
        if all(marker in text for marker in markers):
            return family or None
    return None
