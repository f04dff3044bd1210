"""DevServerConfig: every knob of the devserver; `__main__` makes the typer command from each
field's metadata (help text, CLI aliases), so the flags are declared once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

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


def _opt(default, help_text: str, **extra):
    """A dataclass field carrying its CLI help (and optional `aliases`)."""
    return field(default=default, metadata={"help": help_text, **extra})


def _json_object(text: str | None) -> dict | None:
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, kw_only=True)
class DevServerConfig:
    """Launch arguments of one devserver, each a CLI flag (docs/devserver.md)."""

    tokenizer: str = field(metadata={"help": "Hugging Face tokenizer directory (required)."})
    api: str = _opt("sglang", "Server API to speak: sglang (/generate) or vllm (/v1/completions).")
    host: str = _opt("127.0.0.1", "Address to listen on.")
    # SGLang's default port, so a client configured for a real server finds the devserver too.
    port: int = _opt(30000, "Port to listen on; 0 picks a free one.")
    model_path: str | None = _opt(None, "Model path to report (default: the tokenizer dir).")
    context_length: int | None = _opt(None, f"Context length (default {DEFAULT_CONTEXT_LENGTH}; server_info: null).")
    vocab_size: int | None = _opt(None, "Vocabulary size; ids outside it kill the server.")
    slots: int = _opt(
        64,
        "Prompts generating at once (SGLang's max_running_requests); the rest queue.",
        aliases=("--max-running", "--max-running-requests"),
    )
    max_queued_requests: int | None = _opt(None, "Queued prompts beyond this get 503 'The request queue is full.'")
    token_latency: float = _opt(0.0, "Seconds per output token while holding a slot.")
    prefill_latency: float = _opt(0.0, "Seconds per prompt before its first token.")
    charge_prefill: bool = _opt(False, "Charge each prompt's uncached tokens at --prefill-throughput before decoding.")
    prefill_throughput: float = _opt(
        H100_8B_PREFILL_TOKENS_PER_S, "Prefill tokens/s of the server, shared by all prompts (with --charge-prefill)."
    )
    prefix_cache_tokens: int | None = _opt(
        None, "Token budget of the prefix cache, least recently used leaves evicted first (default: the KV cache)."
    )
    mean_output_tokens: int = _opt(200, "Mean natural output length in tokens (gamma-distributed).")
    length_median: int | None = _opt(None, "Median output length: lognormal lengths (heavy-tailed, like reasoning).")
    length_sigma: float = _opt(1.0, "Sigma of the lognormal output lengths (with --length-median).")
    startup_delay: float = _opt(0.0, "Seconds before the port is bound (weight loading).")
    warmup: float = _opt(0.0, "Seconds after binding during which health answers 503.")
    fail_rate: float = _opt(0.0, "Fraction of /generate requests answered HTTP 500.")
    drop_rate: float = _opt(0.0, "Fraction of /generate requests dropped without a response.")
    health_fail_rate: float = _opt(0.0, "Fraction of health probes answered 503 after warm-up.")
    die_after: int | None = _opt(None, "Exit right after answering the N-th /generate request.")
    prefix_bug: int = _opt(0, "Prepend K prompt-tail tokens to output_ids (old SGLang bug).")
    understate_completion: int = _opt(0, "Report completion_tokens K below the ids returned (a buggy server).")
    trickle_health: float = _opt(0.0, "Answer /health 200 with a body sent a byte every S seconds (a stuck proxy).")
    drop_stop_id: bool = _opt(False, "Leave the matched stop id out of output_ids on a stop (a buggy server).")
    reasoning_parser: str | None = _opt(None, "Reported in server_info only.")
    tool_call_parser: str | None = _opt(None, "Reported in server_info only.")
    skip_tokenizer_init: bool = _opt(False, "Omit `text` from responses; reported in server_info.")
    trust_remote_code: bool = _opt(False, "Run the tokenizer folder's own code (custom tokenizer, chat encoder).")
    # The version whose behaviour is followed: sampling key errors are 400s from 0.5.23 on, 500s before.
    sglang_version: str = _opt("0.5.23", "Version reported by server_info.")
    seed: int = _opt(0, "Seed of the fault RNG and of temperature>0 sampling.")
    access_log: bool = _opt(False, "Log every HTTP request to stderr.")
    api_key: str | None = _opt(
        None,
        "Require `Authorization: Bearer K`, as the real servers do (401 without it): SGLang on every path but "
        "/health* and /metrics*, vLLM on /v1/... only. SGLang also reports it in server_info, unredacted.",
    )
    admin_api_key: str | None = _opt(None, "Reported in server_info (unredacted, like SGLang); not checked.")
    allow_auto_truncate: bool = _opt(False, "Cut prompts and max_new_tokens that do not fit instead of answering 400.")
    preferred_sampling_params: str | None = _opt(None, "JSON sampling params merged under each request's own.")
    enable_deterministic_inference: bool = _opt(False, "Reported in server_info.")
    speculative_algorithm: str | None = _opt(None, f"{', '.join(SPECULATIVE_ALGORITHMS)}; EAGLE drafts use context.")
    speculative_num_steps: int | None = _opt(None, "Speculative draft steps.")
    speculative_eagle_topk: int | None = _opt(None, "Speculative EAGLE top-k.")
    speculative_num_draft_tokens: int | None = _opt(None, "Speculative draft tokens per step.")
    malformed_rate: float = _opt(0.0, "Fraction of /generate replies answered 200 with a malformed item.")
    # ---- vLLM (--api vllm); the default version has `return_token_ids` (0.10.2+) ----
    vllm_version: str = _opt("0.11.0", "Version reported by /version (--api vllm).")
    served_model_name: str | None = _opt(None, "Model name in /v1/models (default: the model path).")
    generation_config: str = _opt("auto", "vLLM --generation-config: auto, vllm or a folder (only reported).")
    override_generation_config: str | None = _opt(
        None, "vLLM --override-generation-config JSON: fills unsent sampling fields; max_new_tokens caps max_tokens."
    )
    dev_mode: bool = _opt(False, "vLLM VLLM_SERVER_DEV_MODE=1: serve /server_info with the configuration.")

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
