"""vLLM's /v1/completions wire protocol: request parsing and validation, as the real server does it.

From vLLM's source (vllm/entrypoints/openai/completion/protocol.py CompletionRequest,
completion/serving.py, vllm/sampling_params.py, vllm/renderers/params.py, entrypoints/utils.py):

* the body is a pydantic model: a field of the wrong type is a 400 whose message names it at
  ('body', '<field>'); unknown fields are ignored (the server logs them);
* `model`, when given, must be the served name (404 otherwise); `prompt` is token ids (ints >= 0,
  one list or a list of lists) or text; `max_tokens` defaults to 16;
* a field left out takes the server's default: --override-generation-config (and the model's
  generation config), else OpenAI's; the override's max_new_tokens caps max_tokens;
* SamplingParams: temperatures in (0, 0.01) are raised to 0.01, range errors are 400s worded
  "<field> must ...", greedy sampling allows n = 1 only;
* the prompt plus max_tokens must fit max_model_len (400), ids outside the vocabulary are a
  400 (vLLM checks them; SGLang dies on them). vLLM 0.32 (seen on the real CPU build) instead
  shortens max_tokens to the room the prompt leaves, silently (a 200 ending on `length`), and
  refuses only a prompt longer than the context, or one that fills it (max_tokens 0):
  `VllmRules.shortens_max_tokens`.

The parsed prompts reuse the SGLang-side PromptRequest/SamplingParams, so a request means the
same to the Generator whichever API carried it: the same campaign gives the same ids on both.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eagle_synth.devserver.protocol import (
    PromptRequest,
    ProtocolError,
    SamplingParams,
    _is_int,
    bad_request,
)

# The first vLLM version seen shortening max_tokens to the context's room (0.32.0, the real CPU
# build tried here); 0.11 refuses with a 400. Versions between were not tried.
SHORTENS_MAX_TOKENS_FROM = (0, 32, 0)
# vLLM's default max_tokens on /v1/completions.
DEFAULT_MAX_TOKENS = 16
# vLLM raises a temperature in (0, this) to this (SamplingParams.__post_init__).
MIN_TEMPERATURE = 0.01
# Below this temperature vLLM samples greedily.
SAMPLING_EPS = 1e-5
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
# Every field of vLLM's CompletionRequest the devserver knows; others are ignored, as vLLM does.
KNOWN_FIELDS = frozenset(
    {
        *("model", "prompt", "suffix", "user", "stop", "stop_token_ids", "logit_bias", "allowed_token_ids"),
        *("bad_words", "stream_options", "response_format", "structured_outputs", "request_id", "cache_salt"),
        *("vllm_xargs", *FLOAT_FIELDS, *INT_FIELDS, *BOOL_FIELDS),
    }
)


class FieldError(ProtocolError):
    """A 400 vLLM 0.32 words with the field it is about (`param` in its error body)."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, status=400)
        self.param = param


def _field_error(field: str, value: Any, expected: str) -> ProtocolError:
    """pydantic's RequestValidationError as vLLM answers it (400, the field at ('body', ...))."""
    return bad_request(
        f"1 validation error for CompletionRequest: [{{'type': '{expected}_type', "
        f"'loc': ('body', '{field}'), 'msg': 'Input should be a valid {expected}', "
        f"'input': {value!r}}}]"
    )


@dataclass(frozen=True, slots=True)
class VllmRules:
    """What the emulated vLLM server checks a completion request against.

    Parameters:
        max_model_len: the context length (/v1/models max_model_len).
        vocab_size: ids at or above it are refused (400).
        served_model_name: the only `model` accepted.
        overrides: --override-generation-config's sampling keys (defaults; max_new_tokens a cap).
        shortens_max_tokens: a prompt that leaves less room than max_tokens gets the room left
            (vLLM 0.32) instead of a 400 (older vLLM).
    """

    max_model_len: int
    vocab_size: int
    served_model_name: str
    overrides: dict
    shortens_max_tokens: bool = False


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A parsed /v1/completions request: one PromptRequest per choice (n per prompt, in reply
    order) and what the reply must carry."""

    prompts: list[PromptRequest]
    return_token_ids: bool
    unknown_fields: tuple[str, ...]


class ModelNotFound(ProtocolError):
    """`model` names a model the server does not serve (vLLM: 404 NotFoundError)."""


def _check_types(body: dict) -> None:
    """pydantic's type checks of CompletionRequest: the first mistyped field is the 400."""
    checks: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
        (FLOAT_FIELDS, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "number"),
        (INT_FIELDS, _is_int, "integer"),
        (BOOL_FIELDS, lambda v: isinstance(v, bool), "boolean"),
        (
            ("stop",),
            lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
            "list",
        ),
        (("stop_token_ids",), lambda v: isinstance(v, list) and all(_is_int(t) for t in v), "list"),
    )
    for fields, valid, expected in checks:
        for field in fields:
            if body.get(field) is not None and not valid(body[field]):
                raise _field_error(field, body[field], expected)


