"""Redis key names: the one place producer, workers and tools agree on them.

Everything eagle-synth keeps in Redis starts with KEY_PREFIX, so an operator can see (and
back up) it with one SCAN pattern. Celery's own keys (the queue list, `unacked`, ...) are
Celery's business and are not named here.
"""

from __future__ import annotations

from dataclasses import dataclass

# Prefix of every key eagle-synth writes.
KEY_PREFIX = "eagle-synth"
# Set of campaign names, for `eagle-synth campaigns`.
CAMPAIGNS = f"{KEY_PREFIX}:campaigns"
# How long a worker's heartbeat hash lives without being refreshed, seconds.
WORKER_TTL = 30
# Sorted set node -> unix time its heartbeat hash expires: how `status` finds workers without
# scanning the keyspace (a SCAN of a 10M-prompt Redis walks every key); the reader prunes it.
WORKERS_INDEX = f"{KEY_PREFIX}:workers"
# Strings with a TTL: the worker whose reaper sweeps for stranded batches, and whose reconciler
# looks for lost batches, this round.
REAPER_LOCK = f"{KEY_PREFIX}:reaper"
RECONCILER_LOCK = f"{KEY_PREFIX}:reconciler"
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
    # Set of the prompt keys enqueued and not done (pending or failed); with `done`, every key ever
    # enqueued (the producer's duplicate check).
    enqueued = _Key()
    # String: the key sets' layout (campaign.LAYOUT); absent before done keys left `enqueued`.
    layout = _Key()
    # Set of prompt keys whose record is on disk.
    done = _Key()
    # Hash prompt key -> its failure as stored (Failure.encode); reason -> how many are in it.
    failed = _Key()
    failed_reasons = _Key()
    # Hash of integer counters (eagle_synth.state.counters).
    counters = _Key()
    # Stream of completions (records, tokens) for throughput over the last minute.
    events = _Key()
    # Hash server URL -> server info JSON seen by the workers (provenance).
    servers = _Key()
    # Hash of claimed-but-not-yet-published prompt chunks, replayed after a killed enqueue (outbox.py).
    outbox = _Key()
    # String (JSON: path, host, at, done, failed): the campaign was closed, its key sets folded into
    # the file at `path` on `host` and freed (campaign_archive.py); workers leave it alone.
    ended = _Key()
    # Hash (run scope | input file | size | mtime) -> the last line of that file whose rows are all
    # claimed: a rerun skips them before templating (producer/resume.py).
    cursors = _Key()
    # Hash prompt key -> the batch lease (key and holder) generating it right now (fence.py).
    claims = _Key()
    # Hash batch id -> every published, unfinished batch: what the reconciler republishes (batch_store.py).
    batches = _Key()
    # Hash reason -> count of input rows the producer skipped.
    skipped = _Key()
    # Hash input source -> rows the latest enqueue of it read and skipped (JSON; eagle_synth.input_rows).
    input_rows = _Key()
    # Hash turn key -> a conversation's next turn between its previous turn's commit and its batch
    # (to render, or rendered and claimed): the follow-up outbox.
    followups = _Key()
    # Hash batch id -> a batch of follow-up turns formed but maybe not yet published.
    followup_batches = _Key()
    # Hash (turn key, or `batch:` + batch id) -> the worker process that holds that entry.
    followup_owners = _Key()
    # Hash conversation key -> why it stopped early (JSON: reason, turn, row, message).
    conversation_ends = _Key()

    def producer(self, run_id: str) -> str:
        """String with a TTL: an enqueue run is alive; its outbox entries are its own."""
        return f"{self.base}:producer:{run_id}"

    def lease(self, batch: str) -> str:
        """String: which batch thread (host|pid|token) runs a batch right now (a renewed, expiring lease)."""
        return f"{self.base}:lease:{batch}"
