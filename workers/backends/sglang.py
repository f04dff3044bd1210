"""SGLang: the native `/generate` endpoint with `input_ids`, as docs/workers.md describes.

The sampling is sent as it is (SGLang's own names) once every key is known (an unknown key is an
HTTP 500 on older servers); replies are checked by workers/replies.py `parse_generate_item`.
Preflight refuses the settings that change a record without it saying so (docs/workers.md
"Preflight"); `context_problem` says what SGLang counts against the context length.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from eagle_synth.errors import UntranslatableSampling
from eagle_synth.records import Record
from eagle_synth.sampling import SENT_SAMPLING_KEYS, SGLANG_SAMPLING_KEYS
from eagle_synth.state.node_state import ServerState
from workers.backends.base import SGLANG, BaseBackend, Check, Problem, provenance_of
from workers.replies import Sent, parse_generate_item
from workers.servers.client import ServerClient, ServerFacts, positive_int

# server_info launch arguments kept in a campaign's provenance. An allow-list, never a
# deny-list: SGLang adds arguments every release, and some are secrets (api_key,
# admin_api_key, ssl_keyfile_password, ...). No key, token or password is ever listed here.
PROVENANCE_LAUNCH_ARGS = (
    # the model and how it is loaded
    *("model_path", "tokenizer_path", "tokenizer_mode", "served_model_name", "revision", "load_format"),
    *("dtype", "quantization", "kv_cache_dtype", "context_length", "is_embedding", "trust_remote_code"),
    # what shapes the ids
    *("skip_tokenizer_init", "chat_template", "reasoning_parser", "tool_call_parser", "sampling_defaults"),
    *("allow_auto_truncate", "enable_deterministic_inference", "random_seed"),
    # parallelism and the scheduler
    *("tp_size", "dp_size", "pp_size", "ep_size", "max_running_requests", "max_queued_requests"),
    *("max_total_tokens", "max_total_num_tokens", "max_req_input_len", "max_prefill_tokens"),
    *("chunked_prefill_size", "page_size", "schedule_policy", "disable_radix_cache", "attention_backend"),
    *("sampling_backend",),
    # speculative decoding
    *("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk"),
    *("speculative_num_draft_tokens", "weight_version", "version"),
)
# speculative_algorithm values whose drafts SGLang stores in the request's own token slots, so
# they count against the context (TokenizerManager: SpeculativeAlgorithm.is_eagle(); NEXTN is
# an alias of EAGLE, FROZEN_KV_MTP is counted with them in recent versions).
EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP"})


def preferred_sampling_params(facts: ServerFacts) -> dict | None:
    """The server's --preferred-sampling-params (JSON text) as a dict, None if unset; ValueError
    if it is not a JSON object."""
    raw = facts.server_info.get("preferred_sampling_params")
    if raw is None:
        raw = facts.model_info.get("preferred_sampling_params")
    if raw in (None, "", {}):
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"preferred_sampling_params is not JSON: {raw[:200]!r}") from exc
    if not isinstance(raw, dict):
        # A ValueError like the unparsable case: callers treat both as "cannot tell".
        raise ValueError(f"preferred_sampling_params is not a JSON object: {raw!r}")  # noqa: TRY004
    return raw or None


def _flag(key: str, why: str) -> Check:
    """Refuse a server whose server_info sets the launch flag `key` to a true value."""
    flag = "--" + key.replace("_", "-")
    return lambda facts: (
        Problem(key, f"{why} [{key}={value!r}]", f"relaunch it without {flag}")
        if (value := facts.server_info.get(key))
        else None
    )


def _preferred_params(facts: ServerFacts) -> Problem | None:
    fix = "relaunch it without --preferred-sampling-params"
    try:
        preferred = preferred_sampling_params(facts) or {}
    except ValueError as exc:
        return Problem("preferred_sampling_params", f"the server's {exc}", fix)
    values = {key: preferred[key] for key in sorted(set(preferred) - SENT_SAMPLING_KEYS)}
    if not values:
        return None
    return Problem(
        "preferred_sampling_params",
        f"the server's --preferred-sampling-params would apply {values} to every request "
        "(our requests do not send these keys, so the server's values would be used)",
        "relaunch it without these keys in --preferred-sampling-params",
    )


# Every refusable setting and its check, in the order problems are reported.
CHECKS: dict[str, Check] = {
    "reasoning_parser": _flag("reasoning_parser", "the server runs a reasoning parser"),
    "tool_call_parser": _flag("tool_call_parser", "the server runs a tool-call parser"),
    "skip_tokenizer_init": _flag(
        "skip_tokenizer_init",
        "the server skips its tokenizer: it stops on the model config's EOS, not the chat template's",
    ),
    "is_generation": lambda facts: (
        Problem(
            "is_generation", "the model is not a generation model (is_generation=false)", "serve a generation model"
        )
        if facts.model_info.get("is_generation") is False
        else None
    ),
    "allow_auto_truncate": _flag(
        "allow_auto_truncate",
        "the server cuts prompts and max_new_tokens that do not fit its context instead of "
        "refusing them, so records would hold prompt ids the model never saw",
    ),
    "preferred_sampling_params": _preferred_params,
}


def draft_reserved_tokens(server_info: dict) -> int:
    """Slots SGLang reserves per request for EAGLE-family drafts (compute_num_reserved_tokens)."""
    algorithm = server_info.get("speculative_algorithm")
    if not isinstance(algorithm, str) or algorithm.upper() not in EAGLE_ALGORITHMS:
        return 0
    keys = ("speculative_eagle_topk", "speculative_num_steps", "speculative_num_draft_tokens")
    values = (positive_int(server_info.get(key)) or 0 for key in (*keys, "max_speculative_num_draft_tokens"))
    topk, steps, *drafts = values
    return max(topk * steps, *drafts)


def provenance(facts: ServerFacts, *, accepted: list[str] | None = None) -> dict:
    """An SGLang server's provenance (see provenance_of): its model, what it does
    to sampling and context, and its allow-listed launch arguments."""
    info = facts.server_info
    try:
        preferred = preferred_sampling_params(facts)
    except ValueError:
        preferred = {"unreadable": str(info.get("preferred_sampling_params"))[:200]}
    details = {
        "model_path": info.get("model_path") or facts.model_info.get("model_path"),
        "weight_version": facts.model_info.get("weight_version"),
        "context_length": facts.context_length,
        "draft_reserved_tokens": draft_reserved_tokens(info),
        # Whether the server honours `sampling_seed`; None when it predates the flag.
        "deterministic_inference": (
            bool(info["enable_deterministic_inference"]) if "enable_deterministic_inference" in info else None
        ),
        # The server's defaults as configured; every key we send overrides them, and preflight
        # refused (or was told to accept) any other.
        "preferred_sampling_params": preferred,
        "preferred_sampling_params_applied": sorted(set(preferred or ()) - SENT_SAMPLING_KEYS),
    }
    scalars = (str, int, float, bool, type(None))
    launch_args = {key: info[key] for key in PROVENANCE_LAUNCH_ARGS if isinstance(info.get(key, ()), scalars)}
    return provenance_of(SGLANG, facts, details, launch_args, accepted)


class SGLangBackend(BaseBackend):
    """Requests, replies, context rule and preflight of an SGLang server (see workers.backends.Backend)."""

    name = SGLANG
    path = "/generate"
    checks = CHECKS
    provenance = staticmethod(provenance)

    def translate_sampling(self, sampling: Mapping[str, Any]) -> dict:
        """The `sampling_params` field: SGLang's own names, sent as they are once every key is
        known (checked on every request: the subset test allocates nothing when all are)."""
        if not SGLANG_SAMPLING_KEYS.issuperset(sampling):
            unknown = sorted(set(sampling) - SGLANG_SAMPLING_KEYS)
            raise UntranslatableSampling(f"sampling keys SGLang does not accept: {unknown}")
        return dict(sampling)

    def request(self, ids: list[int], sampling: Mapping[str, Any]) -> tuple[str, dict]:
        return self.path, {"input_ids": ids, "sampling_params": self.translate_sampling(sampling)}

    def parse(self, item: object, *, vocab_size: int, sent: Sent) -> Record:
        return parse_generate_item(item, vocab_size=vocab_size, sent=sent)

    def context_problem(self, *, prompt_len: int, max_new_tokens: int, state: ServerState) -> str | None:
        """None when SGLang serves this prompt exactly as asked, else why not (`prompt-too-long`),
        against what preflight found (no context_length: unknown, no check). SGLang 0.5.x refuses
        (400) when prompt + the slots speculative drafts reserve >= context or + max_new_tokens >
        context, refuses when prompt >= max_req_input_len, and silently lowers max_new_tokens to
        max_req_len - prompt - 1: the record would then claim a max_new_tokens not used, so that
        does not fit either."""
        ctx = state.context_length
        drafts = state.draft_reserved_tokens
        if not ctx:
            return None
        held = prompt_len + drafts
        if held >= ctx or held + max_new_tokens > ctx:
            reserved = f" + {drafts} tokens the server reserves for speculative drafts" if drafts else ""
            return (
                f"prompt of {prompt_len} tokens{reserved} + max_new_tokens {max_new_tokens} "
                f"exceeds the server's context length {ctx}"
            )
        if state.max_req_input_len is not None and prompt_len >= state.max_req_input_len:
            return (
                f"prompt of {prompt_len} tokens is not below the server's input limit "
                f"(max_req_input_len {state.max_req_input_len}; context length {ctx})"
            )
        # The scheduler's max_req_len: min(context - 1, KV cache tokens - 1).
        granted = min(ctx, state.max_total_num_tokens or ctx) - 1 - prompt_len - 1
        if max_new_tokens <= granted:
            return None
        return (
            f"prompt of {prompt_len} tokens + max_new_tokens {max_new_tokens} is too close to the "
            f"server's context length {ctx}: it would silently lower max_new_tokens to {max(granted, 0)}"
        )

    facts = staticmethod(ServerClient.facts)
