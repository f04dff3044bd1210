"""A campaign: its settings, fixed at first enqueue, and its progress, kept in Redis.

Exactly one of these holds for every prompt key ever enqueued: it is pending, its record is
on disk (`done`), or its failure is recorded (`failed`). The producer adds keys; workers move
them to done or failed; `retry-failed` moves failed keys back to pending; `repair` moves done
keys whose record files are damaged back to pending, or to failed when their prompt is lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from itertools import islice

import msgpack
import redis
import zstandard

from eagle_synth.errors import UserError
from eagle_synth.payload import PromptItem, pack_item, unpack_item
from eagle_synth.state import counters
from eagle_synth.state.counters import in_lua
from eagle_synth.state.fence import Fence
from eagle_synth.state.keys import CAMPAIGNS, CampaignKeys
from eagle_synth.state.outbox import Outbox
from eagle_synth.state.redis_client import text

# Completion events kept per campaign for throughput figures (about the last few minutes).
EVENTS_MAXLEN = 20_000
# Settings fields that do not change what a campaign generates, so they may differ.
# model_vocab_size and tokenizer_canary follow from the tokenizer folder (its fingerprint is compared);
# batch_size only groups prompts into tasks.
_IGNORED_IN_DIFF = frozenset({"created_at", "tokenizer_path", "batch_size", "model_vocab_size", "tokenizer_canary"})
# Keys moved from done to failed per Redis round trip.
FAILURE_CHUNK = 1000
# Keys read from the done set per SSCAN step.
DONE_SCAN_COUNT = 10_000
# Failures read per HSCAN step by `failed` and `retry-failed`: a few MB of 2k-token prompts, so
# both commands stay in bounded memory however many failures a campaign has.
FAILURE_SCAN_COUNT = 500
# Leading bytes of a compact failure (Failure.encode): `F1 <reason>\n<zstd msgpack>`. The reason
# stays readable so Lua scripts count it without decoding; the old format is JSON (starts '{').
FAILURE_MAGIC = b"F1 "
# zstd level of a stored failure: ids compress to ~1.4 B a token at level 3 (JSON ids: ~5.6).
FAILURE_ZSTD_LEVEL = 3

# A Lua function every script that reads a failure's reason uses: it reads both the compact
# failure layout and the JSON one campaigns enqueued before it still hold.
FAILURE_REASON_LUA = """
local function failure_reason(raw)
  if string.sub(raw, 1, 3) == 'F1 ' then
    return string.sub(raw, 4, string.find(raw, '\\n', 4, true) - 1)
  end
  return cjson.decode(raw)['reason']
end
"""

# KEYS: failed hash, reasons hash. ARGV: prompt key, failure JSON, reason.
# Keeps the per-reason counts equal to what the failed hash holds.
_RECORD_FAILURE = (
    FAILURE_REASON_LUA
    + """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then redis.call('HINCRBY', KEYS[2], failure_reason(old), -1) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
return 1
"""
)
# KEYS: failed hash, reasons hash. ARGV: prompt keys. Returns how many were removed.
_DROP_FAILURES = (
    FAILURE_REASON_LUA
    + """
local removed = 0
for i = 1, #ARGV do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if old then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HINCRBY', KEYS[2], failure_reason(old), -1)
    removed = removed + 1
  end
end
return removed
"""
)

# KEYS: failed hash, reasons hash. ARGV: prompt keys. Returns the keys it removed: a key listed
# twice (HSCAN may return one twice) or dropped meanwhile is taken once, so it is queued once.
_TAKE_FAILURES = (
    FAILURE_REASON_LUA
    + """
local taken = {}
for i = 1, #ARGV do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if old then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HINCRBY', KEYS[2], failure_reason(old), -1)
    taken[#taken + 1] = ARGV[i]
  end
end
return taken
"""
)


# Lua functions shared by every script that marks keys done (this module's and
# eagle_synth/state/conversation_store.py's). KEYS[1..5]: done set, failed hash, reasons hash,
# counters hash, events stream.
MARK_DONE_LUA = FAILURE_REASON_LUA + in_lua(
    """
local function mark_done(key)
  local added = redis.call('SADD', KEYS[1], key)
  local old = redis.call('HGET', KEYS[2], key)
  if old then
    redis.call('HDEL', KEYS[2], key)
    redis.call('HINCRBY', KEYS[3], failure_reason(old), -1)
  end
  return added
end
local function count_done(added, tokens_in, tokens_out, repaired, maxlen)
  if added > 0 then
    redis.call('HINCRBY', KEYS[4], '$RECORDS', added)
    redis.call('HINCRBY', KEYS[4], '$TOKENS_IN', tokens_in)
    redis.call('HINCRBY', KEYS[4], '$TOKENS_OUT', tokens_out)
    if tonumber(repaired) > 0 then redis.call('HINCRBY', KEYS[4], '$REPAIRED_PREFIX', repaired) end
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', maxlen, '*',
               'records', added, 'tokens_out', tokens_out, 'tokens_in', tokens_in)
  end
