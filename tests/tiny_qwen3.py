"""A tiny randomly initialised Qwen3 checkpoint around a real tokenizer, for a real vLLM server.

    python tests/tiny_qwen3.py TOKENIZER_DIR OUT_DIR

Run by the vLLM venv's python (it has torch and transformers; this file imports nothing of
the project). The checkpoint is what `save_pretrained` writes, with the tokenizer files and
chat template copied in, so vLLM serves it like a released model:

* head_dim 64: vLLM's CPU attention refuses smaller heads at the first request;
* the embedding is padded past the tokenizer as released checkpoints are (Qwen3: 151,669
  tokens, vocab_size 151,936): vocab_size is len(tokenizer) rounded up to PAD_MULTIPLE;
* the tests need the model to generate padded ids, greedy too, to show that a record keeps
  what the model produced. A random model with tied embeddings repeats the token it was given
  (its hidden state stays close to that token's embedding), and chat prompts end on "\n", so
  greedy outputs are runs of "\n". The output row of the first padded id is made a little
  larger than the "\n" row (MIRROR_SCALE) and its input row is that of " and": greedy then
  writes the padded id where it would write "\n", and goes on as after " and". Every other
  output row equals its input row, as if tied (the embeddings are untied only for that);
* float32 weights and a fixed seed: the same folder every run, and greedy choices that do not
  flip with the batch a request lands in.

A tokenizer folder that is code (`auto_map`, the Kimi-K2.5-shaped fixture) is loaded with
trust_remote_code and its Python files are copied in with the tokenizer files.

The folder is built beside OUT_DIR and renamed into place, so a half-written one is never used.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Released checkpoints round the embedding up to a multiple like this (Qwen3: 151,936 = 1,187 x 128).
PAD_MULTIPLE = 256
# The model's shape: the smallest vLLM's CPU attention serves (head_dim 64), two layers.
HIDDEN = 128
LAYERS = 2
HEADS = 2
KV_HEADS = 1
HEAD_DIM = 64
INTERMEDIATE = 256
# Positions the model accepts; the server's --max-model-len is set below it.
MAX_POSITIONS = 4096
# The first padded id's output row is the "\n" row times this: just enough to win its argmax.
MIRROR_SCALE = 1.02
# The text whose token the padded id mirrors, and the text whose input row it takes.
MIRRORED_TEXT = "\n"
FOLLOW_TEXT = " and"
# Fixed seed: the same weights every build.
SEED = 0
# Tokenizer files copied into the checkpoint when the tokenizer folder has them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "tiktoken.model",
)


def padded_vocab_size(tokens: int) -> int:
    """len(tokenizer) rounded up to PAD_MULTIPLE, always past it (at least one padded row)."""
    return (tokens // PAD_MULTIPLE + 1) * PAD_MULTIPLE


def build(tokenizer_dir: Path, out: Path) -> None:
    """Write the checkpoint to `out` (atomically: staged beside it, then renamed)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    # A tokenizer that is code (auto_map: Kimi's shape) is loaded as vLLM loads it, --trust-remote-code.
    remote_code = "auto_map" in json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=remote_code)
    tokens = len(tokenizer)
    vocab_size = padded_vocab_size(tokens)
    # The chat end token where the tokenizer has one (Qwen's base eos is <|endoftext|>), else its eos.
    eos = tokenizer.get_vocab().get("<|im_end|>", tokenizer.eos_token_id)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    mirrored = tokenizer.encode(MIRRORED_TEXT, add_special_tokens=False)[0]
    follow = tokenizer.encode(FOLLOW_TEXT, add_special_tokens=False)[0]
    with torch.no_grad():
        inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        outputs.copy_(inputs)
        outputs[tokens] = outputs[mirrored] * MIRROR_SCALE
        inputs[tokens] = inputs[follow]
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    stage.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any model folder
    try:
        model.save_pretrained(stage)
        GenerationConfig(eos_token_id=[eos], pad_token_id=tokenizer.pad_token_id).save_pretrained(stage)
        for name in (*TOKENIZER_FILES, *sorted(p.name for p in tokenizer_dir.glob("*.py"))):
            if (tokenizer_dir / name).exists():
                shutil.copyfile(tokenizer_dir / name, stage / name)
        (stage / "tiny_qwen3.json").write_text(json.dumps({"tokenizer_tokens": tokens, "vocab_size": vocab_size}))
        try:
            os.rename(stage, out)
        except OSError:
            if not (out / "tiny_qwen3.json").exists():
                raise
            shutil.rmtree(stage, ignore_errors=True)  # a concurrent build won the rename
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: tiny_qwen3.py TOKENIZER_DIR OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])
    if not (out / "tiny_qwen3.json").exists():
        build(Path(argv[0]), out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
