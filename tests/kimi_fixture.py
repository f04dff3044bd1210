"""A tokenizer folder shaped like Kimi-K2.5's, built on the spot: a tiktoken BPE (`tiktoken.model`)
behind a small custom tokenizer class (`tokenization_kimi_fixture.py`, loaded through `auto_map`
with trust_remote_code), Kimi's special tokens, and a chat template written here with Kimi-K2.5's
structure: `<|im_system|>` / `<|im_user|>` / `<|im_assistant|>` turns named and split by
`<|im_middle|>`, tools declared in a `tool_declare` system turn (JSON here; K2.5 writes
TypeScript-style declarations), calls in `<|tool_calls_section_begin|>` sections with
`functions.NAME:IDX` ids, results as `## Return of ID` tool turns, the reasoning of the turns
after the last user message kept, and the generation prompt opening `<think>` (`thinking`
false: an empty think block).

    python -m tests.kimi_fixture DIR     # writes the folder
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

# Words whose every prefix becomes a BPE merge (so common text takes few tokens).
MERGED_WORDS = (
    " the", " weather", " lookup", " river", " Paris", " Oslo", " and", " is", " of", " a", " in",
    " you", " for", " what", " Please", " city", " word", "function", "tool", "ing", " to", " it",
)  # fmt: skip
# Kimi-K2.5's special tokens used here, from the first special id on (163584 in the real one).
SPECIAL_TOKENS = (
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<think>",
    "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
# tiktoken's split pattern (cl100k's shape: words with a leading space, numbers, punctuation).
PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

TOKENIZER_CODE = '''"""A tiktoken BPE behind transformers' PreTrainedTokenizer (a test fixture with Kimi's shape)."""

import base64
import json
import os

import tiktoken
from transformers import PreTrainedTokenizer


class KimiFixtureTokenizer(PreTrainedTokenizer):
    """Byte tokens as latin-1 strings; special tokens from tokenizer_config.json's added tokens."""

    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, pattern="", **kwargs):
        ranks = {}
        with open(vocab_file, "rb") as f:
            for line in f.read().splitlines():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        self.pattern = pattern
        self.encoding = tiktoken.Encoding(name="kimi-fixture", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        self.ranks = ranks
        self.by_rank = {rank: token for token, rank in ranks.items()}
        super().__init__(pattern=pattern, **kwargs)

    @property
    def vocab_size(self):
        return len(self.ranks)

    def get_vocab(self):
        vocab = {token.decode("latin-1"): rank for token, rank in self.ranks.items()}
        vocab.update(self.added_tokens_encoder)
        return vocab

    def _tokenize(self, text, **kwargs):
        return [self.by_rank[i].decode("latin-1") for i in self.encoding.encode_ordinary(text)]

    def _convert_token_to_id(self, token):
        return self.ranks.get(token.encode("latin-1"), 0)

    def _convert_id_to_token(self, index):
        return self.by_rank[index].decode("latin-1")

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens).encode("latin-1").decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory, filename_prefix=None):
        path = os.path.join(save_directory, (filename_prefix or "") + "tiktoken.model")
        with open(path, "wb") as f:
            for token, rank in sorted(self.ranks.items(), key=lambda kv: kv[1]):
                f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\\n")
        return (path,)
'''

CHAT_TEMPLATE = r"""{%- macro content(m) -%}{%- if m.content is string -%}{{ m.content }}{%- elif m.content -%}{%- for part in m.content -%}{{ part.text }}{%- endfor -%}{%- endif -%}{%- endmacro -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}
{%- if not messages or messages[0].role != 'system' -%}<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' -%}<|im_system|>system<|im_middle|>{{ content(m) }}<|im_end|>
{%- elif m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ content(m) }}<|im_end|>
{%- elif m.role == 'tool' -%}<|im_system|>tool<|im_middle|>## Return of {{ m.tool_call_id }}
{{ content(m) }}<|im_end|>
{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>
{%- if loop.index0 > ns.last_user -%}<think>{{ m.reasoning_content or '' }}</think>{%- else -%}<think></think>{%- endif -%}
{{ content(m) }}
{%- if m.tool_calls -%}<|tool_calls_section_begin|>
{%- for call in m.tool_calls -%}<|tool_call_begin|>{{ call.id or ('functions.' ~ call.function.name ~ ':' ~ loop.index0) }}<|tool_call_argument_begin|>
{%- if call.function.arguments is string -%}{{ call.function.arguments }}{%- else -%}{{ call.function.arguments | tojson }}{%- endif -%}<|tool_call_end|>
{%- endfor -%}<|tool_calls_section_end|>
{%- endif -%}<|im_end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- if thinking is defined and not thinking -%}<think></think>{%- else -%}<think>{%- endif -%}{%- endif -%}"""


def mergeable_ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for word in MERGED_WORDS:
        data = word.encode()
        for end in range(2, len(data) + 1):
            ranks.setdefault(data[:end], len(ranks))
    return ranks


def write_kimi_fixture(folder: Path, *, template: str = CHAT_TEMPLATE) -> Path:
    """Write the folder (created) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = mergeable_ranks()
    lines = [base64.b64encode(token) + b" " + str(rank).encode() for token, rank in ranks.items()]
    (folder / "tiktoken.model").write_bytes(b"\n".join(lines) + b"\n")
    (folder / "tokenization_kimi_fixture.py").write_text(TOKENIZER_CODE)
    first_special = len(ranks)
    added = {
        str(first_special + i): {"content": token, "special": True, "lstrip": False, "rstrip": False,
                                 "normalized": False, "single_word": False}
        for i, token in enumerate(SPECIAL_TOKENS)
    }  # fmt: skip
    config = {
        "tokenizer_class": "KimiFixtureTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi_fixture.KimiFixtureTokenizer", None]},
        "pattern": PATTERN,
        "bos_token": "[BOS]",
        "eos_token": "<|im_end|>",
        "added_tokens_decoder": added,
        "additional_special_tokens": list(SPECIAL_TOKENS[2:]),
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (folder / "chat_template.jinja").write_text(template)
    return folder


if __name__ == "__main__":
    print(write_kimi_fixture(Path(sys.argv[1])))
