"""vLLM: `POST /v1/completions` with the prompt as token ids and `return_token_ids: true`.

docs/workers.md "vLLM servers" says what is sent, checked and refused, as read in vLLM's source:
every sampling value is sent (vLLM fills a field left out from the server's generation config and
ignores unknown ones); launch arguments are not served, so preflight also sends a probe request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eagle_synth.errors import (
    BadResponse,
    PreflightError,
    PromptMismatch,
    ReplyAborted,
    SamplingOverridden,
    TransientError,
    UntranslatableSampling,
)
from eagle_synth.payload import PromptItem
from eagle_synth.records import Record
from eagle_synth.sampling import ServerSampling, version_tuple
from eagle_synth.state.node_state import ServerState
from workers.backends.base import VLLM, BaseBackend, Check, Problem, provenance_of, redact_url
from workers.replies import FINISH_TYPES, Sent, checked_ids, excerpt, is_token_int, kind_of
from workers.servers.client import ServerClient, ServerFacts, first_model, positive_int
from workers.servers.transport import error_for_status, error_message

log = logging.getLogger("eagle_synth.preflight")

# Each campaign sampling key (SGLang's names) with what leaving it out means (SGLang's default),
# sent explicitly so vLLM's generation-config defaults never fill the gap; the seed has no
# default (none sent). RENAMED: the vLLM completion field of a key named otherwise there
# (no_stop_trim and include_stop_str_in_output only decide whether `text` keeps a matched stop).
SGLANG_MAX_NEW_TOKENS = 128
SGLANG_DEFAULTS: dict[str, object] = {
    "max_new_tokens": SGLANG_MAX_NEW_TOKENS,
    "min_new_tokens": 0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "stop": [],
    "stop_token_ids": [],
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "n": 1,
}
RENAMED = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "no_stop_trim": "include_stop_str_in_output",
}
KNOWN_KEYS = frozenset({*SGLANG_DEFAULTS, "sampling_seed"})
# vLLM raises temperatures in (0, MIN) to MIN (SamplingParams.__post_init__) and refuses those
# above MAX (SamplingParams._verify_args).
VLLM_MIN_TEMPERATURE = 0.01
VLLM_MAX_TEMPERATURE = 2.0
# Sent with every request: the ids back, one whole reply, the prompt as given (no BOS added).
REQUEST_FLAGS = {"return_token_ids": True, "stream": False, "echo": False, "add_special_tokens": False}
# The preflight probe: a few ids every vocabulary has, the ids it must generate, the bound its
# reply's ids are checked against (any int is a possible id of an unknown vocabulary), and the
# seconds it may take (a cold server compiles on its first requests).
PROBE_PROMPT = (0, 1, 2)
PROBE_TOKENS = 4
PROBE_VOCAB_BOUND = 2**31
PROBE_TIMEOUT = 120.0
# vLLM's dev-mode configuration endpoint (VLLM_SERVER_DEV_MODE=1), as JSON.
DEV_CONFIG_PATH = "/server_info?config_format=json"
# First vLLM version with `return_token_ids` on /v1/completions (PR 22587).
TOKEN_IDS_VERSION = "0.10.2"
# generation_config values that read no sampling defaults from a folder.
DEFAULT_GENERATION_CONFIGS = frozenset({None, "", "auto", "vllm"})
# Dev-mode configuration entries (section.key) kept in provenance: an allow-list, so a secret a
# later version adds is never copied.
PROVENANCE_CONFIG = tuple(
    f"{section}.{key}"
    for section, keys in (
        ("model_config", ("model", "served_model_name", "tokenizer", "revision", "dtype", "max_model_len")),
        ("model_config", ("quantization", "seed", "generation_config", "override_generation_config")),
        ("model_config", ("skip_tokenizer_init", "logits_processors", "runner_type")),
        ("cache_config", ("kv_cache_dtype", "enable_prefix_caching")),
        ("parallel_config", ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")),
        ("scheduler_config", ("max_num_seqs", "max_num_batched_tokens")),
        ("speculative_config", ("method", "num_speculative_tokens")),
        ("structured_outputs_config", ("reasoning_parser",)),
    )
    for key in keys
)


def parse_completion(item: object, *, vocab_size: int, sent: Sent) -> Record:
    """Check one /v1/completions reply (one prompt, n=1) against what was `sent` (raises as
    Backend.parse does): its record. finish_matched is vLLM's stop_reason, or for the model's EOS
    (stop_reason null) the last output id, which is that EOS: as SGLang reports it."""
    prompt_ids = sent.prompt.ids
    max_tokens = sent.sampling.max_new_tokens or SGLANG_MAX_NEW_TOKENS
    if not isinstance(item, dict):
        raise BadResponse(f"the reply is {kind_of(item)}, not an object: {excerpt(item)}")
    choices = item.get("choices")
    if not isinstance(choices, list) or len(choices) != 1:
        raise BadResponse(f"choices is not a list of one choice: {excerpt(choices)}")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise BadResponse(f"choices[0] is {kind_of(choice)}, not an object: {excerpt(choice)}")
    finish = choice.get("finish_reason")
    if finish is None:
        raise BadResponse("choices[0] has no finish_reason")
    if finish not in FINISH_TYPES:  # "error" becomes an HTTP 500 before any reply
        raise BadResponse(f"finish_reason {excerpt(finish)} is none of {sorted(FINISH_TYPES)}")
    if finish == "abort":
        raise ReplyAborted("the server aborted this prompt")
    if choice.get("token_ids") is None:
        raise BadResponse(f"choices[0] has no token_ids (vLLM before {TOKEN_IDS_VERSION} ignores return_token_ids)")
    output_ids = checked_ids(choice["token_ids"], field="token_ids", vocab_size=vocab_size)
    seen = choice.get("prompt_token_ids")
    if seen is None:
        raise BadResponse("choices[0] has no prompt_token_ids: what the server generated from cannot be checked")
    if seen != prompt_ids:
        if not isinstance(seen, list):
            raise BadResponse(f"prompt_token_ids is {kind_of(seen)}, not a list: {excerpt(seen)}")
        raise PromptMismatch(
            f"the server generated from other prompt ids than those sent: {prompt_difference(prompt_ids, seen)}"
        )
    usage = item["usage"] if isinstance(item.get("usage"), dict) else {}
    completion = usage.get("completion_tokens")
    if completion is not None and completion != len(output_ids):
        raise BadResponse(f"token_ids has {len(output_ids)} ids but usage.completion_tokens says {excerpt(completion)}")
    if len(output_ids) > max_tokens:
        raise BadResponse(f"token_ids has {len(output_ids)} ids, more than the max_tokens {max_tokens} sent")
    stop_reason = choice.get("stop_reason")
    if stop_reason is not None and not is_token_int(stop_reason) and not isinstance(stop_reason, str):
        raise BadResponse(f"stop_reason is neither a token id nor a stop string: {excerpt(stop_reason)}")
    matched = stop_reason if stop_reason is not None else (output_ids[-1] if output_ids else None)
    if finish == "length" and len(output_ids) < max_tokens:
        raise SamplingOverridden(
            f"the server ended a generation on length after {len(output_ids)} tokens although max_tokens "
            f"{max_tokens} was sent: it caps max_tokens (--override-generation-config max_new_tokens, or a "
            "--generation-config folder setting max_new_tokens); relaunch vLLM without that cap"
        )
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return sent.record(
        output_ids=output_ids,
        finish_reason=finish,
        finish_matched=None if finish == "length" else matched,
        completion_tokens=len(output_ids),
        cached_tokens=cached if isinstance(cached, int) and is_token_int(cached) and cached >= 0 else 0,
    )


def prompt_difference(sent: list[int], seen: list) -> str:
    """How the prompt the server reports differs from the one sent, in words."""
    extra = len(seen) - len(sent)
    if extra > 0 and seen[extra:] == sent:
        return f"it put {extra} ids in front of the {len(sent)} sent ({excerpt(seen[:extra])}: a BOS token?)"
    if extra < 0 and sent[-extra:] == seen:
        return f"it dropped the first {-extra} of the {len(sent)} ids sent (truncate_prompt_tokens?)"
    position = next((i for i, (a, b) in enumerate(zip(sent, seen)) if a != b), min(len(sent), len(seen)))
    return (
        f"{len(sent)} ids sent, {len(seen)} reported, first difference at position {position} "
        f"(sent {excerpt(sent[position : position + 5])}, reported {excerpt(seen[position : position + 5])})"
    )


def _config(config: dict, entry: str) -> object:
    """The dev-mode configuration's `section.key` entry, None when it is not there."""
    section, key = entry.split(".")
    part = config.get(section)
    return part.get(key) if isinstance(part, dict) else None


