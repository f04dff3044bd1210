"""The task payload: a batch of prompts as token ids (never text) plus sampling parameters, one msgpack map.

Ids of the whole batch travel as one zstd-compressed uint32 blob: kombu base64s message bodies on
Redis, so a JSON list of six-digit ids costs about 9 bytes a token while this costs about 3.
Version 2 adds, per prompt, the conversation state, variant overrides and variant name; a batch
using none is still version 1, so workers that only know version 1 keep taking what they can run.
"""

from __future__ import annotations

import hashlib
import json
from itertools import accumulate
from typing import Any

import msgspec
import zstandard

from eagle_synth.errors import PayloadError
from eagle_synth.ids import pack_ids, unpack_ids
from eagle_synth.sampling import ServerSampling

# The Celery task name: the contract between `enqueue` and the worker.
TASK_NAME = "eagle_synth.generate_batch"
# Payload versions this module reads; it writes 1, or 2 when an item needs its fields.
READABLE_PAYLOAD_VERSIONS = frozenset({1, 2})
# zstd level for queued ids: cheap to compress, a third the bytes of JSON.
PAYLOAD_ZSTD_LEVEL = 3
# Prompts per task unless `enqueue --batch-size` says otherwise.
DEFAULT_BATCH_SIZE = 16
# Hex digits of a prompt key (128 bits: no collisions in any campaign).
KEY_HEX_DIGITS = 32
# Fields only payload version 2 (and 8-field packed items) carry.
_EXTENDED = ("conversation", "sampling_overrides", "variant")
# The queued map's column of each PromptItem field (ids aside).
_COLUMNS = {"keys": "key", "rows": "row_id", "samples": "sample", "seeds": "seed", "sources": "source", "turns": "turn"}


def prompt_key(*, prompt_ids: bytes, sampling: dict, sample: int) -> str:
    """Stable key of one sample of one prompt: the same templated ids, sampling parameters and
    sample index always give the same key, whichever file or row they came from (reruns skip them)."""
    return key_digest(prompt_ids + json.dumps(sampling, sort_keys=True).encode() + f"|{sample}".encode())


