"""Deterministic, GPU-free generation: what the emulated model answers to a prompt.

A completion is a pure function of the prompt ids and the sampling parameters (for
temperature > 0 also of the sample index within `n`, the `sampling_seed` and the server
seed). Greedy output depends on the prompt alone, so, as with a real model, a greedy
completion capped at 10 tokens is a prefix of the same prompt capped at 100. A prompt that
offers tools gets a tool call as its answer (see toolcalls.py).
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

from eagle_synth.devserver.protocol import PromptRequest, SamplingParams
from eagle_synth.devserver.toolcalls import ToolCaller
from eagle_synth.devserver.vocab import ModelVocab

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


@dataclass(frozen=True, slots=True)
class Completion:
    """One generated sample: its ids (a matched stop token last) and SGLang's finish_reason."""

    output_ids: list[int]
    finish_reason: dict[str, Any]


class Generator:
    """Turns prompts into completions shaped like a chat model's output (docs/devserver.md,
    "Generation model"): reasoning (when the prompt opens `<think>`), answer or tool call, EOS,
    cut by SGLang's stop rules.

    Parameters:
        vocab: the model's token space.
        mean_output_tokens: mean of the gamma-distributed natural output length.
        seed: the server seed, mixed into temperature>0 sampling only.
        length_median, length_sigma: lognormal lengths instead (median None: gamma).
    """

    def __init__(
        self,
        *,
        vocab: ModelVocab,
        mean_output_tokens: int,
        seed: int,
        length_median: int | None = None,
        length_sigma: float = 1.0,
    ) -> None:
        self.vocab, self.mean_output_tokens, self.seed = vocab, mean_output_tokens, seed
        self.length_median, self.length_sigma = length_median, length_sigma
        self.tool_caller = ToolCaller.for_tokenizer(vocab.tokenizer)

    def complete(self, prompt: PromptRequest) -> Completion:
        seed = self._stream_seed(prompt)
        reasoning = self.vocab.prompt_opens_reasoning(prompt.input_ids)
        stream = self._stream(random.Random(seed), reasoning=reasoning, answer_ids=self._tool_call_ids(prompt, seed))
        out, finish = self._cut(stream, prompt.params, prompt.max_new_tokens)
        if prompt.params.stop and out:
            out, finish = self._cut_at_stop_string(out, finish, prompt.params)
        return Completion(output_ids=out, finish_reason=finish)

    def render_text(self, completion: Completion, params: SamplingParams) -> str:
        """The response `text`: decoded ids, the matched stop trimmed unless no_stop_trim."""
        ids = completion.output_ids
        matched = completion.finish_reason.get("matched")
        if isinstance(matched, int) and not params.no_stop_trim and ids:
            ids = ids[:-1]
        text = self.vocab.decode(ids, skip_special_tokens=params.skip_special_tokens)
        if isinstance(matched, str) and not params.no_stop_trim and matched in text:
            text = text[: text.find(matched)]
        return text

    def _tool_call_ids(self, prompt: PromptRequest, seed: int) -> list[int] | None:
        """The ids of the tool call answering this prompt, or None to answer in words."""
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
        """The uncut stream: natural completion (`answer_ids`, a tool call, replacing the answer
        tokens), EOS, then endless continuation."""
        total = thinking = self._natural_length(rng)
        if reasoning:
            thinking = max(1, round(total * rng.uniform(*REASONING_SHARE)))
            yield from self._body(rng, thinking)
            if self.vocab.think_close_id is not None:  # prompt_opens_reasoning needs both think ids
                yield self.vocab.think_close_id
            yield from self.vocab.separator_ids
        yield from (
            answer_ids if answer_ids is not None else self._body(rng, max(1, total - thinking) if reasoning else total)
        )
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