def _probe(client: ServerClient, *, model: str | None, version: str | None) -> dict:
    """Send the probe request: {"status": 200, "reply": its JSON}. Refuses a server whose answer
    shows it cannot give records (no setting to accept: every prompt would fail); a malformed
    reply proves nothing: accepted with a warning. Transport failures, 429 and 5xx raise (the
    gate looks again later)."""
    sampling = ServerSampling(
        {"max_new_tokens": PROBE_TOKENS, "temperature": 0.0, "ignore_eos": True, "skip_special_tokens": False}
    )
    path, body = VllmBackend(model=model).request(list(PROBE_PROMPT), sampling)
    status, raw = client.post_json(path, body, timeout=PROBE_TIMEOUT)
    if status >= 500 or status == 429:
        raise TransientError(
            f"{client.url}: the preflight probe: {error_for_status(status, raw, path=path, url=client.url)}"
        )
    where = f"refusing server {redact_url(client.url)}: the {PROBE_TOKENS}-token probe on /v1/completions"
    message = None if status == 200 else error_message(raw, status)
    try:
        probe = {"status": status, "reply": json.loads(raw)}
    except ValueError:
        message = message or f"not JSON: {raw[:200]!r}"
    if message is not None:
        raise PreflightError(
            f"{where} was answered {status}: {message}. Is it a vLLM "
            "server serving a generation model? (--backend forces the kind)"
        )
    probe_sent = Sent(PromptItem(key="", row_id="", sample=0, ids=list(PROBE_PROMPT)), sampling=sampling)
    try:
        item = parse_completion(probe["reply"], vocab_size=PROBE_VOCAB_BOUND, sent=probe_sent)
    except ReplyAborted:  # proves nothing either way
        return probe
    except PromptMismatch as exc:
        raise PreflightError(f"{where}: {exc}") from None
    except SamplingOverridden as exc:
        raise PreflightError(f"{where} asked for exactly {PROBE_TOKENS} tokens: {exc}") from None
    except BadResponse as exc:
        if "token_ids" in str(exc) and () < version_tuple(version) < version_tuple(TOKEN_IDS_VERSION):
            raise PreflightError(
                f"{where} came back without token ids: vLLM {version} is older than "
                f"{TOKEN_IDS_VERSION}, the first to honour return_token_ids; upgrade vLLM"
            ) from None
        accepting = "accepting the server, each reply is checked before it becomes a record"
        log.warning(
            "server %s: the preflight probe's reply is malformed (%s); %s", redact_url(client.url), exc, accepting
        )
        return probe
    if item.finish_reason != "length" or len(item.output_ids) != PROBE_TOKENS:
        raise PreflightError(
            f"{where} asked for exactly {PROBE_TOKENS} tokens (max_tokens with ignore_eos) and got "
            f"{len(item.output_ids)} ending on {item.finish_reason!r}: the server does not sample as asked"
        )
    return probe