def _prompts(body: dict, tokenize) -> list[list[int]]:
    prompt = body.get("prompt")
    if prompt is None or prompt == "":
        raise bad_request("Either prompt or prompt_embeds must be provided and non-empty.")
    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt, list) and all(_is_int(i) for i in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and all(isinstance(p, list) and all(_is_int(i) for i in p) for p in prompt):
        prompts = prompt
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        if tokenize is None:
            raise bad_request("Unable to get tokenizer because `skip_tokenizer_init=True`")
        prompts = [tokenize(p) for p in prompt]
    else:
        raise _field_error("prompt", prompt, "list")
    for ids in prompts:
        negative = next((i for i in ids if i < 0), None)
        if negative is not None:
            raise bad_request(
                f"1 validation error for CompletionRequest: [{{'type': 'greater_than_equal', "
                f"'loc': ('body', 'prompt'), 'msg': 'Input should be greater than or equal to 0', "
                f"'input': {negative}}}]"
            )
    return prompts


def _verify(p: dict) -> None:
    """vLLM's SamplingParams._verify_args (400s)."""
    if p["n"] < 1:
        raise bad_request(f"n must be at least 1, got {p['n']}.")
    if not -2.0 <= p["presence_penalty"] <= 2.0:
        raise bad_request(f"presence_penalty must be in [-2, 2], got {p['presence_penalty']}.")
    if not -2.0 <= p["frequency_penalty"] <= 2.0:
        raise bad_request(f"frequency_penalty must be in [-2, 2], got {p['frequency_penalty']}.")
    if not math.isfinite(p["repetition_penalty"]) or p["repetition_penalty"] <= 0.0:
        raise bad_request(f"repetition_penalty must be greater than zero, got {p['repetition_penalty']}.")
    if not math.isfinite(p["temperature"]) or p["temperature"] < 0.0:
        raise bad_request(f"temperature must be non-negative, got {p['temperature']}.")
    if p["temperature"] > 2.0:
        raise bad_request(f"temperature must be in [0, 2], got {p['temperature']}.")
    if not 0.0 < p["top_p"] <= 1.0:
        raise bad_request(f"top_p must be in (0, 1], got {p['top_p']}.")
    if p["top_k"] < -1:
        raise bad_request(f"top_k must be 0 (disable), or at least 1, got {p['top_k']}.")
    if not 0.0 <= p["min_p"] <= 1.0:
        raise bad_request(f"min_p must be in [0, 1], got {p['min_p']}.")
    if p["max_tokens"] < 1:
        raise bad_request(f"max_tokens must be at least 1, got {p['max_tokens']}.")
    if p["min_tokens"] < 0:
        raise bad_request(f"min_tokens must be greater than or equal to 0, got {p['min_tokens']}.")
    if p["min_tokens"] > p["max_tokens"]:
        raise bad_request(
            f"min_tokens must be less than or equal to max_tokens={p['max_tokens']}, got {p['min_tokens']}."
        )
    if any(not s for s in p["stop"]):
        raise bad_request("stop cannot contain an empty string.")
    if p["temperature"] < SAMPLING_EPS and p["n"] > 1:
        raise bad_request(f"n must be 1 when using greedy sampling, got {p['n']}.")


def parse_completion_request(body: Any, *, rules: VllmRules, tokenize) -> CompletionRequest:
    """Parse and validate a /v1/completions body; raises ProtocolError as vLLM would fail."""
    if not isinstance(body, dict):
        raise bad_request("1 validation error for CompletionRequest: Input should be a valid dictionary")
    _check_types(body)
    model = body.get("model")
    if model is not None and model != rules.served_model_name:
        raise ModelNotFound(f"The model `{model}` does not exist.", status=404)
    if body.get("stream"):
        raise bad_request("The devserver does not support stream=true.")
    if body.get("echo") or body.get("use_beam_search"):
        raise bad_request("The devserver does not support echo or beam search.")
    prompts = _prompts(body, tokenize)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if max_tokens > rules.max_model_len:
        raise bad_request(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={rules.max_model_len}. "
            "Please request fewer output tokens."
        )
    # user -> server default (generation config, override) -> OpenAI default
    values = {
        key: body[key] if body.get(key) is not None else rules.overrides.get(key, default)
        for key, default in OPENAI_DEFAULTS.items()
    }
    stop = body.get("stop")
    params = {
        **values,
        "n": body.get("n") or 1,
        "presence_penalty": body.get("presence_penalty") or 0.0,
        "frequency_penalty": body.get("frequency_penalty") or 0.0,
        "max_tokens": max_tokens,
        "min_tokens": body.get("min_tokens") or 0,
        "stop": [stop] if isinstance(stop, str) else list(stop or []),
        "seed": body.get("seed"),
    }
    if 0 < params["temperature"] < MIN_TEMPERATURE:
        params["temperature"] = MIN_TEMPERATURE
    _verify(params)
    out: list[PromptRequest] = []
    for index, ids in enumerate(prompts):
        if not ids:
            raise bad_request("The decoder prompt cannot be empty")
        room = rules.max_model_len - len(ids)
        if rules.shortens_max_tokens and room < 0:
            raise FieldError(
                f"This model's maximum context length is {rules.max_model_len} tokens. However, your prompt "
                f"contains {len(ids)} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={len(ids)})",
                param="input_tokens",
            )
        if rules.shortens_max_tokens and room == 0:
            raise FieldError(
                "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", param="max_tokens"
            )
        if len(ids) + max_tokens > rules.max_model_len and not rules.shortens_max_tokens:
            raise bad_request(
                f"You passed {len(ids)} input tokens and requested {max_tokens} output tokens. However, the "
                f"model's context length is only {rules.max_model_len} tokens, resulting in a maximum input length "
                f"of {rules.max_model_len - max_tokens} tokens. Please reduce the length of the input prompt."
            )
        bad = next((i for i in ids if i >= rules.vocab_size), None)
        if bad is not None:
            raise bad_request(f"Token id {bad} is out of vocabulary")
        cap = min(max_tokens, room)  # equal to max_tokens unless shortens_max_tokens
        if rules.overrides.get("max_new_tokens") is not None:
            cap = min(cap, int(rules.overrides["max_new_tokens"]))  # vLLM's silent ceiling
        sampling = _sampling(body, params)
        rid = f"cmpl-{uuid.uuid4().hex}-{index}"
        # vLLM answers n choices per prompt, prompt-major.
        out.extend(
            PromptRequest(input_ids=ids, params=sampling, max_new_tokens=cap, rid=rid, group_rid=rid, sample_index=j)
            for j in range(params["n"])
        )
    unknown = tuple(sorted(set(body) - KNOWN_FIELDS))
    return CompletionRequest(prompts=out, return_token_ids=bool(body.get("return_token_ids")), unknown_fields=unknown)


def _sampling(body: dict, p: dict) -> SamplingParams:
    """The Generator's view of vLLM's sampling: the same fields under SGLang's names, so equal
    values give equal ids on both APIs (vLLM's top_k 0 and -1 both mean off)."""
    temperature = 0.0 if p["temperature"] < SAMPLING_EPS else p["temperature"]
    seed = p["seed"] if p["seed"] != -1 else None
    # Fields the Generator does not act on still change a sampled completion, as on the SGLang
    # side (where spaces_between_special_tokens is such a field too).
    extra = tuple(sorted((key, repr(body[key])) for key in EXTRA_FIELDS if body.get(key) is not None))
    return SamplingParams(
        max_new_tokens=p["max_tokens"],
        min_new_tokens=p["min_tokens"],
        temperature=temperature,
        top_p=p["top_p"],
        top_k=-1 if p["top_k"] in (0, -1) else p["top_k"],
        min_p=p["min_p"],
        frequency_penalty=float(p["frequency_penalty"]),
        presence_penalty=float(p["presence_penalty"]),
        repetition_penalty=float(p["repetition_penalty"]),
        stop=tuple(p["stop"]),
        stop_token_ids=tuple(body.get("stop_token_ids") or ()),
        ignore_eos=bool(body.get("ignore_eos")),
        skip_special_tokens=body.get("skip_special_tokens", True) is not False,
        no_stop_trim=bool(body.get("include_stop_str_in_output")),
        n=p["n"],
        sampling_seed=seed,
        extra=extra,
    )
