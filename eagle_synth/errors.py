"""Every error eagle-synth raises on purpose, in one module: what a user can fix, and everything else.

`UserError` is raised for what the person running the command can fix (a bad argument, an
unreadable input, a missing campaign, a server set up to change the data); the CLI prints its
one-line message (exit status 2), which speaks of arguments and values, not of CLI flags. Any
other exception is a bug or an outage: it keeps its traceback.

The tree (a class's builtin bases in parentheses, for callers that catch those; then the module that
raises it). tests/test_errors_tree.py holds it to the classes below, so it cannot drift:

    EagleSynthError (Exception)                       eagle_synth/errors.py
    ├── UserError                                     eagle_synth/errors.py
    │   ├── CampaignNotFound (KeyError)               eagle_synth/tools/status.py
    │   ├── EncoderError (ValueError)                 eagle_synth/encoders.py
    │   ├── BadPriority (ValueError)                  eagle_synth/priorities.py
    │   ├── NotACampaignFolder (FileNotFoundError)    eagle_synth/records.py
    │   ├── RecordFilesVanished (FileNotFoundError)   eagle_synth/records.py
    │   ├── SamplingError (ValueError)                eagle_synth/sampling.py
    │   ├── SettingsError (ValueError)                eagle_synth/settings.py
    │   ├── CampaignMismatch (ValueError)             eagle_synth/state/campaign.py
    │   ├── BadCampaignName (ValueError)              eagle_synth/state/campaign.py
    │   ├── CampaignNotClosable (RuntimeError)        eagle_synth/state/campaign_archive.py
    │   ├── StateFileUnavailable (FileNotFoundError)  eagle_synth/state/campaign_archive.py
    │   ├── CampaignCancelled                         eagle_synth/state/campaign_control.py
    │   ├── EvictingRedisError (RuntimeError)         eagle_synth/state/redis_policy.py
    │   ├── VolatileRedisError (RuntimeError)         eagle_synth/state/redis_policy.py
    │   ├── ReadOnlyReplica                           eagle_synth/state/redis_role.py
    │   ├── TemplateError (ValueError)                eagle_synth/templating.py
    │   ├── TokenizerFolderError (ValueError)         eagle_synth/tokenizer_files.py
    │   ├── ToolFormatError (ValueError)              eagle_synth/toolcalls/__init__.py
    │   ├── CompactBusy (RuntimeError)                eagle_synth/tools/compact.py
    │   ├── CompactWriteFailed (OSError)              eagle_synth/tools/compact.py
    │   ├── ExportError (ValueError)                  eagle_synth/tools/filters.py
    │   ├── FlowerAuthError (ValueError)              eagle_synth/tools/flower.py
    │   ├── FlowerPortInUse (OSError)                 eagle_synth/tools/flower.py
    │   ├── InspectError (LookupError)                eagle_synth/tools/inspect.py
    │   ├── VerifyError (ValueError)                  eagle_synth/tools/verify.py
    │   ├── VocabError (ValueError)                   eagle_synth/tools/vocab.py
    │   ├── VariantsError (ValueError)                eagle_synth/variants.py
    │   ├── StrictModeError (RuntimeError)            producer/enqueue.py
    │   ├── DamagedInputError (RuntimeError)          producer/enqueue.py
    │   ├── InputError                                producer/sources.py
    │   ├── PreflightError (RuntimeError)             workers/servers/preflight.py
    │   └── ConfigError                               workers/config.py
    ├── ProtocolError                                 eagle_synth/devserver/protocol.py
    ├── QueueFullError                                eagle_synth/devserver/scheduler.py
    ├── PayloadError (ValueError)                     eagle_synth/payload.py
    ├── RecordFormatError (ValueError)                eagle_synth/records.py
    ├── LeaseLost                                     eagle_synth/state/fence.py
    ├── ClaimLeaseLost                                eagle_synth/state/fence.py
    ├── TokenizerUnavailable (RuntimeError)           eagle_synth/state/tokenizer_store.py
    ├── Malformed (ValueError)                        eagle_synth/toolcalls/answer.py
    ├── RowError                                      producer/rows.py
    ├── Requeue                                       workers/batch.py
    ├── Cancelled                                     workers/batch.py
    ├── ClientError                                   workers/servers/transport.py
    │   ├── ServerDown                                workers/servers/transport.py
    │   ├── TransientError                            workers/servers/transport.py
    │   │   └── BadResponse                           workers/replies.py
    │   ├── BadRequest                                workers/servers/transport.py
    │   │   └── BadSamplingParams                     workers/servers/transport.py
    │   │       ├── UntranslatableSampling            workers/backends/sglang.py
    │   │       └── SamplingOverridden                workers/backends/vllm.py
    │   └── Unauthorized                              workers/servers/transport.py
    ├── DiskUnavailable                               workers/batch.py
    ├── BatchBusy                                     workers/lease.py
    ├── RendererMismatch (RuntimeError)               workers/renderer.py
    ├── PromptMismatch                                workers/replies.py
    └── ReplyAborted                                  workers/replies.py
    CommitUnsure (redis.ConnectionError)              eagle_synth/state/fence.py
"""

