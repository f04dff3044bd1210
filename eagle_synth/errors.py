"""The error tree: what a user can fix, and everything else.

`UserError` is raised for what the person running the command can fix (a bad argument, an
unreadable input, a missing campaign, a server set up to change the data); the CLI prints its
one-line message (exit status 2), which speaks of arguments and values, not of CLI flags. Any
other exception is a bug or an outage: it keeps its traceback.

    EagleSynthError
    ├── UserError
    │   ├── CampaignNotFound             (errors; also a KeyError)
    │   ├── CampaignMismatch, BadCampaignName             (state/campaign.py)
    │   ├── CampaignNotClosable, StateFileUnavailable     (state/campaign_archive.py)
    │   ├── EvictingRedisError, VolatileRedisError        (state/redis_policy.py)
    │   ├── ReadOnlyReplica                               (state/redis_role.py)
    │   ├── NotACampaignFolder, RecordFilesVanished       (records.py)
    │   ├── SamplingError, SettingsError, TemplateError, VariantsError, ToolFormatError
    │   ├── InputError, StrictModeError  (producer/sources.py, producer/enqueue.py)
    │   ├── ConfigError, PreflightError  (workers/config.py, workers/backends/base.py)
    │   └── VocabError, VerifyError, ExportError, CompactBusy, CompactWriteFailed, InspectError,
    │       FlowerAuthError, FlowerPortInUse                (eagle_synth/tools/)
    ├── RecordFormatError, PayloadError  (a damaged or unknown record file or task payload)
    ├── RowError                         (producer/rows.py: one input row; the row is skipped, counted)
    ├── Malformed                        (toolcalls/answer.py: a tool call the parser cannot read)
    ├── LeaseLost, ClaimLeaseLost        (state/fence.py: a fenced write found its lease gone)
    ├── TokenizerUnavailable             (state/tokenizer_store.py)
    ├── ClientError                      (workers/client.py: one request to a server)
    │   ├── BadRequest → BadSamplingParams → SamplingOverridden, UntranslatableSampling
    │   ├── ServerDown, Unauthorized
    │   └── TransientError → BadResponse (workers/replies.py)
    ├── PromptMismatch, RendererMismatch (workers: the server or renderer changed the prompt ids)
    ├── ReplyAborted                     (errors: the server aborted one prompt; it is asked again)
    ├── Requeue, BatchBusy, DiskUnavailable   (workers: a batch's endings)
    └── ProtocolError, QueueFullError   (devserver/: its refusals)

Each subclass also derives from the builtin it stands for (ValueError, FileNotFoundError...)
where callers catch that.
"""

from __future__ import annotations

# Exit status of a command stopped by a UserError.
USER_ERROR_EXIT = 2


class EagleSynthError(Exception):
    """Base of every error eagle-synth raises on purpose."""


class UserError(EagleSynthError):
    """Something the user can fix; the message says what and how, in one line if it can."""

    exit_code = USER_ERROR_EXIT


class CampaignNotFound(UserError, KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no campaign named {name!r} in this Redis; `eagle-synth campaigns` lists them")
        self.name = name

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def clause(value: object) -> str:
    """`value` as text inside a sentence, without its full stop (so no message shows two)."""
    return str(value).rstrip().rstrip(".")


class ReplyAborted(EagleSynthError):
    """A reply whose finish_reason is `abort` (the server dropped the prompt, e.g. from its
    waiting queue): nothing in it may become a record; the prompt is asked again."""
