"""The kinds of server a worker drives, and how a worker tells which one a server is.

`preflight_server` is the one entry preflight uses (the health gate and `eagle-synth worker`):
it detects the kind (`detect_kind`) unless --backend forces it, gathers that kind's facts and
applies its refusals. Detection asks what each kind answers and the other does not:

1. `/v1/models`: `data[0].owned_by` is "sglang" on SGLang and "vllm" on vLLM;
2. otherwise (a proxy rewriting it): vLLM's dev-mode `/server_info` holds `vllm_config`,
   SGLang's `/model_info` (older `/get_model_info`) exists only there.

A forced kind that contradicts what the server answers is refused (a request in the wrong
API would only fail); a server that answers like neither needs --backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from eagle_synth.state.node_state import ServerState
from workers.backends.base import AUTO, BACKEND_CHOICES, SGLANG, VLLM, Backend, UntranslatableSampling
from workers.backends.sglang import SGLangBackend
from workers.backends.vllm import VllmBackend
from workers.client import ServerDown, ServerFacts, SGLangClient, TransientError
from workers.preflight import PreflightError, StartupPreflight, check_server, redact_url

# Every kind, by name.
BACKENDS: dict[str, type[SGLangBackend] | type[VllmBackend]] = {SGLANG: SGLangBackend, VLLM: VllmBackend}
# Names `--allow-server-setting` accepts: every kind's refusable settings, SGLang's first.
REFUSABLE_SETTINGS = tuple(dict.fromkeys([*SGLangBackend.checks, *VllmBackend.checks]))
# What each kind's model card says in /v1/models `owned_by`.
OWNERS = {"sglang": SGLANG, "vllm": VLLM}

__all__ = [
    "AUTO",
    "BACKEND_CHOICES",
    "BACKENDS",
    "Backend",
    "Preflighted",
    "REFUSABLE_SETTINGS",
    "SGLANG",
    "VLLM",
    "UntranslatableSampling",
    "backend_for_state",
    "detect_kind",
    "preflight_server",
]


@dataclass(frozen=True, slots=True)
class Preflighted:
    """A server preflight accepted.

    Parameters:
        kind: "sglang" or "vllm".
        how: how the kind was known (the detection's evidence, or "--backend").
        facts: what the server told about itself.
        accepted: refused settings accepted by override, as logged and kept in provenance.
    """

    kind: str
    how: str
    facts: ServerFacts
    accepted: list[str]


def detect_kind(client: SGLangClient) -> tuple[str | None, str]:
    """(kind or None, the evidence) from what the server answers; raises ServerDown or
    TransientError when it does not answer at all."""
    models = client.get_optional_json("/v1/models") or {}
    data = models.get("data")
    owner = data[0].get("owned_by") if isinstance(data, list) and data and isinstance(data[0], dict) else None
    if owner in OWNERS:
        return OWNERS[owner], f"/v1/models owned_by {owner!r}"
    server_info = client.get_optional_json("/server_info")
    if server_info is not None and "vllm_config" in server_info:
        return VLLM, "/server_info holds vllm_config"
    if client.get_optional_json("/model_info") is not None or client.get_optional_json("/get_model_info") is not None:
        return SGLANG, "/model_info answers"
    return None, f"/v1/models owned_by {owner!r}, no /model_info, no vLLM /server_info"


def preflight_server(
    client: SGLangClient,
    *,
    forced: str = AUTO,
    allow_server_parsers: bool = False,
    allowed_settings: Iterable[str] | None = None,
) -> Preflighted:
    """Detect (or take `forced`), gather facts and check one server.

    Raises PreflightError for a refused server (wrong or unknown kind, refused settings, a
    probe showing it cannot give records), ServerDown / TransientError when it cannot answer.
    """
    detected, evidence = detect_kind(client)
    where = redact_url(client.url)
    if forced in BACKENDS:
        if detected is not None and detected != forced:
            raise PreflightError(
                f"refusing server {where}: --backend {forced} was given for it, but it answers like {detected} "
                f"({evidence}); give the right --backend or leave it to detection"
            )
        kind, how = forced, "--backend"
    elif detected is None:
        raise PreflightError(
            f"refusing server {where}: cannot tell whether it is SGLang or vLLM ({evidence}); "
            "give --backend sglang or --backend vllm"
        )
    else:
        kind, how = detected, evidence
    backend = BACKENDS[kind]
    facts = backend.facts(client)
    accepted = check_server(
        facts, allow_server_parsers=allow_server_parsers, allowed_settings=allowed_settings, checks=backend.checks
    )
    return Preflighted(kind=kind, how=how, facts=facts, accepted=accepted)


def backend_for_state(state: ServerState | None) -> Backend | None:
    """The backend of a server preflight accepted (None while its kind is unknown)."""
    if state is None or state.backend not in BACKENDS:
        return None
    return BACKENDS[state.backend].from_state(state)


def preflight_at_start(
    servers: Iterable[str], *, forced: Callable[[str], str], allow_server_parsers: bool, allowed_settings: Iterable[str]
) -> StartupPreflight:
    """Preflight each server that answers now, once, before the worker starts (the health gate
    checks the others when they come up). `forced(url)` is the kind given for it, or AUTO."""
    found = StartupPreflight(refused=[], capacities=[], not_answering=[])
    allowed = tuple(allowed_settings)
    for url in servers:
        try:
            checked = preflight_server(
                SGLangClient(url),
                forced=forced(url),
                allow_server_parsers=allow_server_parsers,
                allowed_settings=allowed,
            )
        except PreflightError as exc:
            found.refused.append(str(exc))
        except (ServerDown, TransientError) as exc:
            found.not_answering.append((url, str(exc)))
        else:
            found.capacities.append(checked.facts.max_running_requests)
            found.accepted.append(
                f"server {redact_url(url)}: {checked.kind} {checked.facts.version or ''} (kind from {checked.how})"
            )
    return found
