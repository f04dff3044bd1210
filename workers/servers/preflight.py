"""Preflight: before a worker sends a server any prompt, tell its kind and check it returns
raw, faithful ids (docs/workers.md "Which kind of server" and "Preflight").

`preflight_server` is the one entry (the health gate and `eagle-synth worker`): it detects the
kind unless --backend forces it, gathers that kind's facts and applies its refusals (each
kind's are in workers/backends/).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from eagle_synth.errors import PreflightError, ServerDown, TransientError, Unauthorized
from workers.backends import BACKENDS
from workers.backends.base import AUTO, SGLANG, VLLM, Check, redact_url
from workers.backends.sglang import CHECKS
from workers.config import auto_inflight
from workers.servers.client import ServerClient, ServerFacts, first_model

# The settings `--allow-server-parsers` accepts.
PARSER_SETTINGS = frozenset({"reasoning_parser", "tool_call_parser", "skip_tokenizer_init"})


@dataclass(frozen=True, slots=True)
class Preflighted:
    """A server preflight accepted: its kind, how the kind was known (evidence or "--backend"),
    its facts, and the refused settings accepted by override."""

    kind: str
    how: str
    facts: ServerFacts
    accepted: list[str]


def detect_kind(client: ServerClient) -> tuple[str | None, str]:
    """(kind or None, the evidence: /v1/models `owned_by`, else vLLM's dev-mode /server_info or
    SGLang's /model_info); raises ServerDown or TransientError when it does not answer."""
    owner = first_model(client.get_optional_json("/v1/models")).get("owned_by")
    if owner in BACKENDS:  # each kind's model card names it in owned_by
        return owner, f"/v1/models owned_by {owner!r}"
    server_info = client.get_optional_json("/server_info")
    if server_info is not None and "vllm_config" in server_info:
        return VLLM, "/server_info holds vllm_config"
    if client.get_optional_json("/model_info", "/get_model_info") is not None:
        return SGLANG, "/model_info answers"
    return None, f"/v1/models owned_by {owner!r}, no /model_info, no vLLM /server_info"


def preflight_server(
    client: ServerClient,
    *,
    forced: str = AUTO,
    allow_server_parsers: bool = False,
    allowed_settings: Iterable[str] = (),
) -> Preflighted:
    """Detect (or take `forced`), gather facts and check one server. Raises PreflightError for
    a refused server (wrong or unknown kind, refused settings, a probe showing it cannot give
    records), Unauthorized (an API key it checks and we lack), ServerDown / TransientError when
    it cannot answer."""
    detected, evidence = detect_kind(client)
    where = f"refusing server {redact_url(client.url)}"
    if forced in BACKENDS and detected not in (None, forced):
        raise PreflightError(
            f"{where}: --backend {forced} was given for it, but it answers like {detected} "
            f"({evidence}); give the right --backend or leave it to detection"
        )
    if forced not in BACKENDS and detected is None:
        raise PreflightError(
            f"{where}: cannot tell whether it is SGLang or vLLM ({evidence}); give --backend sglang or --backend vllm"
        )
    kind, how = (forced, "--backend") if forced in BACKENDS else (str(detected), evidence)
    backend = BACKENDS[kind]
    facts = backend.facts(client)
    accepted = check_server(
        facts, allow_server_parsers=allow_server_parsers, allowed_settings=allowed_settings, checks=backend.checks
    )
    return Preflighted(kind=kind, how=how, facts=facts, accepted=accepted)


def check_server(
    facts: ServerFacts,
    *,
    allow_server_parsers: bool = False,
    allowed_settings: Iterable[str] = (),
    checks: Mapping[str, Check] = CHECKS,
) -> list[str]:
    """Raise PreflightError for a refused server (a problem not in `allowed_settings`), else return a
    line per problem, each accepted, as logged and kept in provenance; `checks` are the kind's (default SGLang's)."""
    allowed = {*allowed_settings, *(PARSER_SETTINGS if allow_server_parsers else ())}
    problems = [problem for check in checks.values() if (problem := check(facts)) is not None]
    if refused := [p for p in problems if p.setting not in allowed]:
        raise PreflightError(
            f"refusing server {redact_url(facts.url)}:\n  - "
            + "\n  - ".join(f"{p.why} ({p.fix}, or accept it with --allow-server-setting {p.setting})" for p in refused)
            + "\nRelaunch it without these settings, or accept them by name with "
            "--allow-server-setting NAME (--allow-server-parsers accepts the parser-related ones)."
        )
    return [f"{p.setting}: {p.why}" for p in problems]


@dataclass(frozen=True, slots=True)
class StartupPreflight:
    """What preflight found when a worker started; every server lands in exactly one of `refused`
    (its refusal message), `capacities` (max_running_requests of an accepted server, None when
    it does not say; `accepted` has its log line) and `not_answering` ((url, why): the health
    gate checks it again when it comes up)."""

    refused: list[str]
    capacities: list[int | None]
    not_answering: list[tuple[str, str]]
    accepted: list[str] = field(default_factory=list)

    @property
    def all_refused(self) -> bool:
        return bool(self.refused) and not self.capacities and not self.not_answering

    def inflight(self) -> int:
        """In flight per server sized from the largest capacity a server reports now (a server
        still loading counts as the default until it answers)."""
        return max((auto_inflight(capacity) for capacity in self.capacities), default=auto_inflight(None))


def preflight_at_start(
    servers: Iterable[str],
    *,
    forced: Callable[[str], str],
    allow_server_parsers: bool,
    allowed_settings: Sequence[str],
    api_key: str | None = None,
) -> StartupPreflight:
    """Preflight each server once before the worker starts; `forced(url)` is its --backend or AUTO."""
    found = StartupPreflight(refused=[], capacities=[], not_answering=[])
    for url in servers:
        try:
            client = ServerClient(url, api_key=api_key)
            checked = preflight_server(
                client, forced=forced(url), allow_server_parsers=allow_server_parsers, allowed_settings=allowed_settings
            )
        except (PreflightError, Unauthorized) as exc:
            found.refused.append(str(exc))
        except (ServerDown, TransientError) as exc:
            found.not_answering.append((url, str(exc)))
        else:
            found.capacities.append(checked.facts.max_running_requests)
            found.accepted.append(
                f"server {redact_url(url)}: {checked.kind} {checked.facts.version or ''} (kind from {checked.how})"
            )
    return found
