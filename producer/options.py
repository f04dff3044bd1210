"""What one `enqueue` run is asked to do, its defaults and its checks: the one list of the
`enqueue` flags, each declared (help, form, parsing) by the `Flag` in its field's type, from which
the CLI makes them (eagle_synth/cli/flags.py). Light to import (no Redis, no tokenizer)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from eagle_synth.errors import UserError
from eagle_synth.flags import ALLOW_EVICTING_REDIS, ALLOW_VOLATILE_REDIS, Flag, FlagGroup
from eagle_synth.payload import DEFAULT_BATCH_SIZE
from eagle_synth.priorities import DEFAULT_PRIORITY, PRIORITIES
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


# The help of the flags whose text would not fit the field's line (eagle_synth/flags.py).
TURNS_HELP = (
    "'last': regenerate the answer at the last regeneration point (user turn or tool results); "
    "'all': one prompt per point (with --history dataset)."
)
HISTORY_HELP = (
    "'dataset': prompts on the row's own history; 'own': answer every user turn (and tool results) in order, "
    "each on the model's own earlier answers, replaying the dataset's tool results against the model's own tool calls."
)
MAX_TURNS_HELP = (
    "With --history own: answer at most this many turns per conversation (user turns and, in rows with tools, "
    "tool results)."
)
TOOL_FORMAT_HELP = (
    f"With --history own: the format the model writes tool calls in, one of {', '.join(TOOL_FORMATS)}; "
    "default: detected from the chat template."
)
VARIANTS_HELP = (
    "JSON list of {name, weight, sampling, chat_template_kwargs} variants, one per conversation by a stable hash."
)
CHAT_TEMPLATE_HELP = "Jinja chat template file overriding the tokenizer's."
MAX_PROMPT_TOKENS_HELP = f"Skip prompts longer than this many tokens (0 = no cap). Default: the campaign's, else {DEFAULT_MAX_PROMPT_TOKENS}."
MAX_PROMPT_CHARS_HELP = "Skip conversations with more characters than this, before templating (0 = no cap)."
MAX_BACKLOG_MB_HELP = (
    "Also wait while the campaign's queue, failures and outbox hold more MB than this in Redis (0 = no byte cap; "
    "at most half of Redis's maxmemory)."
)
ALLOW_TRUNCATED_HELP = (
    "Go on past an input file that ends early or cannot be read (one skipped row) instead of stopping there."
)
PRIORITY_HELP = (
    f"0-9, higher is served first across the fleet (default: the campaign's, else {DEFAULT_PRIORITY}); "
    "`eagle-synth priority` changes it later."
)


def path_text(path: Path | None) -> str | None:
    """A path flag's value as the string field it sets."""
    return str(path) if path else None


def no_cap_if_zero(cap: int) -> int | None:
    """A cap flag's value, 0 meaning no cap (None)."""
    return cap or None


def template_kwargs(raw: str | None) -> dict:
    """--chat-template-kwargs: a JSON object, or UserError naming the flag."""
    try:
        kwargs = json.loads(raw) if raw else {}
        if not isinstance(kwargs, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise UserError(f"--chat-template-kwargs must be a JSON object: {exc}") from None
    return kwargs


# The flag reads the arguments as one JSON string.
CHAT_TEMPLATE_KWARGS_FLAG = Flag(
    "Extra template arguments as JSON, e.g. '{\"enable_thinking\": false}'.",
    type=str | None,
    default=None,
    parse=template_kwargs,
)


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """Everything `enqueue` needs; each field but `inputs` (the files) is the `enqueue` flag of
    its name (the sampling flags: SamplingParams' fields), documented in docs/producer.md (max_prompt_tokens None: the campaign's cap, else the default; 0 or None:
    no cap; priority None: the campaign's, else eagle_synth.queue.DEFAULT_PRIORITY; limit None:
    every row). Raises UserError (naming the flag) for a combination the run cannot do."""

    inputs: Sequence[str]
    campaign: Annotated[str, Flag("Campaign name; records go to OUT/NAME/.", names=("--campaign",))]
    tokenizer: Annotated[str, Flag("Tokenizer folder with the model's chat template.", names=("--tokenizer",))]
    sampling: Annotated[SamplingParams, FlagGroup()] = field(default_factory=SamplingParams)
    batch_size: Annotated[int, Flag("Prompts per task.")] = DEFAULT_BATCH_SIZE
    turns: Annotated[Literal["last", "all"], Flag(TURNS_HELP, type=str)] = "last"
    history: Annotated[Literal["dataset", "own"], Flag(HISTORY_HELP, type=str)] = "dataset"
    max_turns: Annotated[int | None, Flag(MAX_TURNS_HELP)] = None
    tool_format: Annotated[str | None, Flag(TOOL_FORMAT_HELP)] = None
    # Read from the --variants file by the command, which knows the run's sampling they vary.
    variants: Annotated[tuple[Variant, ...], Flag(VARIANTS_HELP, type=Path | None, default=None)] = ()
    system: Annotated[str | None, Flag("Default system prompt for rows without one.")] = None
    chat_template: Annotated[str | None, Flag(CHAT_TEMPLATE_HELP, type=Path | None, parse=path_text)] = None
    chat_template_kwargs: Annotated[dict, CHAT_TEMPLATE_KWARGS_FLAG] = field(default_factory=dict)
    trust_remote_code: Annotated[bool, Flag("Allow tokenizers that ship their own code.")] = False
    max_prompt_tokens: Annotated[int | None, Flag(MAX_PROMPT_TOKENS_HELP)] = None
    max_prompt_chars: Annotated[int | None, Flag(MAX_PROMPT_CHARS_HELP, type=int, parse=no_cap_if_zero)] = (
        DEFAULT_MAX_PROMPT_CHARS
    )
    allow_evicting_redis: Annotated[bool, ALLOW_EVICTING_REDIS] = False
    allow_volatile_redis: Annotated[bool, ALLOW_VOLATILE_REDIS] = False
    max_backlog: Annotated[int, Flag("Wait while more prompts than this are pending (0 = never wait).")] = (
        DEFAULT_MAX_BACKLOG
    )
    max_backlog_mb: Annotated[int, Flag(MAX_BACKLOG_MB_HELP)] = DEFAULT_MAX_BACKLOG_MB
    strict: Annotated[bool, Flag("Stop with a nonzero exit at the first skipped row.")] = False
    allow_truncated: Annotated[bool, Flag(ALLOW_TRUNCATED_HELP)] = False
    dry_run: Annotated[bool, Flag("Template and count, print a length histogram, enqueue nothing.")] = False
    priority: Annotated[int | None, Flag(PRIORITY_HELP)] = None
    limit: Annotated[int | None, Flag("Read only the first N input rows (across all files, in order).")] = None
    processes: Annotated[int | None, Flag("Templating processes (default: all cores).")] = None

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