from __future__ import annotations

import os
from pathlib import Path

import redis

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


class EncoderError(UserError, ValueError):
    """A model folder's encoder that cannot be used; the message names the file and what to do."""


class BadPriority(UserError, ValueError):
    """A priority outside PRIORITIES."""


class NotACampaignFolder(UserError, FileNotFoundError):
    """A folder given as OUT/<campaign> has no records folder (`records_folder`, records.records_dir)."""

    def __init__(self, records_folder: Path, campaign_path: str | os.PathLike) -> None:
        super().__init__(f"{records_folder} does not exist: is {campaign_path} a campaign folder (OUT/<campaign>)?")


class RecordFilesVanished(UserError, FileNotFoundError):
    """Record files listed a moment ago are gone and no shard holds them."""


class SamplingError(UserError, ValueError):
    """A sampling parameter is out of range; the message names the flag and the range."""


class SettingsError(UserError, ValueError):
    """A setting has a value that cannot work; the message says which and how to fix it."""


class CampaignMismatch(UserError, ValueError):
    """Enqueuing into a campaign whose stored settings differ; the message lists each field."""


class BadCampaignName(UserError, ValueError):
    """A campaign name that cannot be a folder and a Redis key prefix; the message says what works."""


class CampaignNotClosable(UserError, RuntimeError):
    """The campaign is not complete or its records are not all here; the message says why and what to do."""


class StateFileUnavailable(UserError, FileNotFoundError):
    """An ended campaign's state file is not readable here; the message names the file and its host."""


class CampaignCancelled(UserError):
    """The campaign was cancelled: nothing is enqueued under its name until the marker is forgotten."""


class EvictingRedisError(UserError, RuntimeError):
    """Redis may evict keys; the message says which policy and how to fix or override it."""


class VolatileRedisError(UserError, RuntimeError):
    """Redis persists nothing (no AOF, no RDB save schedule); the message says how to fix or override."""


class ReadOnlyReplica(UserError):
    """The Redis at REDIS_URL is a read-only replica. Parameters: its address and its master's."""

    def __init__(self, address: str, master: str) -> None:
        super().__init__(
            f"the Redis at {address} is a read-only replica of {master}: point REDIS_URL (or --redis) "
            "at the master, which takes the campaign's writes"
        )


class TemplateError(UserError, ValueError):
    """The chat template rejected a conversation; the message is the template's own."""


class TokenizerFolderError(UserError, ValueError):
    """A local tokenizer folder that is not the campaign's; one line naming the folder and the file."""


class ToolFormatError(UserError, ValueError):
    """No usable tool-call format: the message names the flag to pass and the choices."""


class CompactBusy(UserError, RuntimeError):
    """Another `eagle-synth compact` holds this campaign folder."""


class CompactWriteFailed(UserError, OSError):
    """A shard could not be written (a full disk, a quota, a read-only or failing folder). Its
    temporary file is gone and its batch files are kept, so the campaign reads as before; shards
    finished earlier in the run stand. Parameters: the records folder, the OSError, shards done."""

    def __init__(self, folder: Path, error: OSError, shards_done: int) -> None:
        super().__init__(
            f"cannot write a shard in {folder}: {error.strerror or error} (errno {error.errno}); "
            f"its batch files are kept and the campaign reads as before ({shards_done} shards written "
            "before it stand): free space, then run compact again"
        )


class ExportError(UserError, ValueError):
    """An export or vocab argument (filters, split, format, output) that cannot work; says what to give."""


class FlowerAuthError(UserError, ValueError):
    """Flower's credentials are missing, malformed or a placeholder; the message says what to do."""


class FlowerPortInUse(UserError, OSError):
    """Flower's port is taken on its address; the message names --port."""


class InspectError(UserError, LookupError):
    """No record, or several, match what was asked; the message says what to give instead."""


class VerifyError(UserError, ValueError):
    """verify cannot run as asked (no vocabulary size known); the message says what to pass."""


class VocabError(UserError, ValueError):
    """A vocabulary mapping cannot be built as asked; the message says what to pass."""


class VariantsError(UserError, ValueError):
    """A variants file that cannot be used; the message names the file, the entry and the field."""


class StrictModeError(UserError, RuntimeError):
    """--strict and a row was skipped; the message names the row and the reason."""


