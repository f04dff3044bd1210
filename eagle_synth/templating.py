"""Chat templating: the model's own template, applied by transformers, and nothing else; in the
shared core so a worker templates a follow-up turn with exactly the producer's code."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle_synth.errors import TemplateError, clause
from eagle_synth.tool_arguments import with_text_arguments

# Tokens a reasoning template opens and closes its think block with.
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# Files of which a tokenizer folder holds at least one.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True, slots=True)
class TokenizerFacts:
    """A tokenizer's `fingerprint` (hash of vocabulary and special tokens), chat template hash,
    `vocab_size` (len(tokenizer)), EOS ids and think-token ids."""

    fingerprint: str
    chat_template_hash: str
    vocab_size: int
    eos_token_ids: list[int]
    think_open_id: int | None
    think_close_id: int | None


def check_tokenizer_path(path: str | os.PathLike) -> None:
    """Refuse (TemplateError) a --tokenizer that is no tokenizer folder (`org/model` may be a hub name)."""
    text = str(path)
    folder = Path(text).expanduser()
    if folder.is_dir():
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise TemplateError(
                f"--tokenizer {text}: this folder holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                "pass the model's folder, the one with tokenizer.json and tokenizer_config.json"
            )
        return
    if folder.exists():
        raise TemplateError(f"--tokenizer {text}: is a file; pass the folder that holds tokenizer.json")
    # `org/model` may be a hub name; an absolute, relative-dotted or deeper path is a folder.
    if text.startswith(("/", "./", "../", "~")) or text.count("/") >= 2:
        raise TemplateError(f"--tokenizer {text}: no such folder; check the path")


def read_tokenizer(path: str | os.PathLike, *, hint: str, trust_remote_code: bool = False):
    """A tokenizer from a local folder (or hub name, where a hub is reachable), chat template or not;
    the TemplateError if it cannot load ends with `hint`."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer  # heavy import: only the paths that template or decode pay it

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many kinds; all mean "cannot load"
        raise TemplateError(
            f"cannot load a tokenizer from {path}: {clause(exc)}. Pass --tokenizer a folder with "
            f"tokenizer.json / tokenizer_config.json ({hint})."
        ) from exc


def load_tokenizer(
    path: str | os.PathLike, *, trust_remote_code: bool = False, chat_template_file: str | os.PathLike | None = None
):
    """Load a tokenizer that has a chat template (its own, or `chat_template_file`), or whose
    folder's Python encoder formats chats (eagle_synth/encoders.py; needs `trust_remote_code`)."""
    from eagle_synth.encoders import with_encoder
    from eagle_synth.errors import EncoderError

    tokenizer = read_tokenizer(
        path, hint="add --trust-remote-code if it needs custom code", trust_remote_code=trust_remote_code
    )
    if chat_template_file is not None:
        tokenizer.chat_template = Path(chat_template_file).read_text()
        return tokenizer
    try:
        tokenizer = with_encoder(tokenizer, path, trust_remote_code=trust_remote_code)
    except EncoderError as exc:
        raise TemplateError(str(exc)) from None
    if not tokenizer.chat_template:
        raise TemplateError(f"the tokenizer at {path} has no chat template; pass --chat-template FILE")
    return tokenizer


def token_id(tokenizer, token: str) -> int | None:
    """The id of one special token, None if the vocabulary lacks it."""
    ids = tokenizer.convert_tokens_to_ids([token])
    return ids[0] if ids and ids[0] is not None and ids[0] != tokenizer.unk_token_id else None


def eos_token_ids(tokenizer) -> list[int]:
    """The tokenizer's EOS ids (`eos_token_id` may be one id, a list or None)."""
    eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def tokenizer_facts(tokenizer) -> TokenizerFacts:
    """Fingerprints and special ids, computed once per run."""
    vocab = tokenizer.get_vocab()
    material = {
        "vocab": sorted(vocab.items(), key=lambda kv: kv[1]),
        "special": tokenizer.special_tokens_map,
        # A chat encoder's wrapper counts as the tokenizer it wraps (its code is the template's hash).
        "class": getattr(tokenizer, "wrapped_class_name", None) or type(tokenizer).__name__,
    }
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = json.dumps(template, sort_keys=True)
    return TokenizerFacts(
        fingerprint=hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:16],
        chat_template_hash=hashlib.sha256((template or "").encode()).hexdigest()[:16],
        vocab_size=len(tokenizer),
        eos_token_ids=eos_token_ids(tokenizer),
        think_open_id=token_id(tokenizer, THINK_OPEN),
        think_close_id=token_id(tokenizer, THINK_CLOSE),
    )


def render_prompt_ids(
    tokenizer, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
) -> list[int]:
    """The prompt ids of one conversation, as `apply_chat_template` gives them; a template that
    rejects object tool-call arguments (DeepSeek-V3.1 concatenates them) gets them as JSON text."""
    try:
        return render_prompt_ids_batch(tokenizer, [messages], tools=tools, template_kwargs=template_kwargs)[0]
    except TemplateError as first:
        if (as_text := with_text_arguments(messages)) is None:
            raise
        try:
            return render_prompt_ids_batch(tokenizer, [as_text], tools=tools, template_kwargs=template_kwargs)[0]
        except TemplateError:
            raise first from first.__cause__


def render_prompt_ids_batch(
    tokenizer,
    conversations: Sequence[list[dict]],
    *,
    tools: list[dict] | None = None,
    template_kwargs: dict | None = None,
) -> list[list[int]]:
    """Prompt ids of conversations sharing `tools`, by transformers' batched apply_chat_template."""
    try:
        encoded = tokenizer.apply_chat_template(
            list(conversations),
            tools=tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **(template_kwargs or {}),
        )
    except Exception as exc:  # jinja2 TemplateError, TypeError from templates, ...
        raise TemplateError(f"chat template rejected the conversation: {exc}") from exc
    return [list(ids) for ids in encoded["input_ids"]]
