"""What a campaign's settings know of its model beyond the tokenizer: `model_vocab_size` (output
ids may reach the padded embedding, Qwen3: 151,936 > 151,669 tokens; prompt ids stay checked
against the tokenizer) and `tokenizer_canary` (a text and its ids; a server tokenizing it
otherwise serves another model: workers/servers/model_check.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# The checkpoint file with the model's vocab_size, beside the tokenizer in a model folder.
MODEL_CONFIG_NAME = "config.json"
# Output ids are stored as uint32 and sent as JSON ints; with no model vocabulary known, an id
# is legal below this (what the model produced is kept).
UNKNOWN_VOCAB_BOUND = 2**31
# Ordinary text of the canary: accents, CJK, digits and spacing, where tokenizers differ most.
CANARY_TEXT = "eagle-synth canary: Grüße aus 東京, 12345 tokens\n  done."
# Special tokens put in the canary at most (its EOS, think tokens and a few others).
CANARY_SPECIALS = 4


def model_vocab_size(folder: str | os.PathLike) -> int | None:
    """The checkpoint's vocab_size (or its text_config's) from config.json in `folder`, or None."""
    try:
        config = json.loads((Path(folder) / MODEL_CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if config.get("vocab_size") is None and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    return config_size(config, "vocab_size")


def config_size(config: dict, name: str) -> int | None:
    """`config[name]` when it is a positive int (JSON's true is not a size), else None."""
    value = config.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def output_id_bound(*, tokenizer_size: int, model_vocab: int | None) -> int:
    """Output ids are legal below this (the model's vocabulary, at least the tokenizer's)."""
    return UNKNOWN_VOCAB_BOUND if model_vocab is None else max(tokenizer_size, model_vocab)


def tokenizer_canary(tokenizer) -> dict:
    """{"text", "ids"}: the canary text around special tokens, ids as a server's /tokenize gives."""
    vocab = tokenizer.get_vocab()
    candidates = [getattr(tokenizer, "eos_token", None), "<think>", "</think>", *tokenizer.all_special_tokens]
    specials = list(dict.fromkeys(t for t in candidates if isinstance(t, str) and t and t in vocab))[:CANARY_SPECIALS]
    text = f"{specials[0] if specials else ''}{CANARY_TEXT}{''.join(specials[1:])}"
    return {"text": text, "ids": [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]}
