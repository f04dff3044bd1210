"""The task payload: what the producer puts on the queue and a worker takes off it.

A task carries a batch of prompts as token ids (never text) plus the campaign's sampling
parameters. Ids of the whole batch travel as one zstd-compressed uint32 blob: kombu base64s
message bodies on Redis, so a JSON list of six-digit ids costs about 9 bytes a token while
this costs about 3. Serialized with msgpack; pickle is never accepted on the queue.

Version 2 adds, per prompt, what multi-turn regeneration (`--history own`) and sampling
variants need: the conversation's state (messages so far, the user turns still to come), the
variant's sampling overrides and its name. A batch that uses none of them is still written as
version 1, so workers that only know version 1 keep taking the campaigns they can run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from itertools import accumulate

import msgpack
import zstandard

from eagle_synth.errors import EagleSynthError
from eagle_synth.ids import pack_ids, unpack_ids

# The Celery task name: the contract between `enqueue` and the worker.
TASK_NAME = "eagle_synth.generate_batch"
# Version of this payload layout; workers refuse versions they do not know.
PAYLOAD_VERSION = 2
# Versions this module reads: 1 (no conversations, no variants) and 2.
READABLE_PAYLOAD_VERSIONS = frozenset({1, 2})
# zstd level for queued ids: cheap to compress, a third the bytes of JSON.
PAYLOAD_ZSTD_LEVEL = 3
# Prompts per task unless `enqueue --batch-size` says otherwise.
DEFAULT_BATCH_SIZE = 16
# Hex digits of a prompt key (128 bits: no collisions in any campaign).
KEY_HEX_DIGITS = 32


class PayloadError(EagleSynthError, ValueError):
    """A queued message is not a payload this version understands."""


def prompt_key(*, prompt_ids: bytes, sampling: dict, sample: int) -> str:
    """Stable key of one sample of one prompt: what determines its output, and only that.

    The same templated ids with the same sampling parameters and sample index always give
    the same key, whichever file or row they came from; that is how reruns skip them.
    """
    material = prompt_ids + json.dumps(sampling, sort_keys=True).encode() + f"|{sample}".encode()
    return hashlib.blake2b(material, digest_size=KEY_HEX_DIGITS // 2).hexdigest()


@dataclass(slots=True)
class PromptItem:
    """One prompt sample to generate.

    Parameters:
        key: the stable prompt key (see prompt_key).
        row_id: the source row's id, kept as provenance.
        sample: index of this sample among the prompt's n samples.
        ids: the templated prompt ids.
        seed: this sample's `sampling_seed`, or None.
        source: where the row came from, `file:line`.
        turn: index of the user turn the prompt ends at.
        conversation: with `--history own`, the conversation's state as a JSON-safe dict
            (eagle_synth.conversation.ConversationState.to_dict); None otherwise.
        sampling_overrides: the variant's `sampling_params` that differ from the batch's.
        variant: the name of the variant the prompt was made with, if any.
    """

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
        """JSON-safe form kept with a failure so the prompt can be enqueued again."""
        data = {
            "key": self.key,
            "row_id": self.row_id,
            "sample": self.sample,
            "ids": self.ids,
            "seed": self.seed,
            "source": self.source,
            "turn": self.turn,
        }
        if self.extended:
            data.update(
                conversation=self.conversation, sampling_overrides=self.sampling_overrides, variant=self.variant
            )
        return data

    @classmethod
    def from_replay(cls, data: dict) -> PromptItem:
        return cls(**data)


def pack_item(item: PromptItem) -> list:
    """A msgpack-ready list for one item (ids as uint32 bytes): outboxes keep items this way."""
    packed = [item.key, item.row_id, item.sample, pack_ids(item.ids), item.seed, item.source, item.turn]
    if item.extended:
        packed.append(
            {"conversation": item.conversation, "sampling_overrides": item.sampling_overrides, "variant": item.variant}
        )
    return packed


def unpack_item(packed: list) -> PromptItem:
    """The inverse of pack_item; reads the 7-field lists older producers wrote too."""
    key, row_id, sample, ids, seed, source, turn = packed[:7]
    extra = packed[7] if len(packed) > 7 else {}
    return PromptItem(
        key=key, row_id=row_id, sample=sample, ids=unpack_ids(ids), seed=seed, source=source, turn=turn, **extra
    )


@dataclass(slots=True)
class TaskPayload:
    """A batch of prompts of one campaign.

    Parameters:
        campaign: campaign name (records go to OUT/<campaign>/).
        batch: stable batch id (names the record file; reruns of the batch find it).
        sampling: the SGLang `sampling_params` shared by the batch (no per-sample seed).
        items: the prompts.
    """

    campaign: str
    batch: str
    sampling: dict
    items: list[PromptItem] = field(default_factory=list)

    def sampling_for(self, item: PromptItem, *, with_seed: bool = True) -> dict:
        """The sampling_params one prompt sample is sent with: the batch's, its variant's
        overrides (`--variants`), and its own seed (unless `with_seed` is False: a server that
        does not know `sampling_seed`)."""
        seeded = with_seed and item.seed is not None
        if not seeded and not item.sampling_overrides:
            return self.sampling
        sampling = {**self.sampling, **(item.sampling_overrides or {})}
        if seeded:
            sampling["sampling_seed"] = item.seed
        return sampling

    def encode(self) -> dict:
        """The msgpack-ready dict sent as the task's only argument (version 1 unless an item
        needs version 2's fields)."""
        lengths = [len(item.ids) for item in self.items]
        blob = b"".join(pack_ids(item.ids) for item in self.items)
        data = {
            "v": 1,
            "campaign": self.campaign,
            "batch": self.batch,
            "sampling": self.sampling,
            "keys": [item.key for item in self.items],
            "rows": [item.row_id for item in self.items],
            "samples": [item.sample for item in self.items],
            "seeds": [item.seed for item in self.items],
            "sources": [item.source for item in self.items],
            "turns": [item.turn for item in self.items],
            "lengths": lengths,
            "ids": zstandard.ZstdCompressor(level=PAYLOAD_ZSTD_LEVEL).compress(blob),
        }
        if any(item.extended for item in self.items):
            data["v"] = PAYLOAD_VERSION
            # Conversation states are text-heavy (the history so far): one zstd frame for all.
            states = msgpack.packb([item.conversation for item in self.items], use_bin_type=True)
            data["conversations"] = zstandard.ZstdCompressor(level=PAYLOAD_ZSTD_LEVEL).compress(states)
            data["sampling_overrides"] = [item.sampling_overrides for item in self.items]
            data["variants"] = [item.variant for item in self.items]
        return data

    @classmethod
    def decode(cls, data: dict) -> TaskPayload:
        """Rebuild a payload; raises PayloadError on anything malformed."""
        if not isinstance(data, dict) or data.get("v") not in READABLE_PAYLOAD_VERSIONS:
            raise PayloadError(f"unknown payload version {data.get('v') if isinstance(data, dict) else type(data)}")
        try:
            blob = zstandard.ZstdDecompressor().decompress(data["ids"])
            lengths = data["lengths"]
            if sum(lengths) * 4 != len(blob):
                raise PayloadError("payload ids do not match their lengths")
            all_ids = unpack_ids(blob)
            bounds = [0, *accumulate(lengths)]
            count = len(lengths)
            if data["v"] >= 2:
                states = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(data["conversations"]), raw=False)
                overrides, variants = data["sampling_overrides"], data["variants"]
                if not len(states) == len(overrides) == len(variants) == count:
                    raise PayloadError("payload conversation fields do not match its prompts")
            else:
                states = overrides = variants = [None] * count
            items = [
                PromptItem(
                    key=data["keys"][i],
                    row_id=data["rows"][i],
                    sample=data["samples"][i],
                    ids=all_ids[bounds[i] : bounds[i + 1]],
                    seed=data["seeds"][i],
                    source=data["sources"][i],
                    turn=data["turns"][i],
                    conversation=states[i],
                    sampling_overrides=overrides[i],
                    variant=variants[i],
                )
                for i in range(count)
            ]
        except PayloadError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, zstandard.ZstdError) as exc:
            raise PayloadError(f"malformed payload: {exc!r}") from exc
        return cls(campaign=data["campaign"], batch=data["batch"], sampling=data["sampling"], items=items)


def batch_id(keys: list[str]) -> str:
    """Stable id of a batch: the same prompts make the same batch id."""
    return hashlib.blake2b("\n".join(keys).encode(), digest_size=8).hexdigest()
