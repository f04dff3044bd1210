"""SGLang's /generate wire protocol: request parsing and validation, as the real server does it.

Validation order follows SGLang: request shape (empty input, rids, n) first, then per prompt
the context-length check, then building the sampling params (unknown key -> TypeError -> 500,
wrong value type -> 500), then range checks (-> 400). The first failing prompt fails the
whole request. Out-of-vocabulary ids are NOT checked here: real SGLang does not check them
either, the server dies on them later.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagle_synth.sampling import SGLANG_SAMPLING_KEYS

# Keys SGLang's SamplingParams accepts; anything else is a TypeError in the real server.
SAMPLING_KEYS = SGLANG_SAMPLING_KEYS
# SGLang's default max_new_tokens when the request leaves it out.
DEFAULT_MAX_NEW_TOKENS = 128
# Below this temperature SGLang samples greedily.
GREEDY_TEMPERATURE = 1e-6


class ProtocolError(Exception):
    """A request the real server refuses; `status` is the HTTP status it would answer."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bad_request(message: str) -> ProtocolError:
    """A ValueError inside SGLang: HTTP 400 with {"error": {"message": ...}}."""
    return ProtocolError(message, status=400)


def internal_error(message: str) -> ProtocolError:
    """An uncaught exception inside SGLang (TypeError...): HTTP 500 "Internal Server Error"."""
    return ProtocolError(message, status=500)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """One prompt's sampling parameters after SGLang's defaults and checks.

    Parameters: as SGLang's SamplingParams; `max_new_tokens` None means "not given" (the
    server then uses DEFAULT_MAX_NEW_TOKENS clipped to the context). `extra` keeps accepted
    keys the devserver does not act on (grammars, logit_bias...), for the generation key.
    """

    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    extra: tuple[tuple[str, str], ...] = field(default=())

    @property
    def greedy(self) -> bool:
        """True when SGLang would sample greedily."""
        return self.temperature < GREEDY_TEMPERATURE


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """One prompt of a /generate request after `n` expansion, in response order.

    Parameters:
        input_ids: the prompt ids as sent.
        params: its sampling parameters.
        max_new_tokens: the effective cap (default applied and clipped to the context).
        rid: the id reported in meta_info.
        group_rid: the rid the client gave (or generated), which /abort_request matches.
        sample_index: position among the prompt's n samples (0 when n == 1).
    """

    input_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    rid: str
    group_rid: str
    sample_index: int


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """A parsed /generate request: `single` means the response is one object, not a list."""

    single: bool
    prompts: list[PromptRequest]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(
        value
    )


def _type_error(key: str, value: Any, expected: str) -> ProtocolError:
    return internal_error(f"TypeError: sampling param {key}={value!r} is not {expected}")


def parse_sampling_params(raw: Any) -> SamplingParams:
    """SGLang's SamplingParams(**raw) + verify(): 500 on unknown keys or types, 400 on ranges."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise internal_error(f"TypeError: sampling_params must be a dict, got {type(raw).__name__}")
    unknown = sorted(set(raw) - SAMPLING_KEYS)
    if unknown:
        raise internal_error(
            f"TypeError: SamplingParams.__init__() got an unexpected keyword argument '{unknown[0]}'"
        )
    values: dict[str, Any] = {}
    extra: list[tuple[str, str]] = []
    for key, value in raw.items():
        if value is None:
            continue
        if key in ("max_new_tokens", "min_new_tokens", "top_k", "n", "sampling_seed"):
            if not _is_int(value):
                raise _type_error(key, value, "an int")
            values[key] = value
        elif key in (
            "temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
            "repetition_penalty",
        ):
            if not _is_number(value):
                raise _type_error(key, value, "a number")
            values[key] = float(value)
        elif key in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
            values[key] = bool(value)
        elif key == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise _type_error(key, value, "a string or a list of strings")
            values[key] = tuple(s for s in stops if s)
        elif key == "stop_token_ids":
            if not isinstance(value, list) or not all(_is_int(t) for t in value):
                raise _type_error(key, value, "a list of ints")
            values[key] = tuple(value)
        else:
            extra.append((key, repr(value)))
    params = SamplingParams(**values, extra=tuple(sorted(extra)))
    _verify(params)
    return params


def _verify(p: SamplingParams) -> None:
    """SGLang's SamplingParams.verify(): out-of-range values are ValueErrors (HTTP 400)."""
    if p.temperature < 0.0:
        raise bad_request(f"temperature must be non-negative, got {p.temperature}.")
    if not 0.0 < p.top_p <= 1.0:
        raise bad_request(f"top_p must be in (0, 1], got {p.top_p}.")
    if not 0.0 <= p.min_p <= 1.0:
        raise bad_request(f"min_p must be in [0, 1], got {p.min_p}.")
    if p.top_k < 1 and p.top_k != -1:
        raise bad_request(f"top_k must be -1 (disable), or at least 1, got {p.top_k}.")
    if not -2.0 <= p.frequency_penalty <= 2.0:
        raise bad_request(f"frequency_penalty must be in [-2, 2], got {p.frequency_penalty}.")
    if not -2.0 <= p.presence_penalty <= 2.0:
        raise bad_request(f"presence_penalty must be in [-2, 2], got {p.presence_penalty}.")
    if not 0.0 <= p.repetition_penalty <= 2.0:
        raise bad_request(f"repetition_penalty must be in [0, 2], got {p.repetition_penalty}.")
    if p.max_new_tokens is not None and p.max_new_tokens < 0:
        raise bad_request(f"max_new_tokens must be at least 0, got {p.max_new_tokens}.")
    if p.min_new_tokens < 0 or (
        p.max_new_tokens is not None and p.min_new_tokens > p.max_new_tokens
    ):
        raise bad_request(
            f"min_new_tokens must be in [0, max_new_tokens({p.max_new_tokens})], "
            f"got {p.min_new_tokens}."
        )
    if p.n < 1:
        raise bad_request(f"n must be at least 1, got {p.n}.")


