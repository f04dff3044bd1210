"""SGLang's /generate wire protocol: request parsing and validation, as the real server does it.

Validation order follows SGLang: request shape (empty input, rids, n) first, then per prompt
the TokenizerManager's context check (prompt + speculative reserve against the context), then
building the sampling params from the server's preferred params overlaid with the request's
own (unknown key or wrong value type: a TypeError, HTTP 500 before SGLang 0.5.23 and 400
since), then range checks (-> 400); then the scheduler's checks: the prompt against
max_req_input_len (-> 400) and max_new_tokens lowered to what max_req_len leaves. With
allow_auto_truncate the prompt and max_new_tokens are cut instead of refused. The first failing
prompt fails the whole request. Out-of-vocabulary ids are NOT checked here: real SGLang does
not check them either, the server dies on them later.
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagle_synth.errors import EagleSynthError
from eagle_synth.sampling import SGLANG_SAMPLING_KEYS

# Keys SGLang's SamplingParams accepts; anything else is a TypeError in the real server.
SAMPLING_KEYS = SGLANG_SAMPLING_KEYS
# Sampling keys by the JSON type SGLang's SamplingParams takes.
INT_KEYS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "sampling_seed")
FLOAT_KEYS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
# SGLang's default max_new_tokens when the request leaves it out.
DEFAULT_MAX_NEW_TOKENS = 128
# Below this temperature SGLang samples greedily.
GREEDY_TEMPERATURE = 1e-6
# The scheduler's input cap is its max_req_len minus this (Scheduler: max_req_input_len).
INPUT_CAP_MARGIN = 5
# First SGLang version answering an unknown or mistyped sampling key with 400 instead of 500.
SAMPLING_400_VERSION = (0, 5, 23)


def version_tuple(version: str) -> tuple[int, ...]:
    """(0, 5, 23) from "0.5.23" or "0.32.0rc1+cpu"; unparsable parts end the tuple."""
    numbers = []
    for part in version.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    return tuple(numbers)


@dataclass(frozen=True, slots=True)
class ServerRules:
    """How the emulated server checks a request: its launch settings that matter here.

    Parameters:
        context_length: the model context (what /v1/models reports).
        reserved_tokens: slots speculative decoding reserves per request (EAGLE drafts).
        max_req_len: the scheduler's cap on prompt + generated tokens + 1.
        allow_auto_truncate: cut over-long prompts and max_new_tokens instead of refusing.
        preferred: --preferred-sampling-params, merged under each request's own params.
        sampling_errors_are_400: unknown or mistyped sampling keys answer 400 (SGLang >=
            0.5.23) rather than 500.
    """

    context_length: int
    reserved_tokens: int = 0
    max_req_len: int | None = None
    allow_auto_truncate: bool = False
    preferred: dict | None = None
    sampling_errors_are_400: bool = True

    @property
    def effective_max_req_len(self) -> int:
        return self.max_req_len if self.max_req_len is not None else self.context_length - 1

    @property
    def max_req_input_len(self) -> int:
        """Prompts of this many tokens or more are refused by the scheduler."""
        return self.effective_max_req_len - INPUT_CAP_MARGIN


class ProtocolError(EagleSynthError):
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
        input_ids: the prompt ids the server generates from (as sent, unless
            allow_auto_truncate cut them).
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
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


# How the msgspec-based SamplingParams of SGLang 0.5.x names JSON types in its errors.
_JSON_TYPE_NAMES = {"list": "array", "dict": "object", "NoneType": "null"}  # int, float, str, bool: as named


def _type_error(key: str, value: Any, expected: str, *, as_400: bool) -> ProtocolError:
    """A mistyped sampling value: 400 in msgspec's wording (SGLang >= 0.5.23), else a 500."""
    if as_400:
        got = _JSON_TYPE_NAMES.get(type(value).__name__, type(value).__name__)
        return bad_request(f"Expected `{expected}`, got `{got}` - at `$.sampling_params.{key}`")
    return internal_error(f"TypeError: sampling param {key}={value!r} is not {expected}")


