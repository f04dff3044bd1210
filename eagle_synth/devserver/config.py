"""DevServerConfig: every knob of the devserver; the `Flag` in each field's type declares its
flag (help text, CLI aliases), from which `__main__` makes the command (eagle_synth/cli/flags.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from eagle_synth.flags import Flag

# Context length when --context-length is not given (real SGLang reads it from the model).
DEFAULT_CONTEXT_LENGTH = 32768
APIS = ("sglang", "vllm")
# Keys of vLLM's --override-generation-config the devserver acts on (vLLM's
# ModelConfig.get_diff_sampling_param): defaults for unsent fields, max_new_tokens a cap.
VLLM_GENERATION_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
# Knobs that exist only on one kind of server: field -> (its default, the API it belongs to).
API_ONLY_KNOBS = {
    "max_queued_requests": (None, "sglang"),
    "preferred_sampling_params": (None, "sglang"),
    "speculative_algorithm": (None, "sglang"),
    "tool_call_parser": (None, "sglang"),
    "admin_api_key": (None, "sglang"),
    "prefix_bug": (0, "sglang"),
    "understate_completion": (0, "sglang"),
    "drop_stop_id": (False, "sglang"),
    "allow_auto_truncate": (False, "sglang"),
    "enable_deterministic_inference": (False, "sglang"),
    "override_generation_config": (None, "vllm"),
    "generation_config": ("auto", "vllm"),
    "dev_mode": (False, "vllm"),
}
# SGLang's scheduler caps inputs at its max_req_len minus this (Scheduler: max_req_input_len).
INPUT_CAP_MARGIN = 5
# The largest --prefix-bug emulated: the real bug leaked at most 5 tokens, with headroom.
MAX_PREFIX_BUG_TOKENS = 64
# --speculative-algorithm values (SGLang's; NEXTN is an alias of EAGLE), and those whose drafts
# SGLang stores in the request's own token slots (counted in the context).
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
EAGLE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
# Prefill tokens per second of one H100 serving an 8B model, the --prefill-throughput default:
# vLLM 0.4.2's release benchmark (Llama 3 8B, H100, 1000 input + 100 output tokens) ran 20.72
# requests/s, i.e. ~20,700 input tokens/s with decoding in the same time, so a lower bound of
# prefill alone, rounded (docs/benchmarks.md "Prefill cost").
H100_8B_PREFILL_TOKENS_PER_S = 20_000.0
# Allowed ranges of numeric knobs (unset, None, passes): field -> (low, high or None).
RANGES = {
    "port": (0, 65535),
    "context_length": (2, None),
    "prefix_bug": (0, MAX_PREFIX_BUG_TOKENS),
    "vocab_size": (1, None),
    "slots": (1, None),
    "mean_output_tokens": (1, None),
    "length_median": (1, None),
    "die_after": (1, None),
    "speculative_num_steps": (1, None),
    "speculative_eagle_topk": (1, None),
    "speculative_num_draft_tokens": (1, None),
    "understate_completion": (0, None),
    "max_queued_requests": (0, None),
    "token_latency": (0, None),
    "prefill_latency": (0, None),
    "startup_delay": (0, None),
    "warmup": (0, None),
    "length_sigma": (0, 4),
    "prefill_throughput": (1, None),
    "prefix_cache_tokens": (0, None),
    "fail_rate": (0, 1),
    "drop_rate": (0, 1),
    "health_fail_rate": (0, 1),
    "malformed_rate": (0, 1),
}


def _json_object(text: str | None) -> dict | None:
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, kw_only=True)
class DevServerConfig:
    """Launch arguments of one devserver, each a CLI flag (docs/devserver.md)."""

    tokenizer: Annotated[str, Flag("Hugging Face tokenizer directory (required).")]
    api: Annotated[str, Flag("Server API to speak: sglang (/generate) or vllm (/v1/completions).")] = "sglang"
    host: Annotated[str, Flag("Address to listen on.")] = "127.0.0.1"
    # SGLang's default port, so a client configured for a real server finds the devserver too.
    port: Annotated[int, Flag("Port to listen on; 0 picks a free one.")] = 30000
    model_path: Annotated[str | None, Flag("Model path to report (default: the tokenizer dir).")] = None
    context_length: Annotated[
        int | None, Flag(f"Context length (default {DEFAULT_CONTEXT_LENGTH}; server_info: null).")
    ] = None
    vocab_size: Annotated[int | None, Flag("Vocabulary size; ids outside it kill the server.")] = None
    slots: Annotated[
        int,
        Flag(
            "Prompts generating at once (SGLang's max_running_requests); the rest queue.",
            names=("--slots", "--max-running", "--max-running-requests"),
        ),
    ] = 64
    max_queued_requests: Annotated[
        int | None, Flag("Queued prompts beyond this get 503 'The request queue is full.'")
    ] = None
    token_latency: Annotated[float, Flag("Seconds per output token while holding a slot.")] = 0.0
    prefill_latency: Annotated[float, Flag("Seconds per prompt before its first token.")] = 0.0
    charge_prefill: Annotated[
        bool, Flag("Charge each prompt's uncached tokens at --prefill-throughput before decoding.", negatable=False)
    ] = False
    prefill_throughput: Annotated[
        float, Flag("Prefill tokens/s of the server, shared by all prompts (with --charge-prefill).")
    ] = H100_8B_PREFILL_TOKENS_PER_S
    prefix_cache_tokens: Annotated[
        int | None,
        Flag("Token budget of the prefix cache, least recently used leaves evicted first (default: the KV cache)."),
    ] = None
    mean_output_tokens: Annotated[int, Flag("Mean natural output length in tokens (gamma-distributed).")] = 200
    length_median: Annotated[
        int | None, Flag("Median output length: lognormal lengths (heavy-tailed, like reasoning).")
    ] = None
    length_sigma: Annotated[float, Flag("Sigma of the lognormal output lengths (with --length-median).")] = 1.0
    startup_delay: Annotated[float, Flag("Seconds before the port is bound (weight loading).")] = 0.0
    warmup: Annotated[float, Flag("Seconds after binding during which health answers 503.")] = 0.0
    fail_rate: Annotated[float, Flag("Fraction of /generate requests answered HTTP 500.")] = 0.0
    drop_rate: Annotated[float, Flag("Fraction of /generate requests dropped without a response.")] = 0.0
    health_fail_rate: Annotated[float, Flag("Fraction of health probes answered 503 after warm-up.")] = 0.0
    die_after: Annotated[int | None, Flag("Exit right after answering the N-th /generate request.")] = None
    prefix_bug: Annotated[int, Flag("Prepend K prompt-tail tokens to output_ids (old SGLang bug).")] = 0
    understate_completion: Annotated[
        int, Flag("Report completion_tokens K below the ids returned (a buggy server).")
    ] = 0
    trickle_health: Annotated[
        float, Flag("Answer /health 200 with a body sent a byte every S seconds (a stuck proxy).")
    ] = 0.0
    drop_stop_id: Annotated[
        bool, Flag("Leave the matched stop id out of output_ids on a stop (a buggy server).", negatable=False)
    ] = False
    reasoning_parser: Annotated[str | None, Flag("Reported in server_info only.")] = None
    tool_call_parser: Annotated[str | None, Flag("Reported in server_info only.")] = None
    skip_tokenizer_init: Annotated[
        bool, Flag("Omit `text` from responses; reported in server_info.", negatable=False)
    ] = False
    trust_remote_code: Annotated[
        bool, Flag("Run the tokenizer folder's own code (custom tokenizer, chat encoder).", negatable=False)
    ] = False
    # The version whose behaviour is followed: sampling key errors are 400s from 0.5.23 on, 500s before.
    sglang_version: Annotated[str, Flag("Version reported by server_info.")] = "0.5.23"
    seed: Annotated[int, Flag("Seed of the fault RNG and of temperature>0 sampling.")] = 0
    access_log: Annotated[bool, Flag("Log every HTTP request to stderr.", negatable=False)] = False
    api_key: Annotated[
        str | None,
        Flag(
            "Require `Authorization: Bearer K`, as the real servers do (401 without it): SGLang on every path but "
            "/health* and /metrics*, vLLM on /v1/... only. SGLang also reports it in server_info, unredacted."
        ),
    ] = None
    admin_api_key: Annotated[str | None, Flag("Reported in server_info (unredacted, like SGLang); not checked.")] = None
    allow_auto_truncate: Annotated[
        bool, Flag("Cut prompts and max_new_tokens that do not fit instead of answering 400.", negatable=False)
    ] = False
    preferred_sampling_params: Annotated[str | None, Flag("JSON sampling params merged under each request's own.")] = (
        None
    )
    enable_deterministic_inference: Annotated[bool, Flag("Reported in server_info.", negatable=False)] = False
    speculative_algorithm: Annotated[
        str | None, Flag(f"{', '.join(SPECULATIVE_ALGORITHMS)}; EAGLE drafts use context.")
    ] = None
    speculative_num_steps: Annotated[int | None, Flag("Speculative draft steps.")] = None
    speculative_eagle_topk: Annotated[int | None, Flag("Speculative EAGLE top-k.")] = None
    speculative_num_draft_tokens: Annotated[int | None, Flag("Speculative draft tokens per step.")] = None
    malformed_rate: Annotated[float, Flag("Fraction of /generate replies answered 200 with a malformed item.")] = 0.0
    # ---- vLLM (--api vllm); the default version has `return_token_ids` (0.10.2+) ----
    vllm_version: Annotated[str, Flag("Version reported by /version (--api vllm).")] = "0.11.0"
    served_model_name: Annotated[str | None, Flag("Model name in /v1/models (default: the model path).")] = None
    generation_config: Annotated[str, Flag("vLLM --generation-config: auto, vllm or a folder (only reported).")] = (
        "auto"
    )
    override_generation_config: Annotated[
        str | None,
        Flag("vLLM --override-generation-config JSON: fills unsent sampling fields; max_new_tokens caps max_tokens."),
    ] = None
    dev_mode: Annotated[
        bool, Flag("vLLM VLLM_SERVER_DEV_MODE=1: serve /server_info with the configuration.", negatable=False)
    ] = False

    def __post_init__(self) -> None:
        """Refuses every out-of-range knob at once, as `--flag value: reason`."""
        out = [] if self.tokenizer else ["--tokenizer: required"]

        def bad(name: str, reason: str) -> None:
            out.append(f"--{name.replace('_', '-')} {getattr(self, name)!r}: {reason}")

        if self.api not in APIS:
            bad("api", f"must be one of {', '.join(APIS)}")
        for name, (unset, api) in API_ONLY_KNOBS.items():
            if self.api != api and getattr(self, name) != unset:
                bad(name, f"only with --api {api} (the other kind of server has no such setting)")
        for name in ("override_generation_config", "preferred_sampling_params"):
            if getattr(self, name) is not None and _json_object(getattr(self, name)) is None:
                bad(name, "must be a JSON object")
        for name, (low, high) in RANGES.items():
            value = getattr(self, name)
            if value is not None and not (low <= value and (high is None or value <= high)):
                bad(name, f"must be at least {low}" if high is None else f"must be in [{low}, {high}]")
        if self.fail_rate + self.drop_rate + self.malformed_rate > 1.0:
            out.append("--fail-rate + --drop-rate + --malformed-rate: must not exceed 1")
        if self.speculative_algorithm is not None and self.speculative_algorithm.upper() not in SPECULATIVE_ALGORITHMS:
            bad("speculative_algorithm", f"must be one of {', '.join(SPECULATIVE_ALGORITHMS)}")
        if self.draft_reserved_tokens >= self.effective_context_length:
            out.append("speculative settings: the reserved draft tokens must be below the context length")
        if out:
            raise ValueError("invalid devserver config: " + "; ".join(out))

    @property
    def generation_overrides(self) -> dict:
        raw = _json_object(self.override_generation_config) or {}
        return {key: raw[key] for key in VLLM_GENERATION_KEYS if raw.get(key) is not None}

    @property
    def preferred_params(self) -> dict | None:
        return _json_object(self.preferred_sampling_params) or None

    @property
    def draft_reserved_tokens(self) -> int:
        """Token slots SGLang reserves per request for EAGLE drafts (0 for other algorithms)."""
        if (self.speculative_algorithm or "").upper() not in EAGLE_ALGORITHMS:
            return 0
        steps = self.speculative_num_steps or 0
        topk = self.speculative_eagle_topk or 0
        return max(topk * steps, self.speculative_num_draft_tokens or 0)

    @property
    def effective_context_length(self) -> int:
        return self.context_length if self.context_length is not None else DEFAULT_CONTEXT_LENGTH

    @property
    def max_req_len(self) -> int:
        """SGLang's prompt + generated + 1; the KV cache (a slot per request at full context) never cuts it."""
        return self.effective_context_length - 1

    @property
    def max_req_input_len(self) -> int:
        return self.max_req_len - INPUT_CAP_MARGIN

    @property
    def effective_prefix_cache_tokens(self) -> int:
        """The prefix cache's budget: the KV cache server_info reports, unless given."""
        if self.prefix_cache_tokens is not None:
            return self.prefix_cache_tokens
        return self.slots * self.effective_context_length

    @property
    def effective_model_path(self) -> str:
        return self.model_path if self.model_path is not None else str(Path(self.tokenizer))

    @property
    def effective_served_model_name(self) -> str:
        return self.served_model_name or self.effective_model_path
