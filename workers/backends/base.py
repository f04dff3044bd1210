"""The backend seam: what differs between the kinds of server a worker drives.

One worker drives SGLang (`/generate`) and vLLM (`/v1/completions`) servers with the same
guarantees: exact ids, every sampling value sent, one record or one recorded failure per
prompt. What differs between the kinds sits behind `Backend`:

* the request for one prompt (`request`), built from the campaign's sampling, which is kept
  in SGLang's names (eagle_synth/sampling.py) and translated per kind (`translate_sampling`);
* the check that turns a 200 reply into a GeneratedItem or raises (`parse`);
* the context rule (`context_problem`);
* preflight: what the server says about itself (`facts`), the settings refused (`checks`),
  what the node state keeps (`apply_facts`), and the backend rebuilt from it (`from_state`).

Routing, retries, accounting and records are the same for every kind.
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

    Class attributes: `name` (the kind), `path` (its generation endpoint), `checks` (the
    refusable settings preflight looks for: setting name -> check).
    """

    name: ClassVar[str]
    path: ClassVar[str]
    checks: ClassVar[Mapping[str, Check]]

    def translate_sampling(self, sampling: dict) -> dict:
        """The campaign's sampling (SGLang names) as this kind's request fields, every value
        explicit; raises UntranslatableSampling when there is no exact equivalent."""
        ...

    def request(self, ids: list[int], sampling: dict) -> tuple[str, dict]:
        """(path, JSON body) generating one prompt with `sampling` (SGLang names)."""
        ...

    def parse(self, item: object, *, vocab_size: int, prompt_ids: list[int], sampling: dict) -> GeneratedItem:
        """Check one decoded 200 reply: BadResponse (transient) for malformed shapes,
        PromptMismatch when the server generated from other ids, SamplingOverridden when it
        did not sample as asked."""
        ...

    def context_problem(self, *, prompt_len: int, max_new_tokens: int, state: ServerState) -> str | None:
        """None when the server serves this prompt exactly as asked, else why not."""
        ...

    @staticmethod
    def facts(client: ServerClient) -> ServerFacts:
        """What preflight learns from the server (raises ServerDown, TransientError, or
        PreflightError when the server cannot produce records at all)."""
        ...

    @staticmethod
    def apply_facts(state: ServerState, facts: ServerFacts, *, accepted: list[str]) -> None:
        """Store in the node's server state what batches need, and the provenance."""
        ...

    @classmethod
    def from_state(cls, state: ServerState) -> Backend:
        """The backend for a server preflight accepted, from its published state."""
        ...
