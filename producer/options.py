"""What one `enqueue` run is asked to do, its defaults and its checks: the one list the CLI's
flags take their defaults and their errors from. Light to import (no Redis, no tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from eagle_synth.errors import UserError
from eagle_synth.payload import DEFAULT_BATCH_SIZE
from eagle_synth.priorities import PRIORITIES
from eagle_synth.sampling import SamplingParams
from eagle_synth.toolcalls import TOOL_FORMATS
from eagle_synth.variants import Variant

# Default cap on pending prompts before enqueue waits (keeps Redis memory bounded).
DEFAULT_MAX_BACKLOG = 200_000
# Default cap on the MB the backlog holds in Redis (queued tasks, failures, outbox): at 2k-token
# prompts the 200,000-prompt cap alone allows ~0.8 GB; 256 MB keeps a 10M-prompt campaign's peak
# (its key sets, ~170 B a prompt, plus this) under 2 GB.
DEFAULT_MAX_BACKLOG_MB = 256
# Default cap on a prompt's tokens after templating: above the context of most served models,
# and far below the 10M-token prompt a 50 MB row made. The worker also fails prompts over its
# server's own context length.
DEFAULT_MAX_PROMPT_TOKENS = 131_072
# Default cap on a conversation's characters, checked before templating so a huge row never
# reaches the tokenizer (a 50 MB row took 6.6 GB to template). Eight characters per token of
# the token cap: plain text averages about four, so no prompt the token cap keeps is cut here.
DEFAULT_MAX_PROMPT_CHARS = 1_000_000


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """Everything `enqueue` needs; each field is the `enqueue` flag of its name, documented in
    docs/producer.md (max_prompt_tokens None: the campaign's cap, else the default; 0 or None:
    no cap; priority None: the campaign's, else eagle_synth.queue.DEFAULT_PRIORITY; limit None:
    every row). Raises UserError (naming the flag) for a combination the run cannot do."""

    inputs: Sequence[str]
    campaign: str
    tokenizer: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    batch_size: int = DEFAULT_BATCH_SIZE
    turns: Literal["last", "all"] = "last"
    system: str | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict = field(default_factory=dict)
    trust_remote_code: bool = False
    max_prompt_tokens: int | None = None
    max_prompt_chars: int | None = DEFAULT_MAX_PROMPT_CHARS
    max_backlog: int = DEFAULT_MAX_BACKLOG
    max_backlog_mb: int = DEFAULT_MAX_BACKLOG_MB
    strict: bool = False
    allow_truncated: bool = False
    dry_run: bool = False
    processes: int | None = None
    allow_evicting_redis: bool = False
    allow_volatile_redis: bool = False
    history: Literal["dataset", "own"] = "dataset"
    max_turns: int | None = None
    variants: tuple[Variant, ...] = ()
    tool_format: str | None = None
    priority: int | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        own = self.history == "own"
        for broken, message in (
            (self.turns not in ("last", "all"), "--turns must be 'last' or 'all'"),
            (
                (self.max_prompt_tokens or 0) < 0 or (self.max_prompt_chars or 0) < 0,
                "--max-prompt-tokens and --max-prompt-chars must be 0 (no cap) or positive",
            ),
            (self.history not in ("dataset", "own"), "--history must be 'dataset' or 'own'"),
            (
                self.max_turns is not None and not own,
                "--max-turns needs --history own (it caps the turns answered on the model's own answers)",
            ),
            (
                self.max_turns is not None and self.max_turns < 1,
                f"--max-turns {self.max_turns}: give a number of turns, at least 1",
            ),
            (
                own and self.turns == "all",
                "--turns all applies with --history dataset; --history own already answers every turn "
                "(--max-turns caps how many)",
            ),
            (self.tool_format is not None and not own, "--tool-format applies with --history own"),
            (
                self.tool_format is not None and self.tool_format not in TOOL_FORMATS,
                f"--tool-format {self.tool_format!r} is not a known format; choose one of: {', '.join(TOOL_FORMATS)}",
            ),
            (
                own and self.trust_remote_code and self.chat_template is not None,
                "--history own with --trust-remote-code takes the chat format from the model folder, which "
                "workers load from their own copy (worker --tokenizer DIR): put the template in that folder "
                "as chat_template.jinja instead of passing --chat-template",
            ),
            (
                own and self.trust_remote_code and not Path(self.tokenizer).expanduser().is_dir(),
                f"--history own with --trust-remote-code needs --tokenizer to be a local folder (workers check "
                f"their copy against its files), not {self.tokenizer!r}",
            ),
            (self.batch_size < 1, "--batch-size must be at least 1"),
            (
                self.priority is not None and self.priority not in PRIORITIES,
                f"--priority {self.priority}: give {min(PRIORITIES)} to {max(PRIORITIES)} (higher is served first)",
            ),
            (self.limit is not None and self.limit < 1, f"--limit {self.limit}: give a number of rows, at least 1"),
        ):
            if broken:
                raise UserError(message)
