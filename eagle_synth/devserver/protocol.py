"""The wire side of both APIs: Reply, the parsed prompt, and the request parsing.

SGLang's /generate is validated in its order (docs/devserver.md, "Errors"); out-of-vocabulary
ids are not checked: SGLang does not either, it dies on them. vLLM's /v1/completions is checked
as vLLM's source does it (entrypoints/openai/completion/protocol.py and serving.py,
sampling_params.py, renderers/params.py) and parses to the same PromptRequest/SamplingParams, so
the same campaign gives the same ids, timing and faults on both APIs.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from eagle_synth.errors import ProtocolError
from eagle_synth.sampling import SGLANG_SAMPLING_KEYS, version_tuple

if TYPE_CHECKING:
    from eagle_synth.devserver.config import DevServerConfig

# SGLang's default max_new_tokens when the request leaves it out.
DEFAULT_MAX_NEW_TOKENS = 128
# Below this temperature SGLang samples greedily.
GREEDY_TEMPERATURE = 1e-6
# First SGLang version answering an unknown or mistyped sampling key with 400 instead of 500.
SAMPLING_400_VERSION = (0, 5, 23)


@dataclass(slots=True)
class Reply:
    """What the transport does with a request: send `status`/`body`/`content_type` (a byte
    every `trickle` seconds when set), or `drop` the connection; with `die_reason` the server
    dies once that is done."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    drop: bool = False
    die_reason: str | None = None
    trickle: float = 0.0


def json_reply(obj: Any, status: int = 200) -> Reply:
    return Reply(status=status, body=json.dumps(obj, separators=(",", ":")).encode())


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """One prompt's sampling parameters under SGLang's names (max_new_tokens None: not given);
    `extra` keeps accepted keys the devserver does not act on, which still seed sampled output."""

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
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """One prompt after `n` expansion, in response order (either API); `group_rid` is the
    client's rid, which /abort_request matches."""

    input_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    rid: str
    group_rid: str
    sample_index: int


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    single: bool  # the response is one object, not a list
    prompts: list[PromptRequest]


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(s, str) for s in value)


def _is_stop(value: Any) -> bool:
    return isinstance(value, str) or _is_str_list(value)


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(is_int(t) for t in value)


# SamplingParams keys with a type: key -> (msgspec's name of the type, check, conversion).
# Other known keys (grammars, logit_bias, ...) are kept as `extra`.
TYPED_KEYS: dict[str, tuple[str, Callable[[Any], bool], Callable[[Any], Any]]] = {
    "max_new_tokens": ("int", is_int, int),
    "min_new_tokens": ("int", is_int, int),
    "top_k": ("int", is_int, int),
    "n": ("int", is_int, int),
    "sampling_seed": ("int", is_int, int),
    "temperature": ("float", _is_number, float),
    "top_p": ("float", _is_number, float),
    "min_p": ("float", _is_number, float),
    "frequency_penalty": ("float", _is_number, float),
    "presence_penalty": ("float", _is_number, float),
    "repetition_penalty": ("float", _is_number, float),
    "ignore_eos": ("bool", lambda v: True, bool),
    "skip_special_tokens": ("bool", lambda v: True, bool),
    "no_stop_trim": ("bool", lambda v: True, bool),
    "stop": ("str | array[str]", _is_stop, lambda v: tuple(s for s in ([v] if isinstance(v, str) else v) if s)),
    "stop_token_ids": ("array[int]", _is_int_list, tuple),
}
# How msgspec names JSON types in its errors (int, float, str, bool: as Python names them).
_JSON_TYPE_NAMES = {"list": "array", "dict": "object", "NoneType": "null"}


def refuse_first(checks: Iterable[tuple[bool, str]]) -> None:
    """A 400 with the message of the first (failed, message) check that failed."""
    if (message := next((text for failed, text in checks if failed), None)) is not None:
        raise ProtocolError(message)


