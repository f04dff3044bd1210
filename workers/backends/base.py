"""The backend seam: what differs between the kinds of server a worker drives.

One worker drives SGLang (`/generate`) and vLLM (`/v1/completions`) servers with the same
guarantees: exact ids, every sampling value sent, one record or one recorded failure per
prompt. Routing, retries, accounting and records are the same for every kind; what differs
sits behind `Backend`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol
from urllib.parse import urlsplit, urlunsplit

from eagle_synth.errors import UserError
from eagle_synth.state.node_state import ServerState
from workers.client import BadSamplingParams, ServerClient, ServerFacts
from workers.replies import GeneratedItem

# The kinds of server a worker can drive; "auto" (the --backend default) detects the kind.
SGLANG = "sglang"
VLLM = "vllm"
AUTO = "auto"
BACKEND_CHOICES = (AUTO, SGLANG, VLLM)


class PreflightError(UserError, RuntimeError):
    """The server is configured in a way that would change the records; says how to fix it."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One refused server setting: `setting` (the name `--allow-server-setting` takes), `why`
    (what it would do to the records, with the offending value), `fix` (how to relaunch)."""

    setting: str
    why: str
    fix: str

    def refusal(self) -> str:
        return f"{self.why} ({self.fix}, or accept it with --allow-server-setting {self.setting})"

    def accepted(self) -> str:
        """The line logged and kept in provenance when the setting is accepted."""
        return f"{self.setting}: {self.why}"


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


class UntranslatableSampling(BadSamplingParams):
    """The campaign's sampling has no exact equivalent on this kind of server (a key it does
    not have, a value it would change); the message says which and why. Like a 400 about the
    sampling, it fails the campaign's prompts as `bad-sampling-params` before any is sent."""


class Backend(Protocol):
    """One kind of server as the worker sees it; an instance serves one server URL.

    `name` is the kind, `path` its generation endpoint, `checks` the refusable settings
    preflight looks for (setting name -> check). The campaign's sampling is kept in SGLang's
    names (eagle_synth/sampling.py) and translated per kind: `translate_sampling` makes every
    value explicit or raises UntranslatableSampling; `request` is (path, JSON body) for one
    prompt; `parse` checks one decoded 200 reply (BadResponse for malformed shapes,
    PromptMismatch when the server generated from other ids, SamplingOverridden when it did not
    sample as asked); `context_problem` is None when the server serves the prompt exactly as
    asked, else why not. Preflight: `facts` is what the server says about itself (raises
    ServerDown, TransientError, or PreflightError when it cannot produce records at all),
    `apply_facts` stores what batches need and the provenance in the node's server state, and
    `from_state` rebuilds the backend from that state.
    """

    name: ClassVar[str]
    path: ClassVar[str]
    checks: ClassVar[Mapping[str, Check]]

    def translate_sampling(self, sampling: dict) -> dict: ...

    def request(self, ids: list[int], sampling: dict) -> tuple[str, dict]: ...

    def parse(self, item: object, *, vocab_size: int, prompt_ids: list[int], sampling: dict) -> GeneratedItem: ...

    def context_problem(self, *, prompt_len: int, max_new_tokens: int, state: ServerState) -> str | None: ...

    @staticmethod
    def facts(client: ServerClient) -> ServerFacts: ...

    @staticmethod
    def apply_facts(state: ServerState, facts: ServerFacts, *, accepted: list[str]) -> None: ...

    @classmethod
    def from_state(cls, state: ServerState) -> Backend: ...