end
"""
)
# ARGV: tokens_in, tokens_out, repaired, events maxlen, then prompt keys.
# One round trip for what a finished batch changes; counts only keys that were new.
_MARK_DONE = (
    MARK_DONE_LUA
    + """
local added = 0
for i = 5, #ARGV do added = added + mark_done(ARGV[i]) end
count_done(added, ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return added
"""
)
# KEYS: done set, counters hash. ARGV: prompt keys. Returns how many were done.
# Takes keys whose records were lost back out of `done`, keeping the records counter true.
_UNDO_DONE = in_lua(
    """
local removed = 0
for i = 1, #ARGV do removed = removed + redis.call('SREM', KEYS[1], ARGV[i]) end
if removed > 0 then
  redis.call('HINCRBY', KEYS[2], '$RECORDS', -removed)
  redis.call('HINCRBY', KEYS[2], '$RECORDS_DAMAGED', removed)
end
return removed
"""
)
# KEYS: done set, failed hash, reasons hash, counters hash. ARGV: reason, then key, failure
# JSON pairs. Moves done keys to failed in one step; keys no longer done are left alone.
# Writes that need memory come before the SREM, so a full Redis never leaves a key in neither.
_DONE_TO_FAILED = in_lua(
    """
local moved = 0
for i = 2, #ARGV, 2 do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 1 then
    if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) == 1 then
      redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
    end
    redis.call('SREM', KEYS[1], ARGV[i])
    moved = moved + 1
  end
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[4], '$RECORDS', -moved)
  redis.call('HINCRBY', KEYS[4], '$RECORDS_DAMAGED', moved)
  redis.call('HINCRBY', KEYS[4], '$FAILED_PREFIX' .. ARGV[1], moved)