def parse_sampling_params(raw: Any, *, errors_are_400: bool = True) -> SamplingParams:
    """SGLang's SamplingParams(**raw) + verify(): unknown keys and wrong types are a TypeError
    (400 since SGLang 0.5.23 with `errors_are_400`, else 500), out-of-range values a 400."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise internal_error(f"TypeError: sampling_params must be a dict, got {type(raw).__name__}")
    unknown = sorted(set(raw) - SAMPLING_KEYS)
    if unknown:
        if errors_are_400:
            # msgspec's TypeError text, answered as SGLang answers ValueErrors.
            raise bad_request(f"Unexpected keyword argument '{unknown[0]}'")
        raise internal_error(f"TypeError: SamplingParams.__init__() got an unexpected keyword argument '{unknown[0]}'")
    values: dict[str, Any] = {}
    extra: list[tuple[str, str]] = []
    for key, value in raw.items():
        if value is None:
            continue
        if key in INT_KEYS:
            if not _is_int(value):
                raise _type_error(key, value, "int", as_400=errors_are_400)
            values[key] = value
        elif key in FLOAT_KEYS:
            if not _is_number(value):
                raise _type_error(key, value, "float", as_400=errors_are_400)
            values[key] = float(value)
        elif key in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
            values[key] = bool(value)
        elif key == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise _type_error(key, value, "str | array[str]", as_400=errors_are_400)
            values[key] = tuple(s for s in stops if s)
        elif key == "stop_token_ids":
            if not isinstance(value, list) or not all(_is_int(t) for t in value):
                raise _type_error(key, value, "array[int]", as_400=errors_are_400)
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
    if p.min_new_tokens < 0 or (p.max_new_tokens is not None and p.min_new_tokens > p.max_new_tokens):
        raise bad_request(f"min_new_tokens must be in [0, max_new_tokens({p.max_new_tokens})], got {p.min_new_tokens}.")
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


def _tokenizer_check(ids: list[int], raw_params: Any, rules: ServerRules) -> tuple[list[int], Any]:
    """SGLang's TokenizerManager._validate_one_request: the prompt plus the speculative reserve
    against the context, then with the request's OWN max_new_tokens (not the server's
    preferred one). Returns the (possibly cut) ids and sampling params."""
    ctx = rules.context_length
    held = len(ids) + rules.reserved_tokens
    if held >= ctx:
        if not rules.allow_auto_truncate:
            raise bad_request(f"The input ({held} tokens) is longer than the model's context length ({ctx} tokens).")
        ids = ids[:ctx]
        held = len(ids)  # as SGLang: the reserve is not counted again after the cut
    max_new = raw_params.get("max_new_tokens") if isinstance(raw_params, dict) else None
    if isinstance(max_new, int) and _is_int(max_new) and max_new + held > ctx:
        if not rules.allow_auto_truncate:
            raise bad_request(
                "Requested token count exceeds the model's maximum context length of "
                f"{ctx} tokens. You requested a total of {max_new + held} "
                f"tokens: {held} tokens from the input messages and {max_new} tokens for "
                "the completion. Please reduce the number of tokens in the input messages or "
                "the completion to fit within the limit."
            )
        raw_params = {**raw_params, "max_new_tokens": max(0, ctx - held)}
    return ids, raw_params


def _scheduler_check(ids: list[int], rules: ServerRules) -> list[int]:
    """The scheduler's validate_input_length: refuse (or cut) prompts of max_req_input_len+."""
    cap = rules.max_req_input_len
    if len(ids) < cap:
        return ids
    if rules.allow_auto_truncate:
        return ids[:cap]
    raise bad_request(
        f"Input length ({len(ids)} tokens) exceeds the maximum allowed length ({cap} tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )


def parse_generate_request(
    body: Any,
    *,
    rules: ServerRules,
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

    checked: list[tuple[list[int], SamplingParams]] = []
    for ids, raw_params in zip(prompts, raw_list):
        ids, raw_params = _tokenizer_check(ids, raw_params, rules)
        if rules.preferred and (raw_params is None or isinstance(raw_params, dict)):
            raw_params = {**rules.preferred, **(raw_params or {})}
        checked.append((ids, parse_sampling_params(raw_params, errors_are_400=rules.sampling_errors_are_400)))

    parsed: list[tuple[list[int], SamplingParams, int]] = []
    for ids, params in checked:
        ids = _scheduler_check(ids, rules)
        asked = params.max_new_tokens if params.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS
        # The scheduler lowers max_new_tokens to what max_req_len leaves, without a word.
        cap = max(min(asked, rules.effective_max_req_len - len(ids) - 1), 0)
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
