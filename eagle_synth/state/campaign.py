"""A campaign in Redis: its settings, fixed at first enqueue, and its progress.

Every prompt key ever enqueued is exactly one of pending, done (its record is on disk) or
failed; `retry-failed` and `repair` move keys back. `enqueued` holds the pending and failed
keys, `done` the done ones (layout 2: a done key leaves `enqueued`, one set member per finished
prompt). Every change that must be atomic is one Lua script (eagle_synth/state/lua/).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property
from itertools import islice
from typing import Any

import msgspec
import redis
import zstandard

from eagle_synth.errors import BadCampaignName, CampaignMismatch
from eagle_synth.payload import PromptItem, pack_item, unpack_item
from eagle_synth.sampling import SamplingParams
from eagle_synth.state.fence import Fence
from eagle_synth.state.keys import CAMPAIGNS, CampaignKeys, failed_counter
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.outbox import Outbox
from eagle_synth.state.redis_client import pipelined, text

# Completion events kept per campaign for throughput figures.
EVENTS_MAXLEN = 20_000
# Settings fields that may differ: they do not change the output (the tokenizer's fingerprint is
# compared; batch_size only groups prompts into tasks).
_IGNORED_IN_DIFF = frozenset({"created_at", "tokenizer_path", "batch_size", "model_vocab_size", "tokenizer_canary"})
# Keys per Redis round trip when moving keys between sets.
FAILURE_CHUNK = 1000
# Keys read from the done set per SSCAN step.
DONE_SCAN_COUNT = 10_000
# Failures read per HSCAN step: a few MB of 2k-token prompts, so memory stays bounded.
FAILURE_SCAN_COUNT = 500
# Leading bytes of a compact failure (Failure.encode): `F1 <reason>\n<zstd msgpack>`, the reason
# readable for Lua; the old format is JSON.
FAILURE_MAGIC = b"F1 "
# zstd level of a stored failure: ids compress to ~1.4 B a token at level 3 (JSON ids: ~5.6).
FAILURE_ZSTD_LEVEL = 3
_RECORD_FAILURE = LuaScript("failure_reason", "record_failure")
_TAKE_FAILURES = LuaScript("failure_reason", "take_failures")
_MARK_DONE = LuaScript("failure_reason", "mark_done_lib", "mark_done")
_UNDO_DONE = LuaScript("undo_done")
_FOLD_DONE = LuaScript("fold_done")
# The layout of a campaign's key sets (CampaignKeys.layout).
LAYOUT = "2"


def check_campaign_name(name: str) -> None:
    if not name or any(c in name for c in "/\\:* \t\n") or name.startswith("."):
        raise BadCampaignName(f"campaign name {name!r} is not usable: use letters, digits, '-', '_' and '.'")


class CampaignSettings(msgspec.Struct, frozen=True):
    """What every prompt of a campaign is made with, fixed at its first enqueue: tokenizer facts
    (templating.TokenizerFacts), chat template kwargs, system prompt, `sampling`
    (SamplingParams.to_dict()), `max_prompt_tokens`, `history` ("dataset" or "own", up to
    `max_turns`, tool calls in `tool_format`: docs/producer.md), `variants`, the first enqueue's
    `batch_size` (0: unknown), `model_vocab_size` and `tokenizer_canary` (model_identity.py),
    `tokenizer_files` (the folder's files its tokenizer code comes from, --trust-remote-code)."""

    name: str
    tokenizer_path: str
    tokenizer_fingerprint: str
    chat_template_hash: str
    chat_template_kwargs: dict = {}
    system_prompt: str | None = None
    sampling: dict = {}
    vocab_size: int = 0
    eos_token_ids: list[int] = []
    think_open_id: int | None = None
    think_close_id: int | None = None
    max_prompt_tokens: int | None = None
    created_at: float = 0.0
    history: str = "dataset"
    max_turns: int | None = None
    variants: list = []
    tool_format: str | None = None
    batch_size: int = 0
    model_vocab_size: int | None = None
    tokenizer_canary: dict = {}
    # With --trust-remote-code: {file name: hash} of the model folder's files the tokenizer and
    # its chat format come from (eagle_synth/tokenizer_files.py); workers must hold the same.
    tokenizer_files: dict = {}

    def sampling_params(self) -> SamplingParams:
        """`sampling` as the SamplingParams it was stored from (SamplingParams.to_dict())."""
        return SamplingParams.from_dict(self.sampling)

    def to_json(self) -> str:
        encoded = msgspec.json.encode(self, order="sorted")
        if self.tokenizer_files:
            return encoded.decode()
        # A campaign without remote code stores the very JSON it stored before the field existed.
        data = msgspec.json.decode(encoded)
        del data["tokenizer_files"]
        return msgspec.json.encode(data, order="sorted").decode()

    @classmethod
    def from_json(cls, raw: str | bytes) -> CampaignSettings:
        """Fields a newer version wrote are ignored (a rolling upgrade), missing ones take their defaults."""
        return msgspec.json.decode(raw, type=cls)

    def differences(self, other: CampaignSettings) -> list[str]:
        """Human lines `field: campaign has X, this run has Y` for every field that changes the output."""
        mine, theirs = msgspec.structs.asdict(self), msgspec.structs.asdict(other)
        lines = []
        for name in sorted(set(mine) - _IGNORED_IN_DIFF):
            a, b = mine[name], theirs[name]
            if isinstance(a, dict) and isinstance(b, dict):
                pairs = [(f"{name}.{key}", a.get(key), b.get(key)) for key in sorted(set(a) | set(b))]
            else:
                pairs = [(name, a, b)]
            lines += [f"{what}: campaign has {x!r}, this run has {y!r}" for what, x, y in pairs if x != y]
        return lines


def _as_bytes(raw: bytes | str) -> bytes:
    return raw.encode() if isinstance(raw, str) else raw


class Failure(msgspec.Struct, frozen=True):
    """A prompt not retried automatically: `reason` (eagle_synth.reasons), `message`, the `item`
    to enqueue again, the batch's `sampling`, when (`at`) and which `worker` recorded it."""

    reason: str
    message: str
    item: dict
    sampling: dict
    at: float
    worker: str = ""

    def encode(self) -> bytes:
        """FAILURE_MAGIC, reason, newline, a zstd frame of msgpack (ids packed as the queue packs them)."""
        body = [self.message, self.at, self.worker, self.sampling, pack_item(PromptItem(**self.item))]
        packed = msgspec.msgpack.encode(body)
        return FAILURE_MAGIC + self.reason.encode() + b"\n" + zstandard.compress(packed, FAILURE_ZSTD_LEVEL)

    @classmethod
    def decode(cls, raw: bytes | str) -> Failure:
        """Read a stored failure, compact (encode) or JSON (what older versions stored)."""
        data = _as_bytes(raw)
        if not data.startswith(FAILURE_MAGIC):
            return msgspec.json.decode(data, type=cls)
        head, _, blob = data.partition(b"\n")
        message, at, worker, sampling, packed = msgspec.msgpack.decode(zstandard.decompress(blob))
        item = unpack_item(packed).to_replay()
        return cls(head[len(FAILURE_MAGIC) :].decode(), message, item, sampling, at, worker)

    @staticmethod
    def reason_of(raw: bytes | str) -> str:
        """A stored failure's reason without decoding the rest."""
        data = _as_bytes(raw)
        if data.startswith(FAILURE_MAGIC):
            return data[len(FAILURE_MAGIC) : data.index(b"\n")].decode()
        return str(json.loads(data).get("reason"))


class Progress(msgspec.Struct, frozen=True):
    """Counts of one campaign. `pending` includes prompts being generated right now."""

    enqueued: int
    done: int
    failed: int
    counters: dict

    @property
    def pending(self) -> int:
        return max(self.enqueued - self.done - self.failed, 0)


def _ints(mapping: dict) -> dict[str, int]:
    return {text(k): int(v) for k, v in mapping.items()}


class Campaign:
    """One campaign's state in Redis; everything changes it only through these methods (and its
    outbox's and ConversationStore's)."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        check_campaign_name(name)
        self.client = client
        self.name = name
        self.keys = CampaignKeys(name)

    def register(self, settings: CampaignSettings) -> CampaignSettings:
        """Store settings on first use; afterwards refuse different ones (CampaignMismatch)."""
        created = self.client.set(self.keys.settings, settings.to_json(), nx=True)
        self.client.sadd(CAMPAIGNS, self.name)
        if created:
            self.client.set(self.keys.layout, LAYOUT)
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

    @cached_property
    def outbox(self) -> Outbox:
        """The producer's outbox: claimed prompt chunks until their batches are published."""
        return Outbox(self.client, self.keys)

    def _add(self, hash_key: str, increments: dict[str, int]) -> None:
        pipelined(self.client, *(("hincrby", hash_key, name, value) for name, value in increments.items() if value))

    def count(self, increments: dict[str, int]) -> None:
        """Add to the campaign's integer counters (names from eagle_synth.state.keys)."""
        self._add(self.keys.counters, increments)

    def count_skipped(self, reasons: dict[str, int]) -> None:
        self._add(self.keys.skipped, reasons)

    def finished_keys(self, keys: list[str]) -> set[str]:
        """Keys among these that already have a record or a recorded failure."""
        if not keys:
            return set()
        done, failed = pipelined(self.client, ("smismember", self.keys.done, keys), ("hmget", self.keys.failed, keys))
        return {k for k, d, f in zip(keys, done, failed) if d or f is not None}

    def all_done(self, keys: list[str]) -> bool:
        """Whether every one of these keys has a record (is in the done set)."""
        return all(self.client.smismember(self.keys.done, keys)) if keys else True

    def was_enqueued(self, keys: list[str]) -> list[bool]:
        """Per key, whether it was ever enqueued (it is in `enqueued` or in `done`)."""
        if not keys:
            return []
        k = self.keys
        enqueued, done = pipelined(self.client, ("smismember", k.enqueued, keys), ("smismember", k.done, keys))
        return [bool(e or d) for e, d in zip(enqueued, done)]

    def mark_done(
        self,
        keys: list[str],
        *,
        tokens_in: int,
        tokens_out: int,
        repaired: int = 0,
        tokens_cached: int = 0,
        fence: Fence | None = None,
    ) -> int:
        """Record that these keys' records are on disk; returns how many were new. With a fence, only
        under its lease (else LeaseLost), releasing the keys' claims in the same step."""
        if not keys:
            return 0
        k = self.keys
        names = (k.done, k.failed, k.failed_reasons, k.counters, k.events, k.enqueued)
        args = (tokens_in, tokens_out, repaired, EVENTS_MAXLEN, tokens_cached, *keys)
        if fence is not None:
            return int(fence.run_script(self.client, _MARK_DONE, names, args, release=keys))
        return int(_MARK_DONE(self.client, names, args))

    def record_failure(
        self,
        item: PromptItem,
        *,
        reason: str,
        message: str,
        sampling: Mapping[str, Any],
        worker: str = "",
        fence: Fence | None = None,
    ) -> None:
        """Keep a prompt that failed for good, replayable, with the `sampling` it was sent with
        (a ServerSampling, or its map); with a fence, only under its lease."""
        failure = Failure(reason, message[:2000], item.to_replay(), dict(sampling), time.time(), worker)
        k = self.keys

        def write(pipe: redis.Redis) -> None:  # a transaction pipeline when fenced
            _RECORD_FAILURE(pipe, (k.failed, k.failed_reasons), (item.key, failure.encode(), reason))
            pipe.hincrby(k.counters, failed_counter(reason), 1)

        if fence is not None:
            fence.run(self.client, write)
        else:
            write(self.client)  # one call after the other: a failure not stored (Redis full) is not counted

    def note_server(self, url: str, info: dict) -> None:
        self.client.hset(self.keys.servers, url, json.dumps(info, sort_keys=True))

    def servers(self) -> dict[str, dict]:
        return {text(k): json.loads(v) for k, v in self.client.hgetall(self.keys.servers).items()}

    def _undo(self, reason: str, args: list) -> int:
        k = self.keys
        names = (k.done, k.counters, k.enqueued, k.failed, k.failed_reasons)
        return int(_UNDO_DONE(self.client, names, (reason, *args)))

    def undo_done(self, keys: list[str]) -> int:
        """Take keys whose records were lost back out of `done` into pending (counted as
        `records-damaged`); returns how many were done."""
        return self._undo("", keys) if keys else 0

    def fail_done(self, failures: Iterable[tuple[str, Failure]]) -> int:
        """Move done keys to `failed` with their failures, FAILURE_CHUNK per round trip; returns how many moved."""
        moved = 0
        pending = iter(failures)
        while chunk := list(islice(pending, FAILURE_CHUNK)):
            by_reason: dict[str, list[str | bytes]] = {}
            for key, failure in chunk:
                by_reason.setdefault(failure.reason, []).extend((key, failure.encode()))
            moved += sum(self._undo(reason, pairs) for reason, pairs in by_reason.items())
        return moved

    def iter_failures(self, *, count: int = FAILURE_SCAN_COUNT) -> Iterator[tuple[str, Failure]]:
        """(key, failure) pairs in HSCAN steps of about `count` (HSCAN's guarantees)."""
        for key, raw in self.client.hscan_iter(self.keys.failed, count=count):
            yield text(key), Failure.decode(raw)

    def failure_reasons(self, keys: list[str]) -> list[str | None]:
        """Each key's failure reason, None where it has no recorded failure."""
        raw = self.client.hmget(self.keys.failed, keys) if keys else []
        return [None if failure is None else Failure.reason_of(failure) for failure in raw]

    def done_keys(self) -> set[str]:
        """Every key marked done, read in SSCAN steps so Redis is never blocked for long."""
        return {text(key) for key in self.client.sscan_iter(self.keys.done, count=DONE_SCAN_COUNT)}

    def take_failures(self, keys: list[str]) -> set[str]:
        """Remove keys from `failed` (keeping the per-reason counts true); returns the keys that were there."""
        if not keys:
            return set()
        taken = _TAKE_FAILURES(self.client, (self.keys.failed, self.keys.failed_reasons), keys)
        return {text(key) for key in taken}

    def failure_counts(self) -> dict[str, int]:
        """Prompts currently failed, by reason, without reading the failures themselves."""
        return {k: v for k, v in _ints(self.client.hgetall(self.keys.failed_reasons)).items() if v > 0}

    def progress(self) -> Progress:
        """Counts in one round trip (a campaign of the old layout is moved to the new one first)."""
        k = self.keys
        reads = ("scard", k.enqueued), ("scard", k.done), ("hlen", k.failed), ("hgetall", k.counters), ("get", k.layout)
        enqueued, done, failed, counts, layout = pipelined(self.client, *reads)
        if layout is None and done and self.fold_done():
            return self.progress()
        return Progress(int(enqueued) + int(done), int(done), int(failed), _ints(counts))

    def fold_done(self) -> int:
        """Move a campaign of layout 1 (done keys also in `enqueued`) to layout 2 in SSCAN steps,
        workers running meanwhile; returns how many keys left `enqueued`."""
        k = self.keys
        moved = 0
        keys = self.client.sscan_iter(k.done, count=DONE_SCAN_COUNT)
        while chunk := list(islice(keys, FAILURE_CHUNK)):
            moved += int(_FOLD_DONE(self.client, (k.done, k.enqueued), chunk))
        self.client.set(k.layout, LAYOUT)
        return moved

    def skipped(self) -> dict[str, int]:
        return _ints(self.client.hgetall(self.keys.skipped))

    def recent_events(self, *, seconds: float) -> list[dict]:
        """Completion events of the last `seconds`, oldest first."""
        since_ms = int((time.time() - seconds) * 1000)
        entries = self.client.xrange(self.keys.events, min=since_ms) or []
        return [
            {"at": int(text(eid).split("-")[0]) / 1000, **_ints(fields or {})}
            for eid, fields in entries
            if eid is not None
        ]


def campaign_names(client: redis.Redis) -> list[str]:
    return sorted(text(n) for n in client.smembers(CAMPAIGNS))


def campaigns_with_batches(client: redis.Redis) -> list[str]:
    """The campaigns in the CAMPAIGNS set and those a stored batch names (its key carries the
    campaign's name), which go back into the set: an evicting Redis can drop the set while the
    stored batches, written again at every publish, stay (the reconciler's list of campaigns)."""
    names = set(campaign_names(client))
    prefix = CampaignKeys("x").base[: -len("x")]
    suffix = CampaignKeys("x").batches[len(CampaignKeys("x").base) :]
    found = {text(key)[len(prefix) : -len(suffix)] for key in client.scan_iter(match=f"{prefix}*{suffix}", count=1000)}
    if missing := found - names:
        client.sadd(CAMPAIGNS, *missing)
    return sorted(names | found)


def refuse_other_settings(name: str, stored: CampaignSettings, settings: CampaignSettings) -> None:
    """Raise CampaignMismatch when `settings` differ from the stored ones (`register`, a dry run)."""
    if diff := stored.differences(settings):
        raise CampaignMismatch(
            f"campaign {name!r} was created with other settings:\n  "
            + "\n  ".join(diff)
            + "\nUse a new --campaign name, or the original settings."
        )
