"""The backend seam: what differs between the kinds of server a worker drives.

One worker drives SGLang (`/generate`) and vLLM (`/v1/completions`) servers with the same
guarantees: exact ids, every sampling value sent, one record or one recorded failure per
prompt. Routing, retries, accounting and records are the same for every kind; what differs
sits behind `workers.backends.Backend` (described there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from eagle_synth.errors import UserError
from workers.client import BadSamplingParams, ServerFacts

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
