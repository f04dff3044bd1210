"""Deterministic, GPU-free generation: what the emulated model answers to a prompt.

A completion is a pure function of the prompt ids and the sampling parameters (for
temperature > 0 also of the sample index within `n`, the `sampling_seed` and the server
seed). Greedy output depends on the prompt alone, so, as with a real model, a greedy
completion capped at 10 tokens is a prefix of the same prompt capped at 100. A prompt that
offers tools gets a tool call as its answer (see toolcalls.py). ModelVocab is the model's token
space, taken from a real Hugging Face tokenizer.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import random
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from eagle_synth.devserver.corpus import CORPUS_TEXT
from eagle_synth.devserver.protocol import PromptRequest, SamplingParams
from eagle_synth.devserver.toolcalls import ToolCaller
from eagle_synth.templating import THINK_CLOSE, THINK_OPEN, token_id

# Shape of the gamma distribution of natural output lengths: 2 gives few very short answers
# and a long right tail, roughly what chat models produce.
LENGTH_GAMMA_SHAPE = 2.0
# Natural lengths are cut at this multiple of the mean (or median) so one prompt cannot be
# absurdly long; max_new_tokens usually cuts far earlier.
LENGTH_MAX_FACTOR = 20
LOGNORMAL_MAX_FACTOR = 200
# Share of a reasoning completion spent before `</think>`, drawn uniformly in this range.
REASONING_SHARE = (0.45, 0.8)
# Output bodies are runs of consecutive corpus tokens of this many tokens, from random offsets.
SEGMENT_TOKENS = (12, 80)
# Tokens generated per step once the natural answer is over (ignore_eos / min_new_tokens).
CONTINUATION_TOKENS = 256
# A stop token masked by min_new_tokens is replaced by the next stream token; after this
# many in a row (a client stopping on every corpus token) it is emitted anyway.
MAX_MASKED_STOPS = 10_000
# Mixed into a prompt's stream seed for the rng that fills tool-call arguments, so prompts
# without tools keep exactly the stream they had.
TOOL_ARGUMENTS_SALT = 0x7001_CA11


# Separator the model writes between the closed reasoning block and the answer.
ANSWER_SEPARATOR = "\n\n"


class ModelVocab:
    """The ids of a loaded `transformers` tokenizer the devserver writes: CORPUS_TEXT's (output
    bodies are sliced from them), EOS and `<think>`/`</think>`. Ids at or above `vocab_size`
    (None: len(tokenizer)) are left out, so the devserver never emits an id it would refuse."""

    def __init__(self, *, tokenizer, vocab_size: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.size: int = vocab_size if vocab_size is not None else len(tokenizer)
        self.eos_id: int | None = self._in_vocab(tokenizer.eos_token_id)
        # Reasoning delimiters looked up by name; a tokenizer without both gets no think structure.
        self.think_open_id: int | None = self._special_id(THINK_OPEN)
        self.think_close_id: int | None = self._special_id(THINK_CLOSE)
        if self.think_open_id is None or self.think_close_id is None:
            self.think_open_id = None
            self.think_close_id = None
        self.separator_ids: tuple[int, ...] = tuple(self.encode(ANSWER_SEPARATOR))
        # A reasoning template may end its prompt with "<think>" or "<think>\n".
        self.newline_ids: frozenset[int] = frozenset(self.encode("\n"))
        corpus = [i for i in self.encode(CORPUS_TEXT) if 0 <= i < self.size]
        if not corpus:
            raise ValueError(f"no corpus token fits in a vocabulary of {self.size} ids")
        self.corpus_ids: tuple[int, ...] = tuple(corpus)

    @classmethod
    def load(cls, *, tokenizer_dir: str, vocab_size: int | None = None, trust_remote_code: bool = False) -> ModelVocab:
        """With `trust_remote_code`, the folder's tokenizer code and chat encoder run, as a server
        started with --trust-remote-code runs them."""
        from transformers import AutoTokenizer  # heavy import, only when a server starts

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=trust_remote_code)
        if trust_remote_code:
            from eagle_synth.encoders import with_encoder

            tokenizer = with_encoder(tokenizer, tokenizer_dir, trust_remote_code=True)
        return cls(tokenizer=tokenizer, vocab_size=vocab_size)

    def encode(self, text: str) -> list[int]:
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
        tid = token_id(self.tokenizer, token)  # None: the unknown-token fallback
        return self._in_vocab(tid) if tid is not None and self.tokenizer.convert_ids_to_tokens(tid) == token else None

    def _in_vocab(self, tid: int | None) -> int | None:
        return int(tid) if tid is not None and 0 <= tid < self.size else None


@dataclass(frozen=True, slots=True)
class Completion:
    """One generated sample: its ids (a matched stop token last) and SGLang's finish_reason."""

    output_ids: list[int]
    finish_reason: dict[str, Any]


