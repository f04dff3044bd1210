"""The backend seam: what differs between the kinds of server a worker drives (SGLang's
`/generate`, vLLM's `/v1/completions`) sits behind `workers.backends.Backend` (described there);
routing, retries, accounting and records are the same for every kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Self
from urllib.parse import urlsplit, urlunsplit

from eagle_synth.state.node_state import ServerState
from workers.servers.client import ServerFacts, positive_int

# The kinds of server a worker can drive; "auto" (the --backend default) detects the kind.
SGLANG = "sglang"
VLLM = "vllm"
AUTO = "auto"
BACKEND_CHOICES = (AUTO, SGLANG, VLLM)


@dataclass(frozen=True, slots=True)
class Problem:
    """One refused server setting: `setting` (the name `--allow-server-setting` takes), `why`
    (what it would do to the records, with the offending value), `fix` (how to relaunch)."""

    setting: str
    why: str
    fix: str


# A setting check: the Problem a server's facts show, or None.
Check = Callable[[ServerFacts], Problem | None]


def redact_url(url: str) -> str:
    """The URL without a password (`http://user:secret@host` -> `http://user:***@host`)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def provenance_of(kind: str, facts: ServerFacts, details: dict, launch_args: dict, accepted: list[str] | None) -> dict:
    """What a campaign keeps about the server that generated its records: where and what `kind`
    it is, the kind's `details`, the refused settings accepted by override, and an allow-list of
    its launch arguments (never a secret)."""
    head = {"url": redact_url(facts.url), "backend": kind, "version": facts.version}
    return {**head, **details, "accepted_despite": list(accepted or ()), "launch_args": launch_args}


class BaseBackend:
    """What the kinds share (see workers.backends): `apply_facts` stores what batches need from
    the kind's `provenance` (built by `provenance_of`, holding draft_reserved_tokens and
    deterministic_inference); `seed_always`: every server of the kind honours a per-request seed."""

    name: ClassVar[str]
    path: ClassVar[str]
    checks: ClassVar[Mapping[str, Check]]
    seed_always: ClassVar[bool] = False
    provenance: ClassVar[Callable[..., dict]]

    @classmethod
    def from_state(cls, state: ServerState) -> Self:
        return cls()

    @classmethod
    def apply_facts(cls, state: ServerState, facts: ServerFacts, *, accepted: list[str]) -> None:
        kept = cls.provenance(facts, accepted=accepted)
        state.backend = cls.name
        state.context_length = facts.context_length
        state.draft_reserved_tokens = kept["draft_reserved_tokens"]
        state.max_req_input_len = positive_int(facts.server_info.get("max_req_input_len"))
        state.max_running_requests = facts.max_running_requests
        state.max_total_num_tokens = facts.max_total_num_tokens
        state.deterministic_inference = kept["deterministic_inference"]
        state.sampling_seed_supported = cls.seed_always or kept["deterministic_inference"] is not None
        state.provenance = kept
