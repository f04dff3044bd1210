"""ModelVocab: the emulated model's token space, taken from a real Hugging Face tokenizer."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from eagle_synth.devserver.corpus import CORPUS_TEXT

log = logging.getLogger("eagle_synth.devserver")

# Reasoning delimiters looked up by name; a tokenizer without both gets no think structure.
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# Separator the model writes between the closed reasoning block and the answer.
ANSWER_SEPARATOR = "\n\n"


class ModelVocab:
    """Token ids the devserver reads and writes, all real ids of `tokenizer` (a loaded
    `transformers` tokenizer; `vocab_size` None means len(tokenizer)).

    Behaviour: tokenizes CORPUS_TEXT into the id stream output bodies are sliced from and looks
    up EOS and `<think>`/`</think>`. Ids at or above `size` are left out of the corpus (and
    specials outside it disabled), so the devserver never emits an id it would itself refuse.
    """

    def __init__(self, *, tokenizer, vocab_size: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.size: int = vocab_size if vocab_size is not None else len(tokenizer)
        self.eos_id: int | None = self._in_vocab(tokenizer.eos_token_id)
        self.think_open_id: int | None = self._special_id(THINK_OPEN)
        self.think_close_id: int | None = self._special_id(THINK_CLOSE)
        if self.think_open_id is None or self.think_close_id is None:
            self.think_open_id = self.think_close_id = None
        self.separator_ids: tuple[int, ...] = tuple(self.encode(ANSWER_SEPARATOR))
        # A reasoning template may end its prompt with "<think>" or "<think>\n".
        self.newline_ids: frozenset[int] = frozenset(self.encode("\n"))
        corpus = [i for i in self.encode(CORPUS_TEXT) if 0 <= i < self.size]
        if not corpus:
            raise ValueError(f"no corpus token fits in a vocabulary of {self.size} ids")
        self.corpus_ids: tuple[int, ...] = tuple(corpus)

    @classmethod
    def load(cls, *, tokenizer_dir: str, vocab_size: int | None = None) -> ModelVocab:
        from transformers import AutoTokenizer  # heavy import, only when a server starts

        return cls(tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir), vocab_size=vocab_size)

    def encode(self, text: str) -> list[int]:
        """Without BOS/EOS."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def prompt_opens_reasoning(self, prompt_ids: Sequence[int]) -> bool:
        """True when the prompt ends with `<think>` or `<think>` + newline (thinking on)."""
        tail = list(prompt_ids[-2:])
        if self.think_open_id is None or not tail:
            return False
        return tail[-1] == self.think_open_id or (tail[0] == self.think_open_id and tail[-1] in self.newline_ids)

    def _special_id(self, token: str) -> int | None:
        """Id of `token` if the tokenizer really has it (not the unknown-token fallback)."""
        tid = self.tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == self.tokenizer.unk_token_id or self.tokenizer.convert_ids_to_tokens(tid) != token:
            return None
        return self._in_vocab(tid)

    def _in_vocab(self, tid: int | None) -> int | None:
        return int(tid) if tid is not None and 0 <= tid < self.size else None
