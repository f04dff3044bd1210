"""Python chat encoders as a template kind: DeepSeek-V3.2 and V4 ship no chat template but an
`encoding_*.py` in the model folder (`encode_messages(messages, thinking_mode=...)`), which
SGLang and vLLM run for their chat endpoints. A folder holding one is templated by it, loaded
from that folder only and only on explicit trust (`--trust-remote-code`), never from Redis.

EncoderTokenizer puts the encoder behind the tokenizer's own `apply_chat_template`, called as
transformers calls it, so the producer's pool and the workers' renderer use it unchanged. The
server-side conventions it follows (as vLLM's DeepSeek tokenizer applies them): tools go into a
system message put first, `thinking` / `enable_thinking` choose the thinking mode (default chat),
`reasoning_effort` is passed on, and earlier reasoning is dropped when the prompt ends on a user
message. Tool-call arguments go to the encoder as JSON text, as the OpenAI API carries them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from eagle_synth.errors import EncoderError
from eagle_synth.tool_arguments import with_text_arguments

# The file name pattern of a model folder's Python encoder.
ENCODER_PATTERN = "encoding_*.py"
# chat_template_kwargs that switch the encoder's thinking mode on (vLLM reads both).
THINKING_KWARGS = ("thinking", "enable_thinking")
# chat_template_kwarg passed to the encoder as its reasoning effort (DeepSeek-V4: None, "high", "max").
REASONING_EFFORT_KWARG = "reasoning_effort"
# The encoder's two thinking modes.
THINKING_MODE = "thinking"
CHAT_MODE = "chat"


def find_encoder(folder: str | os.PathLike) -> Path | None:
    """The folder's `encoding_*.py`, None when it has none (or is no local folder)."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        return None
    found = sorted(path.glob(ENCODER_PATTERN))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise EncoderError(f"{path} holds several chat encoders ({names}); keep the one the model's server runs")
    return found[0] if found else None


def load_encoder(path: Path) -> ModuleType:
    """Run the encoder file as a module of its own (the caller checked the user's trust)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(f"eagle_synth_encoder_{digest}", path)
    if spec is None or spec.loader is None:
        raise EncoderError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the model's own code: any error means it cannot be used here
        raise EncoderError(f"{path}: loading it failed: {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(module, "encode_messages", None)):
        raise EncoderError(f"{path}: has no encode_messages(messages, thinking_mode=...) function")
    return module


class EncoderTokenizer:
    """A tokenizer whose chat format is a Python encoder; everything but templating is the
    wrapped tokenizer's (decode, vocabulary, special tokens, len()).

    Parameters:
        tokenizer: the folder's transformers tokenizer.
        encoder: the loaded encoder module (load_encoder).
        source: the encoder's text; it stands as `chat_template`, so the campaign's template
            hash covers the encoder's code and tool-format detection reads its markers.
    """

    def __init__(self, tokenizer, encoder: ModuleType, source: str) -> None:
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.chat_template = source

    def __getattr__(self, name: str):
        # Only reached for names this class lacks: the wrapped tokenizer answers them (none
        # before __init__ ran, as copy and pickle probe a bare instance).
        if "tokenizer" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["tokenizer"], name)

    def __len__(self) -> int:
        return len(self.tokenizer)

    @property
    def wrapped_class_name(self) -> str:
        """The wrapped tokenizer's class: the fingerprint is the tokenizer's, with or without the encoder."""
        return type(self.tokenizer).__name__

    def render_text(self, messages: Sequence[dict], *, tools: list[dict] | None, kwargs: dict) -> str:
        """The prompt text the encoder gives for `messages` (ending in the generation prompt)."""
        unknown = sorted(set(kwargs) - {*THINKING_KWARGS, REASONING_EFFORT_KWARG})
        if unknown:
            raise TypeError(
                f"the chat encoder takes no chat_template_kwargs {unknown}; it takes "
                f"{', '.join((*THINKING_KWARGS, REASONING_EFFORT_KWARG))}"
            )
        listed = list(messages)
        prepared = with_text_arguments(listed) or listed
        if tools:
            prepared = [{"role": "system", "tools": tools}, *prepared]
        thinking = any(kwargs.get(name) for name in THINKING_KWARGS)
        options: dict = {
            "thinking_mode": THINKING_MODE if thinking else CHAT_MODE,
            # Earlier reasoning is dropped once a new user message comes (kept through tool steps).
            "drop_thinking": bool(prepared) and prepared[-1].get("role") == "user",
        }
        if kwargs.get(REASONING_EFFORT_KWARG) is not None:
            options["reasoning_effort"] = kwargs[REASONING_EFFORT_KWARG]
        return self.encoder.encode_messages(prepared, **options)

    def apply_chat_template(
        self,
        conversation,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        return_dict: bool = False,
        **kwargs,
    ):
        """transformers' apply_chat_template for one conversation or a batch of them (the
        encoder always ends on the generation prompt, so `add_generation_prompt` is moot)."""
        batched = bool(conversation) and isinstance(conversation[0], (list, tuple))
        conversations = list(conversation) if batched else [conversation]
        texts = [self.render_text(messages, tools=tools, kwargs=kwargs) for messages in conversations]
        if not tokenize:
            return texts if batched else texts[0]
        ids = [self.tokenizer.encode(text, add_special_tokens=False) for text in texts]
        result = ids if batched else ids[0]
        return {"input_ids": result} if return_dict else result


def with_encoder(tokenizer, folder: str | os.PathLike, *, trust_remote_code: bool):
    """`tokenizer` templated by the folder's encoder when it has one (EncoderError without
    --trust-remote-code), else `tokenizer` itself."""
    path = find_encoder(folder)
    if path is None:
        return tokenizer
    if not trust_remote_code:
        raise EncoderError(
            f"{Path(folder)} formats chats with Python code ({path.name}), not a chat template: pass "
            "--trust-remote-code to run it (it is loaded from this folder only), or --chat-template FILE"
        )
    return EncoderTokenizer(tokenizer, load_encoder(path), path.read_text())