def parse_sampling_params(raw: Any, *, errors_are_400: bool = True) -> SamplingParams:
    """SGLang's SamplingParams(**raw) + verify(): unknown keys and wrong types are a 400 in
    msgspec's wording with `errors_are_400`, else a 500 (a TypeError)."""
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ProtocolError(f"TypeError: sampling_params must be a dict, got {type(raw).__name__}", status=500)
    unknown = sorted(set(raw) - SGLANG_SAMPLING_KEYS)
    if unknown and errors_are_400:
        raise ProtocolError(f"Unexpected keyword argument '{unknown[0]}'")
    if unknown:
        raise ProtocolError(
            f"TypeError: SamplingParams.__init__() got an unexpected keyword argument '{unknown[0]}'", status=500
        )
    values: dict[str, Any] = {}
    extra: list[tuple[str, str]] = []
    for key, value in raw.items():
        if value is None:
            continue
        if key not in TYPED_KEYS:
            extra.append((key, repr(value)))
            continue
        expected, valid, convert = TYPED_KEYS[key]
        if not valid(value) and errors_are_400:
            got = _JSON_TYPE_NAMES.get(type(value).__name__, type(value).__name__)
            raise ProtocolError(f"Expected `{expected}`, got `{got}` - at `$.sampling_params.{key}`")
        if not valid(value):
            raise ProtocolError(f"TypeError: sampling param {key}={value!r} is not {expected}", status=500)
        values[key] = convert(value)
    p = SamplingParams(**values, extra=tuple(sorted(extra)))
    # SGLang's SamplingParams.verify()
    max_new = p.max_new_tokens
    min_new = p.min_new_tokens
    penalties = {"frequency_penalty": -2.0, "presence_penalty": -2.0, "repetition_penalty": 0.0}
    refuse_first(
        (
            (p.temperature < 0.0, f"temperature must be non-negative, got {p.temperature}."),
            (not 0.0 < p.top_p <= 1.0, f"top_p must be in (0, 1], got {p.top_p}."),
            (not 0.0 <= p.min_p <= 1.0, f"min_p must be in [0, 1], got {p.min_p}."),
            (p.top_k < 1 and p.top_k != -1, f"top_k must be -1 (disable), or at least 1, got {p.top_k}."),
            *(
                (not low <= getattr(p, k) <= 2.0, f"{k} must be in [{low:g}, 2], got {getattr(p, k)}.")
                for k, low in penalties.items()
            ),
            (max_new is not None and max_new < 0, f"max_new_tokens must be at least 0, got {max_new}."),
            (
                min_new < 0 or (max_new is not None and min_new > max_new),
                f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}.",
            ),
            (p.n < 1, f"n must be at least 1, got {p.n}."),
        )
    )
    return p


def _check_ids(ids: Any) -> list[int]:
    if not _is_int_list(ids):
        raise ProtocolError("input_ids must be a list of integers or a list of such lists.")
    return ids


def _prompts_from_body(body: dict, tokenize: Callable[[str], list[int]] | None) -> tuple[bool, list[list[int]]]:
    """(single, [prompt ids]) from input_ids or text, with SGLang's shape errors."""
    given = [k for k in ("text", "input_ids", "input_embeds") if body.get(k) is not None]
    if len(given) != 1:
        raise ProtocolError("Either text, input_ids or input_embeds should be provided.")
    if given[0] == "input_embeds":
        raise ProtocolError("The devserver does not support input_embeds.")
    if given[0] == "text":
        text = body["text"]
        if tokenize is None:
            raise ProtocolError("text input needs a tokenizer (the server skips tokenizer init).")
        if isinstance(text, str):
            return True, [tokenize(text)]
        if text and _is_str_list(text):
            return False, [tokenize(t) for t in text]
        raise ProtocolError("text must be a string or a non-empty list of strings.")
    ids = body["input_ids"]
    if not isinstance(ids, list) or not ids:
        raise ProtocolError("input_ids cannot be empty.")
    if not isinstance(ids[0], list):
        return True, [_check_ids(ids)]
    prompts = [_check_ids(p) for p in ids]
    if not all(prompts):
        raise ProtocolError("input_ids cannot be empty.")
    return False, prompts