end
return moved
"""
)


class CampaignMismatch(UserError, ValueError):
    """Enqueuing into a campaign whose stored settings differ; the message lists each field."""


class BadCampaignName(UserError, ValueError):
    """A campaign name that cannot be a folder and a Redis key prefix; the message says what works."""


def check_campaign_name(name: str) -> None:
    """Raise BadCampaignName unless `name` can be a folder name and a Redis key prefix."""
    if not name or any(c in name for c in "/\\:* \t\n") or name.startswith("."):
        raise BadCampaignName(f"campaign name {name!r} is not usable: use letters, digits, '-', '_' and '.'")


@dataclass(frozen=True, slots=True)
class CampaignSettings:
    """What every prompt of a campaign is made with.

    Parameters:
        name: campaign name.
        tokenizer_path: where the producer loaded the tokenizer from (informational).
        tokenizer_fingerprint: hash of the tokenizer's vocabulary and special tokens.
        chat_template_hash: hash of the chat template text used.
        chat_template_kwargs: extra template arguments (e.g. enable_thinking).
        system_prompt: the default system prompt, if any.
        sampling: SamplingParams.to_dict().
        vocab_size: ids must be below this; workers never send a larger one.
        eos_token_ids: ids that end a generation.
        think_open_id, think_close_id: ids of `<think>` and `</think>` if the tokenizer has them.
        max_prompt_tokens: longer prompts were skipped by the producer.
        created_at: unix time of the first enqueue.
        history: "dataset" (prompts end at the dataset's user turns) or "own" (every user turn
            answered in order on the model's own earlier answers; docs/producer.md).
        max_turns: with history "own", conversations stop after this many answered turns.
        variants: the variants list (eagle_synth.variants.Variant.to_dict), if any.
        tool_format: with history "own", the format the model's tool calls are parsed in (one of
            eagle_synth.toolcalls.TOOL_FORMATS), or None when the template has none we parse.
        batch_size: prompts per task of the first enqueue, which `retry-failed` batches by
            (0: not recorded, a campaign from before it was; a rerun may use another size).
        model_vocab_size: the checkpoint's vocab_size (config.json beside the tokenizer), which
            padded vocabularies make larger than vocab_size; output ids may reach it. None when
            the tokenizer folder has no config.json (eagle_synth/model_identity.py).
        tokenizer_canary: {"text", "ids"}: a text with special tokens and the ids this tokenizer
            gives it; a server whose /tokenize differs serves another model. Empty: not checked.
    """

    name: str
    tokenizer_path: str
    tokenizer_fingerprint: str
    chat_template_hash: str
    chat_template_kwargs: dict = field(default_factory=dict)
    system_prompt: str | None = None
    sampling: dict = field(default_factory=dict)
    vocab_size: int = 0
    eos_token_ids: list[int] = field(default_factory=list)
    think_open_id: int | None = None
    think_close_id: int | None = None
    max_prompt_tokens: int | None = None
    created_at: float = 0.0
    history: str = "dataset"
    max_turns: int | None = None
    variants: list = field(default_factory=list)
    tool_format: str | None = None
    batch_size: int = 0
    model_vocab_size: int | None = None
    tokenizer_canary: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> CampaignSettings:
        data = json.loads(raw)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def differences(self, other: CampaignSettings) -> list[str]:
        """Human lines `field: stored X, given Y` for every field that changes the output."""
        mine, theirs = asdict(self), asdict(other)
        lines = []
        for name in sorted(mine):
            if name in _IGNORED_IN_DIFF or mine[name] == theirs[name]:
                continue
            if isinstance(mine[name], dict) and isinstance(theirs[name], dict):
                for key in sorted(set(mine[name]) | set(theirs[name])):
                    if mine[name].get(key) != theirs[name].get(key):
                        lines.append(
                            f"{name}.{key}: campaign has {mine[name].get(key)!r}, "
                            f"this run has {theirs[name].get(key)!r}"
                        )
            else:
                lines.append(f"{name}: campaign has {mine[name]!r}, this run has {theirs[name]!r}")
        return lines


# Failure reason of a done prompt whose record file is damaged and whose prompt is unknown
# (`repair` records it; a rerun of the campaign's enqueue replays it).
RECORD_DAMAGED = "record-damaged"


@dataclass(frozen=True, slots=True)
class Failure:
    """A prompt that will not be retried automatically.

    Parameters:
        reason: stable slug (`invalid-token-id`, `prompt-too-long`, `bad-request`, `server-error`...).
        message: the server's or our own message.
        item: the prompt, enough to enqueue it again.
        sampling: the batch's sampling_params.
        at: unix time.
        worker: node that recorded it.
    """

    reason: str
    message: str
    item: dict
    sampling: dict
    at: float
    worker: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Failure:
        return cls(**json.loads(raw))

    def encode(self) -> bytes:
        """The compact stored form: FAILURE_MAGIC, the reason, a newline, then one zstd frame of
        msgpack holding the rest, with the ids packed as the queue packs them (uint32 bytes)."""
        body = [self.message, self.at, self.worker, self.sampling, pack_item(PromptItem.from_replay(self.item))]
        packed = msgpack.packb(body, use_bin_type=True)
        return FAILURE_MAGIC + self.reason.encode() + b"\n" + _compressor().compress(packed)

    @classmethod
    def decode(cls, raw: bytes | str) -> Failure:
        """Read a stored failure, compact (encode) or JSON (what older versions stored)."""
        data = raw.encode() if isinstance(raw, str) else raw
        if not data.startswith(FAILURE_MAGIC):
            return cls.from_json(data)
        head, _, blob = data.partition(b"\n")
        message, at, worker, sampling, packed = msgpack.unpackb(_decompressor().decompress(blob), raw=False)
        return cls(
            reason=head[len(FAILURE_MAGIC) :].decode(),
            message=message,
            item=unpack_item(packed).to_replay(),
            sampling=sampling,
            at=at,
            worker=worker,
        )

    @staticmethod
    def reason_of(raw: bytes | str) -> str:
        """A stored failure's reason without decoding the rest."""
        data = raw.encode() if isinstance(raw, str) else raw
        if data.startswith(FAILURE_MAGIC):
            return data[len(FAILURE_MAGIC) : data.index(b"\n")].decode()
        return str(json.loads(data).get("reason"))


def _compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=FAILURE_ZSTD_LEVEL)


def _decompressor() -> zstandard.ZstdDecompressor:
    return zstandard.ZstdDecompressor()


@dataclass(frozen=True, slots=True)
class Progress:
    """Counts of one campaign. `pending` includes prompts being generated right now."""

    enqueued: int
    done: int
    failed: int
    counters: dict

    @property
    def pending(self) -> int:
        return max(self.enqueued - self.done - self.failed, 0)