@dataclass(kw_only=True)
class Generator:
    """Completions shaped like a chat model's output (docs/devserver.md, "Generation model"):
    natural lengths are gamma with `mean_output_tokens`, or lognormal with `length_median`;
    `seed` is mixed into temperature>0 sampling only."""

    vocab: ModelVocab
    mean_output_tokens: int
    seed: int
    length_median: int | None = None
    length_sigma: float = 1.0

    def __post_init__(self) -> None:
        self.tool_caller = ToolCaller.for_tokenizer(self.vocab.tokenizer)

    def complete(self, prompt: PromptRequest) -> Completion:
        seed = self._stream_seed(prompt)
        reasoning = self.vocab.prompt_opens_reasoning(prompt.input_ids)
        stream = self._stream(random.Random(seed), reasoning=reasoning, answer_ids=self._tool_call_ids(prompt, seed))
        out, finish = self._cut(stream, prompt.params, prompt.max_new_tokens)
        if prompt.params.stop and out:
            out, finish = self._cut_at_stop_string(out, finish, prompt.params)
        return Completion(output_ids=out, finish_reason=finish)

    def render_text(self, completion: Completion, params: SamplingParams) -> str:
        """The matched stop is trimmed unless no_stop_trim."""
        ids = completion.output_ids
        matched = completion.finish_reason.get("matched")
        if isinstance(matched, int) and not params.no_stop_trim and ids:
            ids = ids[:-1]
        text = self.vocab.decode(ids, skip_special_tokens=params.skip_special_tokens)
        if isinstance(matched, str) and not params.no_stop_trim and matched in text:
            text = text[: text.find(matched)]
        return text

    def _tool_call_ids(self, prompt: PromptRequest, seed: int) -> list[int] | None:
        rng = random.Random(seed ^ TOOL_ARGUMENTS_SALT)
        text = self.tool_caller.call_text(prompt.input_ids, rng) if self.tool_caller is not None else None
        if text is None:
            return None
        ids = self.vocab.encode(text)
        return ids if all(0 <= i < self.vocab.size for i in ids) else None

    def _stream_seed(self, prompt: PromptRequest) -> int:
        h = hashlib.blake2b(digest_size=16)
        h.update(array("q", prompt.input_ids).tobytes())
        p = prompt.params
        if p.greedy:
            h.update(b"greedy")
        else:
            penalties = [p.frequency_penalty, p.presence_penalty, p.repetition_penalty]
            key = ["sample", p.temperature, p.top_p, p.top_k, p.min_p, *penalties, p.sampling_seed, list(p.extra)]
            h.update(json.dumps([*key, prompt.sample_index, self.seed]).encode())
        return int.from_bytes(h.digest(), "big")

    def _natural_length(self, rng: random.Random) -> int:
        if self.length_median is not None:
            draw = rng.lognormvariate(math.log(self.length_median), self.length_sigma)
            return max(1, min(round(draw), self.length_median * LOGNORMAL_MAX_FACTOR))
        mean = self.mean_output_tokens
        draw = rng.gammavariate(LENGTH_GAMMA_SHAPE, mean / LENGTH_GAMMA_SHAPE)
        return max(1, min(round(draw), mean * LENGTH_MAX_FACTOR))

    def _body(self, rng: random.Random, count: int) -> Iterator[int]:
        corpus = self.vocab.corpus_ids
        size = len(corpus)
        while count > 0:
            run = min(count, rng.randint(*SEGMENT_TOKENS))
            start = rng.randrange(size)
            for k in range(run):
                yield corpus[(start + k) % size]
            count -= run

    def _stream(self, rng: random.Random, *, reasoning: bool, answer_ids: list[int] | None = None) -> Iterator[int]:
        """Reasoning, the answer (`answer_ids`, a tool call, else corpus), EOS, endless continuation."""
        total = self._natural_length(rng)
        thinking = total
        if reasoning:
            thinking = max(1, round(total * rng.uniform(*REASONING_SHARE)))
            yield from self._body(rng, thinking)
            if self.vocab.think_close_id is not None:  # prompt_opens_reasoning needs both think ids
                yield self.vocab.think_close_id
            yield from self.vocab.separator_ids
        answer = max(1, total - thinking) if reasoning else total
        yield from answer_ids if answer_ids is not None else self._body(rng, answer)
        if self.vocab.eos_id is not None:
            yield self.vocab.eos_id
        while True:
            yield from self._body(rng, CONTINUATION_TOKENS)

    def _cut(self, stream: Iterator[int], params: SamplingParams, cap: int) -> tuple[list[int], dict[str, Any]]:
        eos = self.vocab.eos_id
        stoppers = set() if params.ignore_eos else {*params.stop_token_ids, *([eos] if eos is not None else [])}
        out: list[int] = []
        masked = 0
        wanted_stop: int | None = None  # a stop masked by min_new_tokens, emitted once allowed
        for tok in stream:
            if len(out) >= cap:
                break
            if wanted_stop is not None and len(out) >= params.min_new_tokens:
                out.append(wanted_stop)
                return out, {"type": "stop", "matched": wanted_stop}
            if tok in stoppers:
                if len(out) >= params.min_new_tokens or masked >= MAX_MASKED_STOPS:
                    out.append(tok)
                    return out, {"type": "stop", "matched": tok}
                masked += 1
                if wanted_stop is None:
                    wanted_stop = tok
                continue
            if tok == eos:
                # ignore_eos: the model writes on instead of ending.
                continue
            out.append(tok)
        return out, {"type": "length", "length": cap}

    def _cut_at_stop_string(
        self, out: list[int], finish: dict[str, Any], params: SamplingParams
    ) -> tuple[list[int], dict[str, Any]]:
        skip = params.skip_special_tokens

        def first_match(ids: Sequence[int]) -> str | None:
            text = self.vocab.decode(ids, skip_special_tokens=skip)
            found = [(text.find(s), s) for s in params.stop if s in text]
            return min(found)[1] if found else None

        if first_match(out) is None:
            return out, finish
        # Containment only grows with the prefix, so the first completing token is found by
        # bisection instead of decoding every prefix.
        end = 1 + bisect.bisect_left(range(1, len(out)), True, key=lambda n: first_match(out[:n]) is not None)
        return out[:end], {"type": "stop", "matched": first_match(out[:end])}