def _rids(body: dict, *, single: bool, count: int) -> list[str]:
    rid = body.get("rid")
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    if single and not isinstance(rid, str):
        raise ProtocolError("The rid should be a string for a single request.")
    if single:
        return [rid]
    if not _is_str_list(rid):
        raise ProtocolError("The rid should be a list for batch processing.")
    if len(rid) != count:
        raise ProtocolError("The specified rids length mismatch with the batch_size for batch processing.")
    if len(set(rid)) != len(rid):
        raise ProtocolError("Duplicate rids are not allowed in one batch request.")
    return list(rid)


def _tokenizer_check(ids: list[int], raw_params: Any, config: DevServerConfig) -> tuple[list[int], Any]:
    """SGLang's TokenizerManager._validate_one_request: the prompt plus the speculative reserve
    against the context, then with the request's OWN max_new_tokens (not the preferred one)."""
    ctx = config.effective_context_length
    held = len(ids) + config.draft_reserved_tokens
    if held >= ctx and not config.allow_auto_truncate:
        raise ProtocolError(f"The input ({held} tokens) is longer than the model's context length ({ctx} tokens).")
    if held >= ctx:
        ids = ids[:ctx]
        held = len(ids)  # as SGLang: the reserve is not counted again after the cut
    max_new = raw_params.get("max_new_tokens") if isinstance(raw_params, dict) else None
    if not is_int(max_new) or max_new + held <= ctx:
        return ids, raw_params
    if not config.allow_auto_truncate:
        raise ProtocolError(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested a "
            f"total of {max_new + held} tokens: {held} tokens from the input messages and {max_new} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the completion to fit within "
            "the limit."
        )
    return ids, {**raw_params, "max_new_tokens": max(0, ctx - held)}


