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


def worker_key(node: str) -> str:
    """Hash of one worker's heartbeat: host, servers, their health state, in-flight prompts."""
    return f"{KEY_PREFIX}:worker:{node}"


# Sorted set node -> unix time its heartbeat hash expires: how `status` finds workers without
# scanning the keyspace (a SCAN of a 10M-prompt Redis walks every key). Entries past their
# time are pruned by the reader.
WORKERS_INDEX = f"{KEY_PREFIX}:workers"
# String with a TTL: the worker whose reaper sweeps for stranded batches this round.
REAPER_LOCK = f"{KEY_PREFIX}:reaper"
# String with a TTL: the worker whose reconciler looks for lost batches this round.
RECONCILER_LOCK = f"{KEY_PREFIX}:reconciler"
# Hash of the reconciler's memory between rounds (Redis run id last seen, rounds with a deficit).
RECONCILER_STATE = f"{KEY_PREFIX}:reconciler-state"


def tokenizer_blob(fingerprint: str, chat_template_hash: str) -> str:
    """String: a campaign's tokenizer files (zstd msgpack), stored once by `enqueue --history own`
    so that workers render follow-up turns with the identical tokenizer and template."""
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
    """Key names of one campaign's state (`name`: the campaign name given to `enqueue --campaign`).
    Each attribute's comment says what its key holds."""

    name: str

    @property
    def base(self) -> str:
        return f"{KEY_PREFIX}:campaign:{self.name}"

    # String: the campaign's settings as JSON, written once by the first enqueue.
    settings = _Key()
    # Set of the prompt keys enqueued and not done (pending or failed): with `done`, every key ever enqueued,
    # the producer's duplicate check. A key marked done leaves it (layout 2).
    enqueued = _Key()
    # String: the layout of the key sets (eagle_synth.state.campaign.LAYOUT); absent in a campaign made before
    # done keys left `enqueued`, which Campaign.progress moves over once.
    layout = _Key()
    # Set of prompt keys whose record is on disk.
    done = _Key()
    # Hash prompt key -> its failure as stored (Failure.encode: reason, message, the item to replay).
    failed = _Key()
    # Hash reason -> number of prompts currently in `failed` with that reason.
    failed_reasons = _Key()
    # Hash of integer counters (rows read, prompts enqueued, tokens in/out...), named in
    # eagle_synth.state.counters.
    counters = _Key()
    # Stream of completions (records, tokens) for throughput over the last minute.
    events = _Key()
    # Hash server URL -> server info JSON seen by the workers (provenance).
    servers = _Key()
    # Hash of claimed-but-not-yet-published prompt chunks, replayed after a killed enqueue.
    outbox = _Key()
    # String (JSON: path, host, at, done, failed): the campaign was closed (`eagle-synth close`): its
    # enqueued, done and failed sets were folded into the file at `path` on `host` and freed. Workers and
    # reconcilers leave an ended campaign alone; `enqueue` and `retry-failed` read the file back
    # (eagle_synth/state/campaign_archive.py) before going on.
    ended = _Key()
    # Hash (run scope | input file | size | mtime) -> the last line of that file whose rows are all claimed: a
    # rerun skips them before templating (producer/resume.py).
    cursors = _Key()
    # Hash prompt key -> the batch lease (key and holder) whose batch generates it right now: at most one live
    # batch generates a key, whatever published it (eagle_synth/state/claims.py).
    claims = _Key()
    # Hash batch id -> every published batch not yet finished (its payload and when it was published): what
    # the reconciler publishes again when a batch is lost (eagle_synth/state/batch_store.py).
    batches = _Key()
    # Hash reason -> count of input rows the producer skipped.
    skipped = _Key()
    # Hash input source -> rows the latest enqueue of that source read and skipped (JSON;
    # eagle_synth.input_rows): `status` figures that a rerun replaces instead of adding to.
    input_rows = _Key()
    # Hash turn key -> a conversation's next turn between its previous turn's commit and its batch (to render,
    # or rendered and claimed): the follow-up outbox.
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
