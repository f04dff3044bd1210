"""A tiny reasoning-style tokenizer for the demo, trained locally in about a second.

The demo must run on a fresh machine with nothing downloaded, so it builds its own small
byte-level BPE tokenizer with ChatML special tokens and a chat template that, like Qwen3.5's
or DeepSeek-R1's, ends the generation prompt with `<think>\\n`.
"""

from __future__ import annotations

from pathlib import Path

from eagle_synth.devserver.corpus import CORPUS_TEXT

# Vocabulary size of the demo tokenizer (small: it trains in about a second).
DEMO_VOCAB_SIZE = 4000
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]

# ChatML with Hermes-style tools (Qwen2.5/3's layout, condensed): the tool schemas one JSON per
# line in a `<tools>` block, calls as `<tool_call>` JSON, tool results in a user turn.
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call these functions:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    '{{- \'\\n</tools>\\n\\nCall one as <tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and tools and loop.first -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] -%}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}"
    "{%- for call in message['tool_calls'] -%}"
    "{{- '\\n<tool_call>\\n{\"name\": ' + (call['function']['name'] | tojson) -}}"
    "{{- ', \"arguments\": ' + (call['function']['arguments'] | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def build_demo_tokenizer(folder: Path) -> Path:
    """Train and save the demo tokenizer into `folder`; returns the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    if (folder / "tokenizer.json").exists():
        return folder
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=DEMO_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS_TEXT], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return folder
