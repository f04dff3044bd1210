"""Preflight: before a worker sends a server any prompt, check it returns raw, faithful ids.

Each refused setting changes what a record would hold without the record saying so:

* `reasoning_parser`, `tool_call_parser`: parsers do not touch `/generate`'s output_ids, but
  they are a sign the operator expects parsed text somewhere;
* `skip_tokenizer_init`: the server stops on the model config's EOS, not the chat template's;
* `is_generation` false: the model cannot generate;
* `allow_auto_truncate`: a prompt or `max_new_tokens` over the context is cut silently instead
  of refused with a 400, so a record would carry prompt ids the server did not condition on;
* `preferred_sampling_params` setting a key our requests do not send: SGLang merges those
  values under every request's own, changing the sampling behind the campaign's back (keys we
  do send are overridden by ours and only noted).

Each can be accepted by name (`--allow-server-setting NAME`, passed to workers as
EAGLE_SYNTH_ALLOW_SERVER_SETTINGS); `--allow-server-parsers` accepts the three parser-related
ones. What is kept about a server (provenance) is an allow-list of its launch arguments: SGLang's
`/server_info` returns every argument, `api_key` and `admin_api_key` included, unredacted.

This module also says what SGLang counts against the context length (fits_context), from the
facts preflight captured. The checks here are SGLang's; vLLM's, and the detection of which
kind a server is, are in workers/backends/.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from eagle_synth.errors import UserError
from eagle_synth.sampling import SENT_SAMPLING_KEYS
from eagle_synth.state.node_state import ServerState
from workers.client import ServerFacts

log = logging.getLogger("eagle_synth.preflight")

# Environment variable: comma-separated setting names preflight accepts instead of refusing.
ENV_ALLOW_SETTINGS = "EAGLE_SYNTH_ALLOW_SERVER_SETTINGS"
# The settings `--allow-server-parsers` accepts (kept for compatibility with that flag).
PARSER_SETTINGS = frozenset({"reasoning_parser", "tool_call_parser", "skip_tokenizer_init"})
# server_info launch arguments kept in a campaign's provenance. An allow-list, never a
# deny-list: SGLang adds arguments every release, and some are secrets (api_key,
# admin_api_key, ssl_keyfile_password, ...). No key, token or password is ever listed here.
PROVENANCE_LAUNCH_ARGS = (
    "model_path",
    "tokenizer_path",
    "tokenizer_mode",
    "served_model_name",
    "revision",
    "load_format",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "context_length",
    "is_embedding",
    "trust_remote_code",
    "skip_tokenizer_init",
    "chat_template",
    "reasoning_parser",
    "tool_call_parser",
    "sampling_defaults",
    "allow_auto_truncate",
    "enable_deterministic_inference",
    "random_seed",
    "tp_size",
    "dp_size",
    "pp_size",
    "ep_size",
    "max_running_requests",
    "max_queued_requests",
    "max_total_tokens",
    "max_total_num_tokens",
    "max_req_input_len",
    "max_prefill_tokens",
    "chunked_prefill_size",
    "page_size",
    "schedule_policy",
    "disable_radix_cache",
    "attention_backend",
    "sampling_backend",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "weight_version",
    "version",
)
# speculative_algorithm values whose drafts SGLang stores in the request's own token slots, so
# they count against the context (TokenizerManager: SpeculativeAlgorithm.is_eagle(); NEXTN is
# an alias of EAGLE, FROZEN_KV_MTP is counted with them in recent versions).
EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP"})


class PreflightError(UserError, RuntimeError):
    """The server is configured in a way that would change the records; says how to fix it."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One refused server setting.

    Parameters:
        setting: the name `--allow-server-setting` takes.
        why: what it would do to the records, with the offending value.
        fix: how to relaunch the server without it.
    """

    setting: str
    why: str
    fix: str

    def refusal(self) -> str:
        """The line of the refusal message."""
        return f"{self.why} ({self.fix}, or accept it with --allow-server-setting {self.setting})"

    def accepted(self) -> str:
        """The line logged and kept in provenance when the setting is accepted."""
        return f"{self.setting}: {self.why}"


def preferred_sampling_params(facts: ServerFacts) -> dict | None:
    """The server's --preferred-sampling-params as a dict, None if unset.

    SGLang keeps the flag's JSON text in its arguments; raises ValueError if it is not a JSON
    object (then nobody can tell what it sets).
    """
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


def _parser(key: str, why: str, flag: str) -> Callable[[ServerFacts], Problem | None]:
    def check(facts: ServerFacts) -> Problem | None:
        value = facts.server_info.get(key)
        if not value:
            return None
        return Problem(key, f"{why} [{key}={value!r}]", f"relaunch it without {flag}")

    return check


def _not_generation(facts: ServerFacts) -> Problem | None:
    if facts.model_info.get("is_generation") is False:
        return Problem(
            "is_generation", "the model is not a generation model (is_generation=false)", "serve a generation model"
        )
    return None


def _auto_truncate(facts: ServerFacts) -> Problem | None:
    if not facts.server_info.get("allow_auto_truncate"):
        return None
    return Problem(
        "allow_auto_truncate",
        "the server cuts prompts and max_new_tokens that do not fit its context instead of "
        "refusing them, so records would hold prompt ids the model never saw [allow_auto_truncate=True]",
        "relaunch it without --allow-auto-truncate",
    )


def _preferred_params(facts: ServerFacts) -> Problem | None:
    try:
        preferred = preferred_sampling_params(facts)
    except ValueError as exc:
        return Problem(
            "preferred_sampling_params", f"the server's {exc}", "relaunch it without --preferred-sampling-params"
        )
    applied = sorted(set(preferred or ()) - SENT_SAMPLING_KEYS)
    if not applied:
        return None
    values = {key: preferred[key] for key in applied}  # type: ignore[index]
    return Problem(
        "preferred_sampling_params",
        f"the server's --preferred-sampling-params would apply {values} to every request "
        "(our requests do not send these keys, so the server's values would be used)",
        "relaunch it without these keys in --preferred-sampling-params",
    )


# Every refusable setting and its check, in the order problems are reported.
CHECKS: dict[str, Callable[[ServerFacts], Problem | None]] = {
    "reasoning_parser": _parser("reasoning_parser", "the server runs a reasoning parser", "--reasoning-parser"),
    "tool_call_parser": _parser("tool_call_parser", "the server runs a tool-call parser", "--tool-call-parser"),
    "skip_tokenizer_init": _parser(
        "skip_tokenizer_init",
        "the server skips its tokenizer: it stops on the model config's EOS, not the chat template's",
        "--skip-tokenizer-init",
    ),
    "is_generation": _not_generation,
    "allow_auto_truncate": _auto_truncate,
    "preferred_sampling_params": _preferred_params,
}
# The SGLang settings `--allow-server-setting` accepts; every kind's together are
# workers.backends.REFUSABLE_SETTINGS.
SGLANG_REFUSABLE_SETTINGS = tuple(CHECKS)
# A setting check: the Problem a server's facts show, or None.
Check = Callable[[ServerFacts], Problem | None]


def preflight_problems(facts: ServerFacts, checks: Mapping[str, Check] | None = None) -> list[Problem]:
    """Every reason this server would not give the campaign raw, template-true ids
    (`checks` None: SGLang's)."""
    checks = CHECKS if checks is None else checks
    return [problem for check in checks.values() if (problem := check(facts)) is not None]


def allowed_settings_from_env(environ: dict[str, str] | None = None) -> frozenset[str]:
    """The setting names accepted through EAGLE_SYNTH_ALLOW_SERVER_SETTINGS (comma-separated)."""
    raw = (os.environ if environ is None else environ).get(ENV_ALLOW_SETTINGS, "")
    from workers.backends import REFUSABLE_SETTINGS  # the backends build on this module

    names = frozenset(name.strip() for name in raw.split(",") if name.strip())
    unknown = sorted(names - set(REFUSABLE_SETTINGS))
    if unknown:
        log.warning(
            "%s names unknown settings %s (known: %s)", ENV_ALLOW_SETTINGS, unknown, ", ".join(REFUSABLE_SETTINGS)
        )
    return names


def check_server(
    facts: ServerFacts,
    *,
    allow_server_parsers: bool = False,
    allowed_settings: Iterable[str] | None = None,
    checks: Mapping[str, Check] | None = None,
) -> list[str]:
    """Raise PreflightError for a refused server; return the accepted problems otherwise.

    `allowed_settings` None reads EAGLE_SYNTH_ALLOW_SERVER_SETTINGS; `allow_server_parsers`
    adds the parser-related settings; `checks` are the server kind's (None: SGLang's).
    """
    allowed = set(allowed_settings_from_env() if allowed_settings is None else allowed_settings)
    if allow_server_parsers:
        allowed |= PARSER_SETTINGS
    problems = preflight_problems(facts, checks)
    refused = [p for p in problems if p.setting not in allowed]
    if refused:
        raise PreflightError(
            f"refusing server {redact_url(facts.url)}:\n  - "
            + "\n  - ".join(p.refusal() for p in refused)
            + "\nRelaunch it without these settings, or accept them by name with "
            "--allow-server-setting NAME (--allow-server-parsers accepts the parser-related ones)."
        )
    return [p.accepted() for p in problems]


@dataclass(frozen=True, slots=True)
class StartupPreflight:
    """What preflight found when a worker started, over the servers that answered then.

    Every server lands in exactly one list; one not answering yet is checked again by the
    health gate when it comes up.

    Parameters:
        refused: one refusal message (PreflightError's) per server preflight refuses.
        capacities: max_running_requests of each accepted server, None when it does not say.
        not_answering: (url, why) of each server that did not answer.
        accepted: one line per accepted server: its kind, version and how the kind was found.
    """

    refused: list[str]
    capacities: list[int | None]
    not_answering: list[tuple[str, str]]
    accepted: list[str] = field(default_factory=list)

    @property
    def all_refused(self) -> bool:
        """True when there were servers and preflight refused every one: nothing to work on."""
        return bool(self.refused) and not self.capacities and not self.not_answering

    def inflight(self) -> int:
        """In flight per server sized from the largest capacity a server reports now (a server
        still loading counts as the default until it answers)."""
        from workers.config import auto_inflight  # config imports the backends, which import us

        return max((auto_inflight(capacity) for capacity in self.capacities), default=auto_inflight(None))


# ---- what SGLang counts against the context --------------------------------------------


@dataclass(frozen=True, slots=True)
class ContextLimits:
    """What a server checks a prompt against, as preflight found it.

    Parameters:
        context_length: the model context SGLang checks against; None = unknown (no check).
        reserved_tokens: token slots speculative decoding reserves per request on top of its
            prompt (EAGLE drafts are stored in the request's own slots).
        max_req_input_len: the scheduler's cap on prompt length (smaller than the context by a
            few tokens, or by much when the KV cache is small); None = not reported.
        max_req_len: the scheduler's cap on prompt + generated tokens + 1; SGLang silently
            lowers max_new_tokens to fit it. None = context_length - 1 (its usual value).
    """

    context_length: int | None
    reserved_tokens: int = 0
    max_req_input_len: int | None = None
    max_req_len: int | None = None

    @classmethod
    def from_state(cls, state: ServerState) -> ContextLimits:
        """The limits preflight stored in a node's server state."""
        return cls(
            context_length=state.context_length,
            reserved_tokens=state.draft_reserved_tokens,
            max_req_input_len=state.max_req_input_len,
            max_req_len=_max_req_len(state.context_length, state.max_total_num_tokens),
        )


def fits_context(*, prompt_len: int, max_new_tokens: int, limits: ContextLimits) -> bool:
    """True when SGLang serves this prompt exactly as asked: no 400, no abort, no cut.

    SGLang's rules (0.5.x): the TokenizerManager refuses (400) when prompt + reserved >=
    context or prompt + reserved + max_new_tokens > context; the scheduler refuses when
    prompt >= max_req_input_len, and lowers max_new_tokens to max_req_len - prompt - 1
    without a word. The last would end some generations a token or two before the campaign's
    max_new_tokens while the record says otherwise, so it counts as not fitting too.
    """
    ctx = limits.context_length
    if not ctx:
        return True
    held = prompt_len + limits.reserved_tokens
    if held >= ctx or held + max_new_tokens > ctx:
        return False
    if limits.max_req_input_len is not None and prompt_len >= limits.max_req_input_len:
        return False
    max_req_len = limits.max_req_len if limits.max_req_len is not None else ctx - 1
    return max_new_tokens <= max_req_len - prompt_len - 1


def context_message(*, prompt_len: int, max_new_tokens: int, limits: ContextLimits) -> str:
    """Why fits_context said no, for the prompt's failure record (`prompt-too-long`)."""
    ctx = limits.context_length or 0
    reserved = (
        f" + {limits.reserved_tokens} tokens the server reserves for speculative drafts"
        if limits.reserved_tokens
        else ""
    )
    held = prompt_len + limits.reserved_tokens
    if held >= ctx or held + max_new_tokens > ctx:
        return (
            f"prompt of {prompt_len} tokens{reserved} + max_new_tokens {max_new_tokens} "
            f"exceeds the server's context length {ctx}"
        )
    if limits.max_req_input_len is not None and prompt_len >= limits.max_req_input_len:
        return (
            f"prompt of {prompt_len} tokens is not below the server's input limit "
            f"(max_req_input_len {limits.max_req_input_len}; context length {ctx})"
        )
    max_req_len = limits.max_req_len if limits.max_req_len is not None else ctx - 1
    granted = max(max_req_len - prompt_len - 1, 0)
    return (
        f"prompt of {prompt_len} tokens + max_new_tokens {max_new_tokens} is too close to the "
        f"server's context length {ctx}: it would silently lower max_new_tokens to {granted}"
    )


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        return None
    return int(value)


def _max_req_len(context_length: int | None, max_total_num_tokens: int | None) -> int | None:
    """The scheduler's max_req_len: min(context - 1, KV cache tokens - 1)."""
    if not context_length:
        return None
    if max_total_num_tokens:
        return min(context_length - 1, max_total_num_tokens - 1)
    return context_length - 1


def draft_reserved_tokens(server_info: dict) -> int:
    """Slots SGLang reserves per request for speculative drafts (compute_num_reserved_tokens):
    for EAGLE-family algorithms max(eagle_topk * num_steps, num_draft_tokens), else 0."""
    algorithm = server_info.get("speculative_algorithm")
    if not isinstance(algorithm, str) or algorithm.upper() not in EAGLE_ALGORITHMS:
        return 0
    topk = _int_or_none(server_info.get("speculative_eagle_topk")) or 0
    steps = _int_or_none(server_info.get("speculative_num_steps")) or 0
    drafts = [
        _int_or_none(server_info.get(key)) or 0
        for key in ("speculative_num_draft_tokens", "max_speculative_num_draft_tokens")
    ]
    return max(topk * steps, *drafts)


def context_limits(facts: ServerFacts) -> ContextLimits:
    """The limits fits_context needs, from what preflight learned."""
    return ContextLimits(
        context_length=facts.context_length,
        reserved_tokens=draft_reserved_tokens(facts.server_info),
        max_req_input_len=_int_or_none(facts.server_info.get("max_req_input_len")),
        max_req_len=_max_req_len(facts.context_length, facts.max_total_num_tokens),
    )


# ---- seeds ---------------------------------------------------------------------------------


def deterministic_inference(facts: ServerFacts) -> bool | None:
    """True when the server honours `sampling_seed` (--enable-deterministic-inference); False
    when it ignores it; None when it predates the flag (and `sampling_seed` with it)."""
    if "enable_deterministic_inference" not in facts.server_info:
        return None
    return bool(facts.server_info["enable_deterministic_inference"])


# ---- what the node state and the campaign keep ----------------------------------------------


def apply_facts(state: ServerState, facts: ServerFacts, *, accepted: list[str]) -> None:
    """Store in a node's server state what batches need from preflight (limits, capacity,
    seed support) and the provenance the campaign will keep."""
    limits = context_limits(facts)
    deterministic = deterministic_inference(facts)
    state.context_length = facts.context_length
    state.draft_reserved_tokens = limits.reserved_tokens
    state.max_req_input_len = limits.max_req_input_len
    state.max_running_requests = facts.max_running_requests
    state.max_total_num_tokens = facts.max_total_num_tokens
    state.deterministic_inference = deterministic
    state.sampling_seed_supported = deterministic is not None
    state.backend = facts.backend
    state.provenance = provenance(facts, accepted=accepted)


def redact_url(url: str) -> str:
    """The URL without a password (`http://user:secret@host` -> `http://user:***@host`)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def provenance(facts: ServerFacts, *, accepted: list[str] | None = None) -> dict:
    """What a campaign keeps about the server that generated its records: an allow-list of
    its launch arguments (never a secret), its version and model, what it does to sampling
    and context, and the refused settings accepted by override."""
    launch_args = {
        key: facts.server_info[key]
        for key in PROVENANCE_LAUNCH_ARGS
        if key in facts.server_info
        and (isinstance(facts.server_info[key], (str, int, float, bool)) or facts.server_info[key] is None)
    }
    try:
        preferred = preferred_sampling_params(facts)
    except ValueError:
        preferred = {"unreadable": str(facts.server_info.get("preferred_sampling_params"))[:200]}
    return {
        "url": redact_url(facts.url),
        "backend": facts.backend,
        "version": facts.version,
        "model_path": facts.server_info.get("model_path") or facts.model_info.get("model_path"),
        "weight_version": facts.model_info.get("weight_version"),
        "context_length": facts.context_length,
        "draft_reserved_tokens": draft_reserved_tokens(facts.server_info),
        "deterministic_inference": deterministic_inference(facts),
        # The server's defaults as configured; every key we send overrides them, and preflight
        # refused (or was told to accept) any other.
        "preferred_sampling_params": preferred,
        "preferred_sampling_params_applied": sorted(set(preferred or ()) - SENT_SAMPLING_KEYS),
        "accepted_despite": list(accepted or ()),
        "launch_args": launch_args,
    }