def _check_ids(ids: Any) -> list[int]:
    if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
        raise bad_request("input_ids must be a list of integers or a list of such lists.")
    return ids


def _prompts_from_body(body: dict, tokenize: Callable[[str], list[int]] | None):
    """(single, [prompt ids]) from input_ids or text, with SGLang's shape errors."""
    given = [k for k in ("text", "input_ids", "input_embeds") if body.get(k) is not None]
    if len(given) != 1:
        raise bad_request("Either text, input_ids or input_embeds should be provided.")
    if given[0] == "input_embeds":
        raise bad_request("The devserver does not support input_embeds.")
    if given[0] == "text":
        if tokenize is None:
            raise bad_request("text input needs a tokenizer (the server skips tokenizer init).")
        text = body["text"]
        if isinstance(text, str):
            return True, [tokenize(text)]
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return False, [tokenize(t) for t in text]
        raise bad_request("text must be a string or a non-empty list of strings.")
    ids = body["input_ids"]
    if not isinstance(ids, list) or not ids:
        raise bad_request("input_ids cannot be empty.")
    if isinstance(ids[0], list):
        prompts = [_check_ids(p) for p in ids]
        if any(not p for p in prompts):
            raise bad_request("input_ids cannot be empty.")
        return False, prompts
    return True, [_check_ids(ids)]


def _rids(body: dict, *, single: bool, count: int) -> list[str]:
    rid = body.get("rid")
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    if single:
        if not isinstance(rid, str):
            raise bad_request("The rid should be a string for a single request.")
        return [rid]
    if not isinstance(rid, list) or not all(isinstance(r, str) for r in rid):
        raise bad_request("The rid should be a list for batch processing.")
    if len(rid) != count:
        raise bad_request("The specified rids length mismatch with the batch_size for batch processing.")
    if len(set(rid)) != len(rid):
        raise bad_request("Duplicate rids are not allowed in one batch request.")
    return list(rid)


def _context_check(prompt_len: int, raw_params: Any, context_length: int) -> None:
    """SGLang's _validate_one_request (no auto-truncate)."""
    if prompt_len >= context_length:
        raise bad_request(
            f"The input ({prompt_len} tokens) is longer than the model's context length "
            f"({context_length} tokens)."
        )
    max_new = raw_params.get("max_new_tokens") if isinstance(raw_params, dict) else None
    if _is_int(max_new) and max_new + prompt_len >= context_length:
        raise bad_request(
            "Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of {max_new + prompt_len} "
            f"tokens: {prompt_len} tokens from the input messages and {max_new} tokens for "
            "the completion. Please reduce the number of tokens in the input messages or "
            "the completion to fit within the limit."
        )


def parse_generate_request(
    body: Any,
    *,
    context_length: int,
    tokenize: Callable[[str], list[int]] | None,
) -> GenerateRequest:
    """Parse and validate a /generate body; raises ProtocolError as SGLang would fail."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    if body.get("stream"):
        raise bad_request("The devserver does not support stream=true.")
    single, prompts = _prompts_from_body(body, tokenize)
    raw = body.get("sampling_params")
    if isinstance(raw, list):
        if single or len(raw) != len(prompts):
            raise bad_request("The length of sampling_params must match the batch size.")
        raw_list = raw
    else:
        raw_list = [raw] * len(prompts)
    ns = {(r.get("n") or 1) if isinstance(r, dict) else 1 for r in raw_list}
    if len(ns) > 1:
        raise bad_request("The parallel_sample_num should be the same for all samples in sample params.")
    rids = _rids(body, single=single, count=len(prompts))

    parsed: list[tuple[list[int], SamplingParams, int]] = []
    for ids, raw_params in zip(prompts, raw_list):
        _context_check(len(ids), raw_params, context_length)
        params = parse_sampling_params(raw_params)
        room = max(context_length - len(ids) - 1, 0)
        if params.max_new_tokens is None:
            cap = min(DEFAULT_MAX_NEW_TOKENS, room)
        else:
            cap = params.max_new_tokens
        parsed.append((ids, params, cap))

    n = parsed[0][1].n
    out: list[PromptRequest] = []
    for (ids, params, cap), rid in zip(parsed, rids):
        for j in range(n):
            out.append(
                PromptRequest(
                    input_ids=ids,
                    params=params,
                    max_new_tokens=cap,
                    rid=rid if n == 1 else f"{rid}_{j}",
                    group_rid=rid,
                    sample_index=j,
                )
            )
    return GenerateRequest(single=single and n == 1, prompts=out)