def _skip_tokenizer_init(facts: ServerFacts) -> Problem | None:
    """Seen in the dev-mode configuration, or by the probe's ids coming back with no text."""
    configured = _config(facts.server_info, "model_config.skip_tokenizer_init")
    reply = (facts.probe or {}).get("reply")
    choices = reply.get("choices") if isinstance(reply, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    if not configured and not (choice.get("token_ids") and choice.get("text") == ""):
        return None
    evidence = "skip_tokenizer_init=True" if configured else f"the probe's {PROBE_TOKENS} ids came back with no text"
    return Problem(
        "skip_tokenizer_init",
        f"the server skips its tokenizer: it stops on the model config's EOS only [{evidence}]",
        "relaunch it without --skip-tokenizer-init",
    )


def _config_check(setting: str, entry: str, bad: Callable[[object], bool], why: str, fix: str) -> Check:
    """Refuse `setting` when the dev-mode configuration's `entry` is `bad`; `why` is formatted
    with `value` and `short` (its excerpt)."""

    def check(facts: ServerFacts) -> Problem | None:
        value = _config(facts.server_info, entry)
        return Problem(setting, why.format(value=value, short=excerpt(value)), fix) if bad(value) else None

    return check


# Every refusable vLLM setting and its check, in the order problems are reported. All but the
# probe-based skip_tokenizer_init need the dev-mode configuration (VLLM_SERVER_DEV_MODE=1).
CHECKS: dict[str, Check] = {
    "skip_tokenizer_init": _skip_tokenizer_init,
    **{
        setting: _config_check(setting, *spec)
        for setting, spec in {
            "reasoning_parser": (
                "structured_outputs_config.reasoning_parser",
                bool,
                "the server runs a reasoning parser [reasoning_parser={value!r}]",
                "relaunch it without --reasoning-parser",
            ),
            "generation_config": (
                "model_config.generation_config",
                lambda source: source not in DEFAULT_GENERATION_CONFIGS,
                "the server reads sampling defaults from {value!r}: a max_new_tokens there caps every "
                "request's max_tokens without a word",
                "relaunch it with --generation-config auto",
            ),
            # Only its max_new_tokens: the other keys it can set are sent by every request, which wins.
            "override_generation_config": (
                "model_config.override_generation_config",
                lambda override: isinstance(override, dict) and "max_new_tokens" in override,
                "--override-generation-config caps every request's max_tokens at {value[max_new_tokens]}",
                "relaunch it without max_new_tokens in --override-generation-config",
            ),
            "logits_processors": (
                "model_config.logits_processors",
                bool,
                "custom logits processors can act on every request [{short}]",
                "relaunch it without --logits-processors",
            ),
            "is_generation": (
                "model_config.runner_type",
                lambda runner: runner not in (None, "generate"),
                "the model is not run for generation (runner_type={value!r})",
                "serve a generation model",
            ),
        }.items()
    },
}


def provenance(facts: ServerFacts, *, accepted: list[str] | None = None) -> dict:
    """A vLLM server's provenance (see provenance_of): its model, context, and the allow-listed
    dev-mode configuration when exposed."""
    card = facts.model_info
    details = {
        "model_path": card.get("root") or card.get("id"),
        "served_model_name": card.get("id"),
        "context_length": facts.context_length,
        "draft_reserved_tokens": 0,
        "deterministic_inference": None,
        "launch_args_visible": bool(facts.server_info),
    }
    launch_args = {
        entry: value if isinstance(value, (str, int, float, bool)) else json.dumps(value)
        for entry in PROVENANCE_CONFIG
        if (value := _config(facts.server_info, entry)) is not None
    }
    return provenance_of(VLLM, facts, details, launch_args, accepted)


@dataclass(frozen=True, kw_only=True)
class VllmBackend(BaseBackend):
    """Requests, replies, context rule and preflight of a vLLM server (see workers.backends.Backend);
    `model` is the served model name sent as `model` (from /v1/models), None leaves it out."""

    model: str | None = None
    name = VLLM
    path = "/v1/completions"
    checks = CHECKS
    # vLLM honours a per-request seed on any server; there is no switch to report.
    seed_always = True
    provenance = staticmethod(provenance)

    def translate_sampling(self, sampling: Mapping[str, Any]) -> dict:
        """The completion fields: every SGLang-named value explicit (SGLANG_DEFAULTS fill the
        gaps) under vLLM's names; UntranslatableSampling for what vLLM cannot do as asked."""
        if unknown := sorted(set(sampling) - KNOWN_KEYS):
            raise UntranslatableSampling(
                f"the campaign's sampling keys {unknown} have no vLLM /v1/completions equivalent "
                "(run this campaign on SGLang servers, or enqueue it without them)"
            )
        values = {**SGLANG_DEFAULTS, **{key: value for key, value in sampling.items() if value is not None}}
        temperature = values["temperature"]
        if 0 < temperature < VLLM_MIN_TEMPERATURE:
            raise UntranslatableSampling(
                f"temperature {temperature}: vLLM raises temperatures below {VLLM_MIN_TEMPERATURE} to "
                f"{VLLM_MIN_TEMPERATURE}, so it would not sample as asked (use 0 for greedy, or at least "
                f"{VLLM_MIN_TEMPERATURE})"
            )
        if temperature > VLLM_MAX_TEMPERATURE:
            raise UntranslatableSampling(f"temperature {temperature}: vLLM accepts at most {VLLM_MAX_TEMPERATURE}")
        if values["n"] != 1:
            raise UntranslatableSampling(f"n {values['n']}: samples are sent as separate requests, n must be 1")
        return {RENAMED.get(key, key): value for key, value in values.items()}

    def request(self, ids: list[int], sampling: Mapping[str, Any]) -> tuple[str, dict]:
        model = {} if self.model is None else {"model": self.model}
        return self.path, {**model, "prompt": ids, **self.translate_sampling(sampling), **REQUEST_FLAGS}

    def parse(self, item: object, *, vocab_size: int, sent: Sent) -> Record:
        return parse_completion(item, vocab_size=vocab_size, sent=sent)

    def context_problem(self, *, prompt_len: int, max_new_tokens: int, state: ServerState) -> str | None:
        ctx = state.context_length
        if not ctx or prompt_len + max_new_tokens <= ctx:
            return None
        return (
            f"prompt of {prompt_len} tokens + max_new_tokens {max_new_tokens} exceeds the server's "
            f"context length {ctx} (vLLM's max_model_len)"
        )

    @staticmethod
    def facts(client: ServerClient) -> ServerFacts:
        card = first_model(client.get_optional_json("/v1/models"))
        if not card:
            raise TransientError(f"{client.url}/v1/models lists no model yet")
        version = (client.get_optional_json("/version") or {}).get("version")
        config = (client.get_optional_json(DEV_CONFIG_PATH) or {}).get("vllm_config")
        config = config if isinstance(config, dict) else {}
        version = version if isinstance(version, str) else None
        return ServerFacts(
            url=client.url,
            server_info=config,
            model_info=card,
            context_length=positive_int(card.get("max_model_len")),
            version=version,
            max_running_requests=positive_int(_config(config, "scheduler_config.max_num_seqs")),
            probe=_probe(client, model=card.get("id") if isinstance(card.get("id"), str) else None, version=version),
        )

    @classmethod
    def from_state(cls, state: ServerState) -> VllmBackend:
        served = (state.provenance or {}).get("served_model_name")
        return cls(model=served if isinstance(served, str) else None)