class DamagedInputError(UserError, RuntimeError):
    """An input file ends early or cannot be read, without --allow-truncated; the message names
    the file, where, and how many rows were read from it before the damage."""


class InputError(UserError):
    """An input cannot be used at all; the message names it and says what to do."""


class PreflightError(UserError, RuntimeError):
    """The server is configured in a way that would change the records; says how to fix it."""


class ConfigError(UserError):
    """A worker setting has a value that cannot work; the message names it."""


class ProtocolError(EagleSynthError):
    """A request the real server refuses with HTTP `status` (500: SGLang's uncaught TypeError);
    `param` is the field vLLM names in its error body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class QueueFullError(EagleSynthError):
    pass


class PayloadError(EagleSynthError, ValueError):
    """A queued message is not a payload this version understands."""


class RecordFormatError(EagleSynthError, ValueError):
    """A record file is damaged or of an unknown format; the message names the file."""


class LeaseLost(EagleSynthError):
    """The batch lease is no longer the writer's: nothing was written."""


class ClaimLeaseLost(EagleSynthError):
    """The batch's own lease was gone when it tried to claim its keys."""


class TokenizerUnavailable(EagleSynthError, RuntimeError):
    """The campaign's tokenizer cannot be had on this worker; the message says what to do."""


class Malformed(EagleSynthError, ValueError):
    """A tool call that does not follow its format; the message says where and how."""


class RowError(EagleSynthError):
    """A row that cannot become a conversation: ``reason`` a stable slug, ``field`` the path of
    the offending value (``"messages[2].content"``), None when the whole row is at fault."""

    def __init__(self, reason: str, field: str | None, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.reason = reason
        self.field = field


class Requeue(EagleSynthError):
    """The batch (what is left of it) must go back to the queue: no healthy server, the task's
    time budget is spent, or the worker is shutting down. Not a failure: no retry is used."""


class Cancelled(EagleSynthError):
    """`eagle-synth cancel` ended the batch's campaign: the batch stops where it is, writes
    nothing more, and its message is acknowledged (the campaign's state is gone)."""

    def __init__(self, campaign: str) -> None:
        super().__init__(f"campaign {campaign} was cancelled")


class ClientError(EagleSynthError):
    """Base of the client's errors (the message says what the server answered, if it did)."""


class ServerDown(ClientError):
    """The server is not accepting connections (loading weights, dead, restarting)."""


class TransientError(ClientError):
    """A failure that may pass: timeout, dropped connection, 429, 5xx."""


class BadResponse(TransientError):
    """A 200 reply item that cannot be a record; the message says what was wrong with it."""


class BadRequest(ClientError):
    """The server refused the request as malformed (HTTP 400); its message is kept."""


class BadSamplingParams(BadRequest):
    """HTTP 400 about the campaign's sampling: the caller stops the campaign instead of failing its prompts."""


class UntranslatableSampling(BadSamplingParams):
    """The campaign's sampling has no exact equivalent on this kind of server (a key it does
    not have, a value it would change); the message says which and why. Like a 400 about the
    sampling, it fails the campaign's prompts as `bad-sampling-params` before any is sent."""


class SamplingOverridden(BadSamplingParams):
    """A 200 reply proves the server did not sample as asked (e.g. `length` before the
    max_tokens sent: a server-side cap such as vLLM's --override-generation-config): handled
    like a refusal of the sampling parameters, as every prompt would meet it."""


class Unauthorized(ClientError):
    """HTTP 401 or 403: the server checks an API key and this worker sent none, or another one."""


class DiskUnavailable(EagleSynthError):
    """Records cannot be written to the output folder; the batch goes back to the queue."""


class BatchBusy(EagleSynthError):
    """Another live batch thread holds this batch; try the message again later."""


class RendererMismatch(EagleSynthError, RuntimeError):
    """The stored tokenizer is not the campaign's (fingerprint or template differs)."""


class PromptMismatch(EagleSynthError):
    """The server generated from another prompt than the one sent (another length; on vLLM,
    which echoes the ids, any other id). Not transient; the message gives both lengths."""


class CommitUnsure(redis.ConnectionError):
    """A fenced commit was sent but its reply was lost: Redis may have applied it or not.
    `receipt` names the try; Fence.settle tells which it was once Redis answers again."""

    def __init__(self, message: str, receipt: str) -> None:
        super().__init__(message)
        self.receipt = receipt


def clause(value: object) -> str:
    """`value` as text inside a sentence, without its full stop (so no message shows two)."""
    return str(value).rstrip().rstrip(".")


class ReplyAborted(EagleSynthError):
    """A reply whose finish_reason is `abort` (the server dropped the prompt, e.g. from its
    waiting queue): nothing in it may become a record; the prompt is asked again."""