def parse_generate_request(
    body: Any, config: DevServerConfig, *, tokenize: Callable[[str], list[int]] | None
) -> GenerateRequest:
    """Parse and validate a /generate body; raises ProtocolError as SGLang would fail."""
    preferred = config.preferred_params
    errors_are_400 = version_tuple(config.sglang_version) >= SAMPLING_400_VERSION
    max_input = config.max_req_input_len
    if not isinstance(body, dict):
        raise ProtocolError("The request body must be a JSON object.")
    if body.get("stream"):
        raise ProtocolError("The devserver does not support stream=true.")
    single, prompts = _prompts_from_body(body, tokenize)
    raw = body.get("sampling_params")
    if isinstance(raw, list) and (single or len(raw) != len(prompts)):
        raise ProtocolError("The length of sampling_params must match the batch size.")
    raw_list = raw if isinstance(raw, list) else [raw] * len(prompts)
    if len({(r.get("n") or 1) if isinstance(r, dict) else 1 for r in raw_list}) > 1:
        raise ProtocolError("The parallel_sample_num should be the same for all samples in sample params.")
    rids = _rids(body, single=single, count=len(prompts))
    checked = []
    for ids, raw_params in zip(prompts, raw_list):
        ids, raw_params = _tokenizer_check(ids, raw_params, config)
        if preferred and (raw_params is None or isinstance(raw_params, dict)):
            raw_params = {**preferred, **(raw_params or {})}
        checked.append((ids, parse_sampling_params(raw_params, errors_are_400=errors_are_400)))
    out: list[PromptRequest] = []
    n = checked[0][1].n
    for (ids, params), rid in zip(checked, rids):
        # The scheduler's validate_input_length.
        if len(ids) >= max_input and not config.allow_auto_truncate:
            raise ProtocolError(
                f"Input length ({len(ids)} tokens) exceeds the maximum allowed length ({max_input} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            )
        ids = ids[:max_input]
        asked = params.max_new_tokens if params.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS
        # The scheduler lowers max_new_tokens to what max_req_len leaves, without a word.
        cap = max(min(asked, config.max_req_len - len(ids) - 1), 0)
        out.extend(
            PromptRequest(ids, params, cap, rid=rid if n == 1 else f"{rid}_{j}", group_rid=rid, sample_index=j)
            for j in range(n)
        )
    return GenerateRequest(single=single and n == 1, prompts=out)


# The first vLLM version seen shortening max_tokens to the context's room (0.32.0, the real CPU
# build tried here); 0.11 refuses with a 400. Versions between were not tried.
SHORTENS_MAX_TOKENS_FROM = (0, 32, 0)
DEFAULT_MAX_TOKENS = 16
# vLLM raises a temperature in (0, this) to this (SamplingParams.__post_init__).
MIN_TEMPERATURE = 0.01
# Below this temperature vLLM samples greedily.
SAMPLING_EPS = 1e-5
# Penalties the OpenAI API names and defaults to 0.
PENALTIES = ("presence_penalty", "frequency_penalty")
# OpenAI's defaults, used when neither the request nor the server's generation config sets one.
OPENAI_DEFAULTS = {"repetition_penalty": 1.0, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
# Fields that change a sampled completion without the Generator acting on them.
EXTRA_FIELDS = ("logit_bias", "allowed_token_ids", "bad_words", "spaces_between_special_tokens")
# CompletionRequest fields by JSON type, for pydantic's checks.
FLOAT_FIELDS = (
    *("frequency_penalty", "presence_penalty", "temperature", "top_p", "min_p", "repetition_penalty"),
    "length_penalty",
)
INT_FIELDS = (
    *("max_tokens", "n", "seed", "top_k", "min_tokens", "logprobs", "prompt_logprobs", "truncate_prompt_tokens"),
    "priority",
)
BOOL_FIELDS = (
    *("echo", "stream", "use_beam_search", "include_stop_str_in_output", "ignore_eos", "skip_special_tokens"),
    *("spaces_between_special_tokens", "add_special_tokens", "return_token_ids", "return_tokens_as_token_ids"),
)
# pydantic's type checks: (fields, valid value, the type its message names).
TYPE_CHECKS: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    (FLOAT_FIELDS, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "number"),
    (INT_FIELDS, is_int, "integer"),
    (BOOL_FIELDS, lambda v: isinstance(v, bool), "boolean"),
    (("stop",), _is_stop, "list"),
    (("stop_token_ids",), _is_int_list, "list"),
)
# Every field of vLLM's CompletionRequest the devserver knows; others are ignored, as vLLM does.
KNOWN_FIELDS = frozenset(
    {
        *("model", "prompt", "suffix", "user", "stop", "stop_token_ids", "logit_bias", "allowed_token_ids"),
        *("bad_words", "stream_options", "response_format", "structured_outputs", "request_id", "cache_salt"),
        *("vllm_xargs", *FLOAT_FIELDS, *INT_FIELDS, *BOOL_FIELDS),
    }
)
# vLLM's message when its engine fails mid-request (EngineDeadError / GenerationError), HTTP 500.
ENGINE_ERROR_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# vLLM's ErrorResponse `type` by HTTP status.
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def _validation_error(field: str, kind: str, msg: str, value: Any) -> ProtocolError:
    """pydantic's RequestValidationError as vLLM answers it (400, the field at ('body', ...))."""
    return ProtocolError(
        f"1 validation error for CompletionRequest: [{{'type': '{kind}', 'loc': ('body', '{field}'), "
        f"'msg': '{msg}', 'input': {value!r}}}]"
    )


def _field_error(field: str, value: Any, expected: str) -> ProtocolError:
    return _validation_error(field, f"{expected}_type", f"Input should be a valid {expected}", value)


def _prompts(body: dict, tokenize: Callable[[str], list[int]] | None) -> list[list[int]]:
    prompt = body.get("prompt")
    if prompt is None or prompt == "":
        raise ProtocolError("Either prompt or prompt_embeds must be provided and non-empty.")
    prompt = [prompt] if isinstance(prompt, str) else prompt
    if _is_int_list(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and all(_is_int_list(p) for p in prompt):
        prompts = prompt
    elif _is_str_list(prompt):
        if tokenize is None:
            raise ProtocolError("Unable to get tokenizer because `skip_tokenizer_init=True`")
        prompts = [tokenize(p) for p in prompt]
    else:
        raise _field_error("prompt", prompt, "list")
    if (negative := next((i for ids in prompts for i in ids if i < 0), None)) is not None:
        raise _validation_error("prompt", "greater_than_equal", "Input should be greater than or equal to 0", negative)
    return prompts


def parse_completion_request(body: Any, config: DevServerConfig, vocab_size: int, tokenize) -> list[PromptRequest]:
    """One PromptRequest per choice (n per prompt, prompt-major) of a /v1/completions body;
    raises ProtocolError as vLLM would fail. vLLM 0.32 (the real CPU build) shortens max_tokens
    to the room the prompt leaves and refuses only a prompt that fills the context; older
    vLLM refuses a prompt + max_tokens above it."""
    served = config.effective_served_model_name
    overrides = config.generation_overrides
    shortens = version_tuple(config.vllm_version) >= SHORTENS_MAX_TOKENS_FROM
    if not isinstance(body, dict):
        raise ProtocolError("1 validation error for CompletionRequest: Input should be a valid dictionary")
    for fields, valid, expected in TYPE_CHECKS:
        if (bad := next((f for f in fields if body.get(f) is not None and not valid(body[f])), None)) is not None:
            raise _field_error(bad, body[bad], expected)
    model = body.get("model")
    if model is not None and model != served:
        raise ProtocolError(f"The model `{model}` does not exist.", status=404, param="model")
    if body.get("stream"):
        raise ProtocolError("The devserver does not support stream=true.")
    if body.get("echo") or body.get("use_beam_search"):
        raise ProtocolError("The devserver does not support echo or beam search.")
    prompts = _prompts(body, tokenize)
    max_tokens = DEFAULT_MAX_TOKENS if body.get("max_tokens") is None else body["max_tokens"]
    limit = config.effective_context_length
    if max_tokens > limit:
        raise ProtocolError(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please request fewer output tokens."
        )
    stop = body.get("stop")
    seed = body.get("seed")
    # The request's sampling under SGLang's names, so equal values give equal ids on both APIs:
    # user -> server default (generation config, override) -> OpenAI default.
    p = {k: body[k] if body.get(k) is not None else overrides.get(k, v) for k, v in OPENAI_DEFAULTS.items()}
    p["n"] = body.get("n") or 1
    p["max_new_tokens"] = max_tokens
    p["min_new_tokens"] = body.get("min_tokens") or 0
    p |= {k: body.get(k) or 0.0 for k in PENALTIES}
    p |= {"stop": (stop,) if isinstance(stop, str) else tuple(stop or ())}
    p |= {"sampling_seed": None if seed == -1 else seed}
    # vLLM's request model makes these floats: `1` and `1.0` are one request (and one seed) to it.
    p |= {k: float(p[k]) for k in ("temperature", "top_p", "min_p", "repetition_penalty", *PENALTIES)}
    if 0 < p["temperature"] < MIN_TEMPERATURE:
        p["temperature"] = MIN_TEMPERATURE
    refuse_first(  # vLLM's SamplingParams._verify_args
        (
            (p["n"] < 1, f"n must be at least 1, got {p['n']}."),
            *((not -2.0 <= p[k] <= 2.0, f"{k} must be in [-2, 2], got {p[k]}.") for k in PENALTIES),
            (
                not math.isfinite(p["repetition_penalty"]) or p["repetition_penalty"] <= 0.0,
                f"repetition_penalty must be greater than zero, got {p['repetition_penalty']}.",
            ),
            (
                not math.isfinite(p["temperature"]) or p["temperature"] < 0.0,
                f"temperature must be non-negative, got {p['temperature']}.",
            ),
            (p["temperature"] > 2.0, f"temperature must be in [0, 2], got {p['temperature']}."),
            (not 0.0 < p["top_p"] <= 1.0, f"top_p must be in (0, 1], got {p['top_p']}."),
            (p["top_k"] < -1, f"top_k must be 0 (disable), or at least 1, got {p['top_k']}."),
            (not 0.0 <= p["min_p"] <= 1.0, f"min_p must be in [0, 1], got {p['min_p']}."),
            (max_tokens < 1, f"max_tokens must be at least 1, got {max_tokens}."),
            (p["min_new_tokens"] < 0, f"min_tokens must be greater than or equal to 0, got {p['min_new_tokens']}."),
            (
                p["min_new_tokens"] > max_tokens,
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {p['min_new_tokens']}.",
            ),
            (any(not s for s in p["stop"]), "stop cannot contain an empty string."),
            (p["temperature"] < SAMPLING_EPS and p["n"] > 1, f"n must be 1 when using greedy sampling, got {p['n']}."),
        )
    )
    # vLLM's top_k 0 and -1 both mean off; fields the Generator ignores still seed sampled output.
    p["top_k"] = -1 if p["top_k"] in (0, -1) else p["top_k"]
    p["ignore_eos"] = bool(body.get("ignore_eos"))
    p |= {"skip_special_tokens": body.get("skip_special_tokens", True) is not False}
    p |= {"no_stop_trim": bool(body.get("include_stop_str_in_output"))}
    p |= {"stop_token_ids": tuple(body.get("stop_token_ids") or ())}
    extra = tuple(sorted((k, repr(body[k])) for k in EXTRA_FIELDS if body.get(k) is not None))
    sampling = SamplingParams(**p, extra=extra)
    out: list[PromptRequest] = []
    for index, ids in enumerate(prompts):
        if not ids:
            raise ProtocolError("The decoder prompt cannot be empty")
        room = limit - len(ids)
        if shortens and room < 0:
            raise ProtocolError(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains {len(ids)} "
                "input tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
                f"the input prompt. (parameter=input_tokens, value={len(ids)})",
                param="input_tokens",
            )
        if shortens and room == 0:
            message = "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
            raise ProtocolError(message, param="max_tokens")
        if room < max_tokens and not shortens:
            raise ProtocolError(
                f"You passed {len(ids)} input tokens and requested {max_tokens} output tokens. However, the model's "
                f"context length is only {limit} tokens, resulting in a maximum input length of "
                f"{limit - max_tokens} tokens. Please reduce the length of the input prompt."
            )
        if (oov := next((i for i in ids if i >= vocab_size), None)) is not None:
            raise ProtocolError(f"Token id {oov} is out of vocabulary")
        cap = min(max_tokens, room)  # equal to max_tokens unless shortens_max_tokens
        if overrides.get("max_new_tokens") is not None:
            cap = min(cap, int(overrides["max_new_tokens"]))  # vLLM's silent ceiling
        rid = f"cmpl-{uuid.uuid4().hex}-{index}"
        out.extend(PromptRequest(ids, sampling, cap, rid, rid, j) for j in range(sampling.n))
    return out


def error_reply(message: str, *, status: int, param: str | None = None) -> Reply:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}."""
    error = {"message": message, "type": ERROR_TYPES[status], "param": param, "code": status}
    return json_reply({"error": error}, status=status)


def sglang_error_reply(message: str, *, status: int) -> Reply:
    """SGLang's OpenAI-style ErrorResponse (serving_base.create_error_response): a flat
    {"object": "error", "message", "type", "param", "code"}."""
    error = {"object": "error", "message": message, "type": ERROR_TYPES[status], "param": None, "code": status}
    return json_reply(error, status=status)
