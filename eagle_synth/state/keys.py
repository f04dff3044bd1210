"""Redis key names, all under KEY_PREFIX (one SCAN pattern; Celery's own keys are not named here),
and the names of a campaign's counters (fields of CampaignKeys.counters). Lua scripts get the
counter names through `in_lua`, so script and Python cannot drift apart. Renaming any of these
orphans the data of running campaigns: they are the Redis data layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

# Prefix of every key eagle-synth writes.
KEY_PREFIX = "eagle-synth"
# Set of campaign names, for `eagle-synth campaigns`.
CAMPAIGNS = f"{KEY_PREFIX}:campaigns"
# How long a worker's heartbeat hash lives without being refreshed, seconds.
WORKER_TTL = 30
# Sorted set node -> when its heartbeat expires: `status` finds workers without a SCAN.
WORKERS_INDEX = f"{KEY_PREFIX}:workers"
# Strings with a TTL: the worker whose reaper / reconciler runs this round.
REAPER_LOCK = f"{KEY_PREFIX}:reaper"
RECONCILER_LOCK = f"{KEY_PREFIX}:reconciler"
# Hash host queue -> its campaign queue: the host queues that may hold a conversation's next
# turns (eagle_synth/queue.py host_queue; workers/handoff.py drops those it finds empty).
HOST_QUEUES = f"{KEY_PREFIX}:host-queues"
# Hash of the reconciler's memory between rounds (Redis run id last seen, rounds with a deficit).
RECONCILER_STATE = f"{KEY_PREFIX}:reconciler-state"


def worker_key(node: str) -> str:
    """Hash of one worker's heartbeat: host, servers, their health state, in-flight prompts."""
    return f"{KEY_PREFIX}:worker:{node}"


def tokenizer_blob(fingerprint: str, chat_template_hash: str) -> str:
    """String: a campaign's tokenizer files, stored once by `enqueue --history own` (tokenizer_store.py)."""
    return f"{KEY_PREFIX}:tokenizer:{fingerprint}-{chat_template_hash}"


def followup_owner(owner: str) -> str:
    """String with a TTL: a worker process that holds follow-up turns is alive."""
    return f"{KEY_PREFIX}:followup-owner:{owner}"


class _Key:
    """A campaign key name: `<KEY_PREFIX>:campaign:<name>:<the attribute's name, '_' as '-'>`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.suffix = name.replace("_", "-")

    def __get__(self, keys: CampaignKeys, owner: type | None = None) -> str:
        return f"{keys.base}:{self.suffix}"


@dataclass(frozen=True, slots=True)
class CampaignKeys:
    """Key names of one campaign's state (`name`: `enqueue --campaign`); each comment says what it holds."""

    name: str

    @property
    def base(self) -> str:
        return f"{KEY_PREFIX}:campaign:{self.name}"

    # String: the settings as JSON, written once by the first enqueue.
    settings = _Key()
    # Set of the prompt keys enqueued and not done (pending or failed).
    enqueued = _Key()
    # String: the key sets' layout (campaign.LAYOUT); absent before done keys left `enqueued`.
    layout = _Key()
    # Set of prompt keys whose record is on disk.
    done = _Key()
    # Hashes prompt key -> its stored failure (Failure.encode), and reason -> how many.
    failed = _Key()
    failed_reasons = _Key()
    # Hash of integer counters (the names below).
    counters = _Key()
    # Stream of completions (records, tokens) for throughput over the last minute.
    events = _Key()
    # Hash server URL -> server info JSON seen by the workers (provenance).
    servers = _Key()
    # Hash of claimed, unpublished prompt chunks (outbox.py).
    outbox = _Key()
    # String (JSON: path, host, at, done, failed): the campaign was closed (campaign_archive.py).
    ended = _Key()
    # Hash (run scope | file | size | mtime) -> last fully claimed line (producer/resume.py).
    cursors = _Key()
    # Hash prompt key -> the batch lease (key and holder) generating it right now (fence.py).
    claims = _Key()
    # Hash batch id -> every published, unfinished batch: what the reconciler republishes (batch_store.py).
    batches = _Key()
    # Hash reason -> count of input rows the producer skipped.
    skipped = _Key()
    # Hash input source -> rows the latest enqueue of it read and skipped (JSON; eagle_synth.input_rows).
    input_rows = _Key()
    # Hash turn key -> a conversation's next turn until its batch is out: the follow-up outbox.
    followups = _Key()
    # Hash batch id -> a batch of follow-up turns formed but maybe not yet published.
    followup_batches = _Key()
    # Hash (turn key, or `batch:` + batch id) -> the worker process that holds that entry.
    followup_owners = _Key()
    # Hash conversation key -> why it stopped early (JSON: reason, turn, row, message).
    conversation_ends = _Key()
    # String: the campaign's priority (`enqueue --priority`, `eagle-synth priority`; absent: the default).
    priority = _Key()
    # String: when the campaign's queued batches were last raised a priority level for waiting (aging).
    aged_at = _Key()
    # String (JSON: at, queued, held, done, failed): `eagle-synth cancel` ended the campaign;
    # the one key a cancelled campaign keeps (campaign_control.py).
    cancelled = _Key()

    def producer(self, run_id: str) -> str:
        """String with a TTL: an enqueue run is alive; its outbox entries are its own."""
        return f"{self.base}:producer:{run_id}"

    def lease(self, batch: str) -> str:
        """String: which batch thread (host|pid|token) runs a batch right now (a renewed, expiring lease)."""
        return f"{self.base}:lease:{batch}"

    def receipts(self, batch: str) -> str:
        """Hash lease holder -> the receipt of its last applied commit of a batch (state/fence.py),
        expiring a day after it: how a commit whose reply was lost is told applied or not."""
        return f"{self.base}:receipts:{batch}"


# Counter names.
# Input rows the producer read and skipped; prompt keys it enqueued for the first time.
ROWS_READ = "rows-read"
ROWS_SKIPPED = "rows-skipped"
PROMPTS_ENQUEUED = "prompts-enqueued"
# Records on disk (keys marked done), and their prompt and output tokens.
RECORDS = "records"
TOKENS_IN = "tokens-in"
TOKENS_OUT = "tokens-out"
# Of TOKENS_IN, those the server found in its prefix cache (the records' cached_tokens).
TOKENS_CACHED = "tokens-cached"
# Records whose output began with prompt-tail ids the worker dropped (an old SGLang bug).
REPAIRED_PREFIX = "repaired-prefix"
# Done keys `repair` took back out of done because their record file was damaged.
RECORDS_DAMAGED = "records-damaged"
# Conversations the producer started (`--history own`).
CONVERSATIONS = "conversations"
# Prefixes of the per-reason counts of failures ever recorded (`failed-server-error`) and of
# conversation ends (`conversations-complete`).
FAILED_PREFIX = "failed-"
CONVERSATION_END_PREFIX = "conversations-"

# What `in_lua` substitutes: `$RECORDS` in a script becomes RECORDS's value (every name above).
_LUA_NAMES = {name: value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)}


def failed_counter(reason: str) -> str:
    """Counter of failures ever recorded with this reason (retries do not lower it)."""
    return FAILED_PREFIX + reason


def conversation_end_counter(reason: str) -> str:
    return CONVERSATION_END_PREFIX + reason  # eagle_synth.conversation.END_REASONS


def in_lua(script: str) -> str:
    """A Lua script's text with each `$NAME` replaced by the counter name NAME
    (KeyError for an unknown one, so a typo fails at import, not in Redis)."""
    return Template(script).substitute(_LUA_NAMES)