def key_digest(material: bytes) -> str:
    """The KEY_HEX_DIGITS hex digits of `material`: prompt keys, and conversation and turn keys."""
    return hashlib.blake2b(material, digest_size=KEY_HEX_DIGITS // 2).hexdigest()


class PromptItem(msgspec.Struct):
    """One prompt sample to generate: its `key` (prompt_key), source row id, sample index among n,
    templated `ids`, `sampling_seed` (or None), `source` (`file:line`) and the user `turn` it ends
    at; with `--history own` the ConversationState.to_dict(), with `--variants` the variant's
    name and the `sampling_params` it changes."""

    key: str
    row_id: str
    sample: int
    ids: list[int]
    seed: int | None = None
    source: str = ""
    turn: int = 0
    conversation: dict | None = None
    sampling_overrides: dict | None = None
    variant: str | None = None

    @property
    def extended(self) -> bool:
        """True if the item uses a field payload version 1 cannot carry."""
        return self.conversation is not None or bool(self.sampling_overrides) or self.variant is not None

    def to_replay(self) -> dict:
        """JSON-safe form kept with a failure so the prompt can be enqueued again (`PromptItem(**form)`)."""
        data = msgspec.structs.asdict(self)
        return data if self.extended else {k: v for k, v in data.items() if k not in _EXTENDED}


def pack_item(item: PromptItem) -> list:
    """A msgpack-ready list for one item (ids as uint32 bytes): outboxes keep items this way."""
    packed = [item.key, item.row_id, item.sample, pack_ids(item.ids), item.seed, item.source, item.turn]
    if item.extended:
        packed.append({name: getattr(item, name) for name in _EXTENDED})
    return packed


def unpack_item(packed: list) -> PromptItem:
    """The inverse of pack_item; reads the 7-field lists older producers wrote too."""
    key, row_id, sample, ids, seed, source, turn = packed[:7]
    extra = packed[7] if len(packed) > 7 else {}
    return PromptItem(key, row_id, sample, unpack_ids(ids), seed, source, turn, **extra)


class _Wire(msgspec.Struct, omit_defaults=True):
    """The queued map: one column per PromptItem field, version 2's left out of version 1."""

    v: int
    campaign: str
    batch: str
    sampling: dict
    keys: list[str]
    rows: list[str]
    samples: list[int]
    seeds: list[int | None]
    sources: list[str]
    turns: list[int]
    lengths: list[int]
    ids: bytes
    # Conversation states are text-heavy (the history so far): one zstd frame for all.
    conversations: bytes | None = None
    sampling_overrides: list[dict | None] | None = None
    variants: list[str | None] | None = None


class TaskPayload(msgspec.Struct):
    """The prompts (`items`) of one `campaign` (records go to OUT/<campaign>/) under a stable `batch`
    id (names the record file, so reruns find it), with the shared `sampling` (no seed; a plain
    map is taken as its ServerSampling)."""

    campaign: str
    batch: str
    sampling: ServerSampling
    items: list[PromptItem] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.sampling, ServerSampling):
            self.sampling = ServerSampling(self.sampling)

    def sampling_for(self, item: PromptItem, *, with_seed: bool = True) -> ServerSampling:
        """The sampling one sample is sent with: the batch's, its variant's overrides, and its own
        seed (unless `with_seed` is False: a server that does not know `sampling_seed`)."""
        seed = item.seed if with_seed else None
        return self.sampling.for_sample(overrides=item.sampling_overrides, seed=seed)

    def encode(self) -> dict:
        """The msgpack-ready dict sent as the task's only argument."""
        items = self.items
        compress = zstandard.ZstdCompressor(level=PAYLOAD_ZSTD_LEVEL).compress
        columns: dict[str, Any] = {column: [getattr(item, name) for item in items] for column, name in _COLUMNS.items()}
        wire = _Wire(
            v=1,
            campaign=self.campaign,
            batch=self.batch,
            sampling=self.sampling.as_map(),
            **columns,
            lengths=[len(item.ids) for item in items],
            ids=compress(b"".join(pack_ids(item.ids) for item in items)),
        )
        if any(item.extended for item in items):
            wire.v = 2
            wire.conversations = compress(msgspec.msgpack.encode([i.conversation for i in items]))
            wire.sampling_overrides = [i.sampling_overrides for i in items]
            wire.variants = [i.variant for i in items]
        return msgspec.to_builtins(wire, builtin_types=(bytes,))

    @classmethod
    def decode(cls, data: dict) -> TaskPayload:
        """Rebuild a payload; raises PayloadError on anything malformed."""
        if not isinstance(data, dict) or data.get("v") not in READABLE_PAYLOAD_VERSIONS:
            raise PayloadError(f"unknown payload version {data.get('v') if isinstance(data, dict) else type(data)}")
        try:
            wire = msgspec.convert(data, _Wire)
            blob = zstandard.ZstdDecompressor().decompress(wire.ids)
            count = len(wire.lengths)
            columns: list[list[Any]] = [getattr(wire, column) for column in _COLUMNS]
            if sum(wire.lengths) * 4 != len(blob) or any(len(c) != count for c in columns):
                raise PayloadError("payload ids do not match their lengths")
            if wire.v >= 2:
                states = msgspec.msgpack.decode(zstandard.ZstdDecompressor().decompress(wire.conversations or b""))
                extra: list[list[Any]] = [states, wire.sampling_overrides or [], wire.variants or []]
                if any(len(c) != count for c in extra):
                    raise PayloadError("payload conversation fields do not match its prompts")
            else:
                extra = [[None] * count] * 3
            all_ids = unpack_ids(blob)
            bounds = [0, *accumulate(wire.lengths)]
            names = [*_COLUMNS.values(), *_EXTENDED]
            items = [
                PromptItem(ids=all_ids[bounds[i] : bounds[i + 1]], **dict(zip(names, fields)))
                for i, fields in enumerate(zip(*columns, *extra))
            ]
        except PayloadError:
            raise
        except (msgspec.ValidationError, msgspec.DecodeError, TypeError, ValueError, zstandard.ZstdError) as exc:
            raise PayloadError(f"malformed payload: {exc!r}") from exc
        return cls(campaign=wire.campaign, batch=wire.batch, sampling=ServerSampling(wire.sampling), items=items)


def batch_id(keys: list[str]) -> str:
    """Stable id of a batch: the same prompts make the same batch id."""
    return hashlib.blake2b("\n".join(keys).encode(), digest_size=8).hexdigest()