class Campaign:
    """One campaign's state in Redis; producer, workers and tools change it only through its
    methods (and those of its outbox and its ConversationStore), so every change that must be
    atomic is one Lua script here.

    Parameters:
        client: a redis-py client (eagle_synth.state.redis_client.connect).
        name: campaign name.
    """

    def __init__(self, client: redis.Redis, name: str) -> None:
        check_campaign_name(name)
        self.client = client
        self.name = name
        self.keys = CampaignKeys(name)

    # settings -----------------------------------------------------------------
    def register(self, settings: CampaignSettings) -> CampaignSettings:
        """Store settings on first use; afterwards refuse different ones (CampaignMismatch)."""
        created = self.client.set(self.keys.settings, settings.to_json(), nx=True)
        self.client.sadd(CAMPAIGNS, self.name)
        if created:
            return settings
        stored = self.settings()
        assert stored is not None
        refuse_other_settings(self.name, stored, settings)
        return stored

    def settings(self) -> CampaignSettings | None:
        raw = self.client.get(self.keys.settings)
        return CampaignSettings.from_json(raw) if raw else None

    def exists(self) -> bool:
        return bool(self.client.exists(self.keys.settings))

    # producer side ------------------------------------------------------------
    @cached_property
    def outbox(self) -> Outbox:
        """The producer's outbox: claimed prompt chunks until their batches are published."""
        return Outbox(self.client, self.keys)

    def count(self, increments: dict[str, int]) -> None:
        """Add to the campaign's integer counters (names from eagle_synth.state.counters)."""
        pipe = self.client.pipeline(transaction=False)
        for name, value in increments.items():
            if value:
                pipe.hincrby(self.keys.counters, name, value)
        pipe.execute()

    def count_skipped(self, reasons: dict[str, int]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for reason, value in reasons.items():
            pipe.hincrby(self.keys.skipped, reason, value)
        pipe.execute()

    # worker side --------------------------------------------------------------
    def finished_keys(self, keys: list[str]) -> set[str]:
        """Keys among these that already have a record or a recorded failure."""
        if not keys:
            return set()
        pipe = self.client.pipeline(transaction=False)
        pipe.smismember(self.keys.done, keys)
        pipe.hmget(self.keys.failed, keys)
        done, failed = pipe.execute()
        return {k for k, d, f in zip(keys, done, failed) if d or f is not None}

    def mark_done(
        self, keys: list[str], *, tokens_in: int, tokens_out: int, repaired: int = 0, fence: Fence | None = None
    ) -> int:
        """Record that these keys' records are on disk; returns how many were new. With a fence,
        only while its batch lease is the writer's (else LeaseLost, nothing marked), releasing the
        keys' claims in the same step."""
        if not keys:
            return 0
        k = self.keys
        args = (k.done, k.failed, k.failed_reasons, k.counters, k.events, tokens_in, tokens_out, repaired)
        if fence is not None:
            return int(fence.eval(self.client, _MARK_DONE, 5, *args, EVENTS_MAXLEN, *keys, release=keys))
        return int(self.client.eval(_MARK_DONE, 5, *args, EVENTS_MAXLEN, *keys))

    def record_failure(
        self,
        item: PromptItem,
        *,
        reason: str,
        message: str,
        sampling: dict,
        worker: str = "",
        fence: Fence | None = None,
    ) -> None:
        """Keep a prompt that failed for good, with what is needed to replay it. With a fence,
        only while its batch lease is the writer's (else LeaseLost, nothing recorded)."""
        failure = Failure(
            reason=reason,
            message=message[:2000],
            item=item.to_replay(),
            sampling=sampling,
            at=time.time(),
            worker=worker,
        )
        args = (self.keys.failed, self.keys.failed_reasons, item.key, failure.encode(), reason)
        if fence is not None:

            def write(pipe: redis.client.Pipeline) -> None:
                pipe.eval(_RECORD_FAILURE, 2, *args)
                pipe.hincrby(self.keys.counters, counters.failed(reason), 1)

            fence.run(self.client, write)
            return
        self.client.eval(_RECORD_FAILURE, 2, *args)
        self.client.hincrby(self.keys.counters, counters.failed(reason), 1)

    def note_server(self, url: str, info: dict) -> None:
        self.client.hset(self.keys.servers, url, json.dumps(info, sort_keys=True))

    def servers(self) -> dict[str, dict]:
        return {text(k): json.loads(v) for k, v in self.client.hgetall(self.keys.servers).items()}

    # repair -------------------------------------------------------------------
    def undo_done(self, keys: list[str]) -> int:
        """Take keys whose records were lost back out of `done` (counted as `records-damaged`);
        returns how many were done."""
        if not keys:
            return 0
        return int(self.client.eval(_UNDO_DONE, 2, self.keys.done, self.keys.counters, *keys))

    def fail_done(self, failures: Iterable[tuple[str, Failure]]) -> int:
        """Move done keys to `failed`, each with its failure, FAILURE_CHUNK keys per round trip
        (`failures` is read as it goes); keys no longer done are left alone. Returns how many moved."""
        k = self.keys
        moved = 0
        pending = iter(failures)
        while chunk := list(islice(pending, FAILURE_CHUNK)):
            by_reason: dict[str, list[str | bytes]] = {}
            for key, failure in chunk:
                by_reason.setdefault(failure.reason, []).extend((key, failure.encode()))
            for reason, pairs in by_reason.items():
                moved += int(
                    self.client.eval(_DONE_TO_FAILED, 4, k.done, k.failed, k.failed_reasons, k.counters, reason, *pairs)
                )
        return moved

    # reading ------------------------------------------------------------------
    def failures(self) -> dict[str, Failure]:
        """Every failure at once (tests, small campaigns); `iter_failures` streams them."""
        return dict(self.iter_failures())

    def iter_failures(self, *, count: int = FAILURE_SCAN_COUNT) -> Iterator[tuple[str, Failure]]:
        """(key, failure) pairs read in HSCAN steps of about `count`, so memory stays bounded
        whatever the number of failures; a failure recorded or dropped meanwhile may or may not
        be seen (HSCAN's guarantee: every key present throughout is seen at least once)."""
        for key, raw in self.client.hscan_iter(self.keys.failed, count=count):
            yield text(key), Failure.decode(raw)

    def failure_reasons(self, keys: list[str]) -> list[str | None]:
        """Each key's failure reason, None where it has no recorded failure."""
        if not keys:
            return []
        raw = self.client.hmget(self.keys.failed, keys)
        return [None if failure is None else Failure.reason_of(failure) for failure in raw]

    def done_keys(self) -> set[str]:
        """Every key marked done, read in steps (SSCAN) so Redis is never blocked for long."""
        return {text(key) for key in self.client.sscan_iter(self.keys.done, count=DONE_SCAN_COUNT)}

    def drop_failures(self, keys: list[str]) -> int:
        """Remove keys from `failed` (keeping the per-reason counts true); returns how many."""
        if not keys:
            return 0
        return int(self.client.eval(_DROP_FAILURES, 2, self.keys.failed, self.keys.failed_reasons, *keys))

    def take_failures(self, keys: list[str]) -> set[str]:
        """Remove keys from `failed` like drop_failures; returns the keys that were there."""
        if not keys:
            return set()
        taken = self.client.eval(_TAKE_FAILURES, 2, self.keys.failed, self.keys.failed_reasons, *keys)
        return {text(key) for key in taken}

    def failure_counts(self) -> dict[str, int]:
        """Prompts currently failed, by reason, without reading the failures themselves."""
        return {text(k): int(v) for k, v in self.client.hgetall(self.keys.failed_reasons).items() if int(v) > 0}

    def progress(self) -> Progress:
        pipe = self.client.pipeline(transaction=False)
        pipe.scard(self.keys.enqueued)
        pipe.scard(self.keys.done)
        pipe.hlen(self.keys.failed)
        pipe.hgetall(self.keys.counters)
        enqueued, done, failed, counts = pipe.execute()
        return Progress(
            enqueued=int(enqueued),
            done=int(done),
            failed=int(failed),
            counters={text(k): int(v) for k, v in counts.items()},
        )

    def skipped(self) -> dict[str, int]:
        return {text(k): int(v) for k, v in self.client.hgetall(self.keys.skipped).items()}

    def recent_events(self, *, seconds: float) -> list[dict]:
        """Completion events of the last `seconds`, oldest first."""
        since_ms = int((time.time() - seconds) * 1000)
        entries = self.client.xrange(self.keys.events, min=since_ms) or []
        return [
            {"at": int(text(eid).split("-")[0]) / 1000, **{text(k): int(v) for k, v in (fields or {}).items()}}
            for eid, fields in entries
            if eid is not None
        ]


def campaign_names(client: redis.Redis) -> list[str]:
    return sorted(text(n) for n in client.smembers(CAMPAIGNS))


def refuse_other_settings(name: str, stored: CampaignSettings, settings: CampaignSettings) -> None:
    """Raise CampaignMismatch when `settings` differ from the campaign's stored ones (used by
    `register` and by a dry run, which must refuse what the real run refuses)."""
    diff = stored.differences(settings)
    if diff:
        raise CampaignMismatch(
            f"campaign {name!r} was created with other settings:\n  "
            + "\n  ".join(diff)
            + "\nUse a new --campaign name, or the original settings."
        )
