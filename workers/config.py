"""Worker settings: the one place each worker option has its default, its help and its
environment name.

`WorkerConfig` declares every option once (`setting(...)`): the CLI's flags take their
defaults and help from it (`option_help`), `celery -A workers.app worker` reads the same
values from `EAGLE_SYNTH_<NAME>` environment variables, and the CLI hands a resolved config to
the worker process once, through `to_env`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle_synth.errors import UserError
from eagle_synth.payload import DEFAULT_BATCH_SIZE
from workers.backends.base import AUTO, BACKEND_CHOICES

# Prefix of every worker setting's environment variable: EAGLE_SYNTH_ + the field in capitals.
ENV_PREFIX = "EAGLE_SYNTH_"
# Prompts kept in flight per server when neither --inflight nor the server says how many it runs.
DEFAULT_INFLIGHT = 256
# In flight per server when the server reports max_running_requests: a full server plus a
# margin, so a freed slot finds the next prompt already waiting in the server's queue.
AUTO_INFLIGHT_FACTOR = 1.25
# Prompts the worker holds open (in reserved batches) per in-flight ticket: heavy-tailed
# outputs leave many batches with one straggler, and the tickets must never run dry
# (benchmarks/tail.py measures it).
OPEN_PROMPTS_PER_TICKET = 8


class ConfigError(UserError, ValueError):
    """A worker setting has a value that cannot work; the message names it."""


def setting(default: Any, help_text: str) -> Any:
    """A WorkerConfig field with its default and its help (shown by `eagle-synth worker --help`)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use an immutable default")
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """What the worker process needs; every field is one option (flag `--field-name`,
    environment `EAGLE_SYNTH_FIELD_NAME`)."""

    servers: tuple[str, ...] = setting((), "Server base URL (SGLang or vLLM); repeat for several servers.")
    backend: tuple[str, ...] = setting(
        (),
        "Server kind: auto (detect), sglang or vllm. Once for every server, or once per --server in the "
        "same order. Default: auto.",
    )
    out: Path = setting(Path("out"), "Records go to OUT/<campaign>/.")
    inflight: int | None = setting(
        None,
        f"Prompts in flight per server. Default: {AUTO_INFLIGHT_FACTOR} x the server's max_running_requests, "
        f"or {DEFAULT_INFLIGHT} if it does not report it.",
    )
    allow_server_parsers: bool = setting(
        False, "Accept servers running reasoning/tool-call parsers or --skip-tokenizer-init."
    )
    allow_server_settings: tuple[str, ...] = setting(
        (),
        "Accept a server setting preflight refuses, by name (allow_auto_truncate, preferred_sampling_params, "
        "is_generation, ...); repeat for several.",
    )
    max_attempts: int = setting(6, "Attempts per prompt on transient errors while the server is healthy.")
    timeout_base: float = setting(120.0, "Request timeout = this + timeout-per-token x max_new_tokens (s).")
    timeout_per_token: float = setting(0.1, "Seconds of request timeout per max_new_tokens.")
    backoff_max: float = setting(
        30.0, "Longest wait between retries of a prompt (s); backoff doubles from 1 s, jittered."
    )
    probe_timeout: float = setting(25.0, "Seconds a /health probe may take (SGLang's own check gives up after 20 s).")
    render_processes: int = setting(
        2, "Processes that render conversations' next turns (--history own), started on first need."
    )

    def __post_init__(self) -> None:
        problems = []
        if self.inflight is not None and self.inflight < 1:
            problems.append(f"inflight {self.inflight}: must be at least 1")
        if self.render_processes < 1:
            problems.append(f"render_processes {self.render_processes}: must be at least 1")
        if self.max_attempts < 1:
            problems.append(f"max_attempts {self.max_attempts}: must be at least 1")
        for name in ("timeout_base", "timeout_per_token", "backoff_max", "probe_timeout"):
            if getattr(self, name) < 0:
                problems.append(f"{name} {getattr(self, name)}: must be >= 0")
        unknown = [kind for kind in self.backend if kind not in BACKEND_CHOICES]
        if unknown:
            problems.append(f"backend {', '.join(unknown)}: must be one of {', '.join(BACKEND_CHOICES)}")
        if len(self.backend) > 1 and len(self.backend) != len(self.servers):
            problems.append(
                f"backend given {len(self.backend)} times for {len(self.servers)} servers: give it "
                "once for all, or once per server in --server order"
            )
        if problems:
            raise ConfigError("; ".join(problems))

    # ---- environment ---------------------------------------------------------------------
    def to_env(self) -> dict[str, str]:
        """Every setting as EAGLE_SYNTH_* variables (what a worker process reads back)."""
        env = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                text = ""
            elif isinstance(value, bool):
                text = "1" if value else "0"
            elif isinstance(value, tuple):
                text = ",".join(value)
            else:
                text = str(value)
            env[env_name(f.name)] = text
        return env

    @classmethod
    def from_env(cls) -> WorkerConfig:
        """The settings from EAGLE_SYNTH_* variables, defaults for those unset."""
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = os.environ.get(env_name(f.name))
            if raw is None or (raw == "" and f.default is not None):
                continue
            values[f.name] = _parse(raw, hints[f.name], env_name(f.name))
        config = cls(**values)
        if not config.servers:
            raise ConfigError(
                f"no server configured: set {env_name('servers')} or start with `eagle-synth worker --server URL`"
            )
        return config

    def backend_for(self, url: str) -> str:
        """The kind given for one server ("auto" when none was: detect it)."""
        if not self.backend:
            return AUTO
        if len(self.backend) == 1:
            return self.backend[0]
        return self.backend[self.servers.index(url)]

    def request_timeout(self, max_new_tokens: int) -> float:
        return self.timeout_base + self.timeout_per_token * max_new_tokens


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def option_help(field_name: str) -> str:
    """The help text of one setting, for the CLI flag that sets it (with its default and
    environment variable)."""
    f = next(f for f in dataclasses.fields(WorkerConfig) if f.name == field_name)
    shown = "" if f.default in (None, (), False) or isinstance(f.default, Path) else f" [default: {f.default}]"
    return f"{f.metadata['help']}{shown} [env: {env_name(field_name)}]"


def default(field_name: str) -> Any:
    return next(f.default for f in dataclasses.fields(WorkerConfig) if f.name == field_name)


def _parse(raw: str, hint: Any, name: str) -> Any:
    args = typing.get_args(hint)
    if args and type(None) in args:  # Optional[X]
        if raw == "":
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if typing.get_origin(hint) is tuple:
        return tuple(part.strip().rstrip("/") for part in raw.split(",") if part.strip())
    try:
        return hint(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={raw!r} is not a valid {getattr(hint, '__name__', hint)}") from None


def default_concurrency(*, inflight: int, servers: int, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
    """Batches to hold open (batch threads) so `inflight` tickets per server never run dry."""
    return max(2, math.ceil(OPEN_PROMPTS_PER_TICKET * inflight * servers / batch_size))


def auto_inflight(capacity: int | None) -> int:
    """In-flight tickets for a server that runs `capacity` requests at once (None: unknown)."""
    return math.ceil(AUTO_INFLIGHT_FACTOR * capacity) if capacity else DEFAULT_INFLIGHT
