"""The emulated vLLM server (`--api vllm`): /v1/completions checked as vLLM's source does it
(entrypoints/openai/completion/protocol.py and serving.py, sampling_params.py,
renderers/params.py), and its other endpoints; docs/devserver.md lists the rules. Prompts parse
to the SGLang side's PromptRequest/SamplingParams and share the app's generator, scheduler,
faults and counters, so the same campaign gives the same ids, timing and faults on both APIs.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from eagle_synth.devserver.protocol import (
    PromptRequest,
    ProtocolError,
    Reply,
    SamplingParams,
    is_int,
    json_reply,
    refuse_first,
    version_tuple,
)

if TYPE_CHECKING:
    from eagle_synth.devserver.config import DevServerConfig

# The first vLLM version seen shortening max_tokens to the context's room (0.32.0, the real CPU
# build tried here); 0.11 refuses with a 400. Versions between were not tried.
SHORTENS_MAX_TOKENS_FROM = (0, 32, 0)
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
# pydantic's type checks: (fields, valid value, the type its message names).
TYPE_CHECKS: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    (FLOAT_FIELDS, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "number"),
    (INT_FIELDS, is_int, "integer"),
    (BOOL_FIELDS, lambda v: isinstance(v, bool), "boolean"),
    (("stop",), lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)), "list"),
    (("stop_token_ids",), lambda v: isinstance(v, list) and all(is_int(t) for t in v), "list"),
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
    if isinstance(prompt, list) and all(is_int(i) for i in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and all(isinstance(p, list) and all(is_int(i) for i in p) for p in prompt):
        prompts = prompt
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        if tokenize is None:
            raise ProtocolError("Unable to get tokenizer because `skip_tokenizer_init=True`")
        prompts = [tokenize(p) for p in prompt]
    else:
        raise _field_error("prompt", prompt, "list")
    negative = next((i for ids in prompts for i in ids if i < 0), None)
    if negative is not None:
        raise _validation_error("prompt", "greater_than_equal", "Input should be greater than or equal to 0", negative)
    return prompts


def parse_completion_request(body: Any, config: DevServerConfig, vocab_size: int, tokenize) -> list[PromptRequest]:
    """One PromptRequest per choice (n per prompt, prompt-major) of a /v1/completions body;
    raises ProtocolError as vLLM would fail. vLLM 0.32 (the real CPU build) shortens max_tokens
    to the room the prompt leaves and refuses only a prompt that fills the context; older
    vLLM refuses a prompt + max_tokens above it."""
    served, overrides = config.effective_served_model_name, config.generation_overrides
    shortens = version_tuple(config.vllm_version) >= SHORTENS_MAX_TOKENS_FROM
    if not isinstance(body, dict):
        raise ProtocolError("1 validation error for CompletionRequest: Input should be a valid dictionary")
    for fields, valid, expected in TYPE_CHECKS:
        bad = next((f for f in fields if body.get(f) is not None and not valid(body[f])), None)
        if bad is not None:
            raise _field_error(bad, body[bad], expected)
    model = body.get("model")
    if model is not None and model != served:
        raise ProtocolError(f"The model `{model}` does not exist.", status=404, param="model")
    if body.get("stream"):
        raise ProtocolError("The devserver does not support stream=true.")
    if body.get("echo") or body.get("use_beam_search"):
        raise ProtocolError("The devserver does not support echo or beam search.")
    prompts = _prompts(body, tokenize)
    max_tokens = body.get("max_tokens")
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    limit = config.effective_context_length
    if max_tokens > limit:
        raise ProtocolError(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please request fewer output tokens."
        )
    stop, seed = body.get("stop"), body.get("seed")
    # The request's sampling under SGLang's names, so equal values give equal ids on both APIs:
    # user -> server default (generation config, override) -> OpenAI default.
    p = {k: body[k] if body.get(k) is not None else overrides.get(k, v) for k, v in OPENAI_DEFAULTS.items()}
    p |= {"n": body.get("n") or 1, "max_new_tokens": max_tokens, "min_new_tokens": body.get("min_tokens") or 0}
    p |= {k: body.get(k) or 0.0 for k in ("presence_penalty", "frequency_penalty")}
    p |= {
        "stop": (stop,) if isinstance(stop, str) else tuple(stop or ()),
        "sampling_seed": None if seed == -1 else seed,
    }
    if 0 < p["temperature"] < MIN_TEMPERATURE:
        p["temperature"] = MIN_TEMPERATURE
    refuse_first(  # vLLM's SamplingParams._verify_args
        (
            (p["n"] < 1, f"n must be at least 1, got {p['n']}."),
            *(
                (not -2.0 <= p[k] <= 2.0, f"{k} must be in [-2, 2], got {p[k]}.")
                for k in ("presence_penalty", "frequency_penalty")
            ),
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
    p |= {k: float(p[k]) for k in ("presence_penalty", "frequency_penalty", "repetition_penalty")}
    # vLLM's top_k 0 and -1 both mean off; fields the Generator ignores still seed sampled output.
    p |= {"temperature": 0.0 if p["temperature"] < SAMPLING_EPS else p["temperature"]}
    p |= {"top_k": -1 if p["top_k"] in (0, -1) else p["top_k"], "ignore_eos": bool(body.get("ignore_eos"))}
    p |= {"skip_special_tokens": body.get("skip_special_tokens", True) is not False}
    p |= {"no_stop_trim": bool(body.get("include_stop_str_in_output"))}
    p |= {"stop_token_ids": tuple(body.get("stop_token_ids") or ())}
    sampling = SamplingParams(
        **p, extra=tuple(sorted((k, repr(body[k])) for k in EXTRA_FIELDS if body.get(k) is not None))
    )
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
        oov = next((i for i in ids if i >= vocab_size), None)
        if oov is not None:
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
