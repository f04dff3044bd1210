"""Worker settings: the one place each worker option has its default, help, flag and
environment name (`EAGLE_SYNTH_<NAME>`). `eagle-synth worker` makes its flags from the fields'
`Flag`s and builds the settings from them through eagle_synth/cli/flags.py (flags given, else
the environment, else the defaults); `celery -A workers.app worker` reads the same values from
the environment, which the CLI writes for its worker process (`to_env`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Self
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from eagle_synth.errors import ConfigError
from eagle_synth.flags import ALLOW_EVICTING_REDIS, ALLOW_VOLATILE_REDIS, Flag
from eagle_synth.payload import DEFAULT_BATCH_SIZE
from eagle_synth.settings import EnvSettings
from workers.backends import REFUSABLE_SETTINGS
from workers.backends.base import AUTO, BACKEND_CHOICES, redact_url

# Prompts kept in flight per server when neither --inflight nor the server says how many it runs.
DEFAULT_INFLIGHT = 256
# In flight per server when the server reports max_running_requests: a full server plus a
# margin, so a freed slot finds the next prompt already waiting in the server's queue.
AUTO_INFLIGHT_FACTOR = 1.25
# Prompts the worker holds open (in reserved batches) per in-flight ticket: heavy-tailed
# outputs leave many batches with one straggler, and the tickets must never run dry
# (benchmarks/tail.py measures it).
OPEN_PROMPTS_PER_TICKET = 8
# The highest TCP port number.
MAX_PORT = 65535
# Comma-separated lists in the environment: EAGLE_SYNTH_SERVERS=http://a,http://b.
CommaList = Annotated[tuple[str, ...], NoDecode]


# The flags whose declaration would not fit the field's line (eagle_synth/flags.py); a
# repeated flag for each comma list.
SERVERS_FLAG = Flag(
    "Server base URL (SGLang or vLLM); repeat for several servers.",
    names=("--server",),
    type=list[str],
    required=True,
)
BACKEND_FLAG = Flag(
    "Server kind: auto (detect), sglang or vllm. Once for every server, or once per --server in the same order. "
    "Default: auto.",
    names=("--backend",),
    type=list[str] | None,
)
INFLIGHT_HELP = (
    f"Prompts in flight per server. Default: {AUTO_INFLIGHT_FACTOR} x the server's max_running_requests, "
    f"or {DEFAULT_INFLIGHT} if it does not report it."
)
ALLOW_SERVER_PARSERS_FLAG = Flag(
    "Accept servers running reasoning/tool-call parsers or --skip-tokenizer-init.", negatable=False
)
ALLOW_SERVER_SETTINGS_FLAG = Flag(
    "Accept a server setting preflight refuses, by name (allow_auto_truncate, preferred_sampling_params, "
    "is_generation, ...); repeat for several.",
    names=("--allow-server-setting",),  # one flag per setting allowed
    type=list[str] | None,
)
CAMPAIGNS_FLAG = Flag(
    "Take batches of this campaign only; repeat for several. Default: every campaign one of the servers serves "
    "the model of. Also lets a server whose model cannot be checked (no /tokenize) take it.",
    names=("--campaign",),
    type=list[str] | None,
)
BACKOFF_MAX_HELP = "Longest wait between retries of a prompt (s); backoff doubles from 1 s, jittered."
PROBE_TIMEOUT_HELP = "Seconds a /health probe may take (SGLang's own check gives up after 20 s)."
RENDER_PROCESSES_HELP = "Processes that render conversations' next turns (--history own), started on first need."
METRICS_PORT_HELP = (
    "Serve Prometheus metrics at http://ADDRESS:PORT/metrics (docs/operations.md, Metrics). Default: off."
)
METRICS_ADDRESS_HELP = "Interface the metrics port binds (Prometheus scrapes from other hosts)."
TOKENIZER_FLAG = Flag(
    "A local model folder (the one its server loads) whose tokenizer code renders the next turns of --history own "
    "campaigns made with --trust-remote-code; its files must be the campaign's. Repeat for several.",
    names=("--tokenizer",),
    type=list[str] | None,
)


class WorkerConfig(EnvSettings):
    """What the worker process needs; every field is one option (environment
    `EAGLE_SYNTH_FIELD_NAME`; the `Flag` in its type declares its flag, `--field-name` unless
    named, and its help), but the servers' API key, which has no flag."""

    error = ConfigError

    servers: Annotated[CommaList, SERVERS_FLAG] = ()
    out: Annotated[Path, Flag("Records go to OUT/<campaign>/.", names=("--out",), required=True)] = Path("out")
    backend: Annotated[CommaList, BACKEND_FLAG] = ()
    inflight: Annotated[int | None, Flag(INFLIGHT_HELP)] = None
    allow_server_parsers: Annotated[bool, ALLOW_SERVER_PARSERS_FLAG] = False
    allow_server_settings: Annotated[CommaList, ALLOW_SERVER_SETTINGS_FLAG] = ()
    campaigns: Annotated[CommaList, CAMPAIGNS_FLAG] = ()
    max_attempts: Annotated[int, Flag("Attempts per prompt on transient errors while the server is healthy.")] = 6
    timeout_base: Annotated[float, Flag("Request timeout = this + timeout-per-token x max_new_tokens (s).")] = 120.0
    timeout_per_token: Annotated[float, Flag("Seconds of request timeout per max_new_tokens.")] = 0.1
    backoff_max: Annotated[float, Flag(BACKOFF_MAX_HELP)] = 30.0
    probe_timeout: Annotated[float, Flag(PROBE_TIMEOUT_HELP)] = 25.0
    render_processes: Annotated[int, Flag(RENDER_PROCESSES_HELP)] = 2
    metrics_port: Annotated[int | None, Flag(METRICS_PORT_HELP)] = None
    metrics_address: Annotated[str, Flag(METRICS_ADDRESS_HELP)] = "0.0.0.0"
    tokenizer: Annotated[CommaList, TOKENIZER_FLAG] = ()
    # Flags enqueue takes too; the worker process re-checks Redis with them.
    allow_evicting_redis: Annotated[bool, ALLOW_EVICTING_REDIS] = False
    allow_volatile_redis: Annotated[bool, ALLOW_VOLATILE_REDIS] = False
    # No flag: a flag's value shows in `ps` and shell history. Never logged, never in Redis.
    server_api_key: SecretStr | None = Field(
        None, description="The servers' API key (their --api-key), sent as a bearer token to every server."
    )

    @field_validator("servers", "backend", "allow_server_settings", "campaigns", "tokenizer", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        return tuple(part.strip().rstrip("/") for part in value if part.strip())

    @model_validator(mode="after")
    def _check(self) -> Self:
        problems = [
            f"{name} {value}: {words}"
            for names, low, words in (
                (("inflight", "render_processes", "max_attempts"), 1, "must be at least 1"),
                (("timeout_base", "timeout_per_token", "backoff_max", "probe_timeout"), 0, "must be >= 0"),
            )
            for name in names
            if (value := getattr(self, name)) is not None and value < low
        ]
        if self.metrics_port is not None and not 1 <= self.metrics_port <= MAX_PORT:
            problems.append(f"metrics_port {self.metrics_port}: must be a TCP port, 1 to {MAX_PORT}")
        if unknown := [kind for kind in self.backend if kind not in BACKEND_CHOICES]:
            problems.append(f"backend {', '.join(unknown)}: must be one of {', '.join(BACKEND_CHOICES)}")
        if len(self.backend) > 1 and len(self.backend) != len(self.servers):
            problems.append(
                f"backend given {len(self.backend)} times for {len(self.servers)} servers: give it "
                "once for all, or once per server in --server order"
            )
        if unknown := sorted(set(self.allow_server_settings) - set(REFUSABLE_SETTINGS)):
            problems.append(
                f"allow_server_settings {', '.join(unknown)}: not a setting preflight refuses "
                f"(known: {', '.join(REFUSABLE_SETTINGS)})"
            )
        # A server's URL is its name in records, logs and Redis: a password in it would be copied
        # to all of them. SGLang and vLLM take no password in the URL; only a proxy would.
        if with_password := [redact_url(url) for url in self.servers if urlsplit(url).password is not None]:
            problems.append(
                f"server {', '.join(with_password)}: a password in a server URL would be copied into records, "
                "logs and Redis; give the server's address without one"
            )
        if problems:
            raise ConfigError("; ".join(problems))
        return self

    @classmethod
    def from_env(cls) -> WorkerConfig:
        """The settings a worker process was started with (the environment, defaults for the rest)."""
        config = cls.load()
        if not config.servers:
            raise ConfigError(
                f"no server configured: set {cls.env_name('servers')} or start with `eagle-synth worker --server URL`"
            )
        return config

    @property
    def api_key(self) -> str | None:
        return None if self.server_api_key is None else self.server_api_key.get_secret_value()

    def backend_for(self, url: str) -> str:
        """The kind given for one server ("auto" when none was: detect it)."""
        if len(self.backend) > 1:
            return self.backend[self.servers.index(url)]
        return self.backend[0] if self.backend else AUTO

    def request_timeout(self, max_new_tokens: int) -> float:
        return self.timeout_base + self.timeout_per_token * max_new_tokens


def default_concurrency(*, inflight: int, servers: int, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
    """Batches to hold open (batch threads) so `inflight` tickets per server never run dry."""
    return max(2, math.ceil(OPEN_PROMPTS_PER_TICKET * inflight * servers / batch_size))


def auto_inflight(capacity: int | None) -> int:
    """In-flight tickets for a server that runs `capacity` requests at once (None: unknown)."""
    return math.ceil(AUTO_INFLIGHT_FACTOR * capacity) if capacity else DEFAULT_INFLIGHT
