"""The task payload: what the producer puts on the queue and a worker takes off it.

A task carries a batch of prompts as token ids (never text) plus the campaign's sampling
parameters. Ids of the whole batch travel as one zstd-compressed uint32 blob: kombu base64s
message bodies on Redis, so a JSON list of six-digit ids costs about 9 bytes a token while
this costs about 3. Serialized with msgpack; pickle is never accepted on the queue.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from itertools import accumulate

import zstandard

from eagle_synth.ids import pack_ids, unpack_ids

# The Celery task name: the contract between `enqueue` and the worker.
TASK_NAME = "eagle_synth.generate_batch"
# Version of this payload layout; workers refuse versions they do not know.
PAYLOAD_VERSION = 1
# zstd level for queued ids: cheap to compress, a third the bytes of JSON.
PAYLOAD_ZSTD_LEVEL = 3
# Prompts per task unless `enqueue --batch-size` says otherwise.
DEFAULT_BATCH_SIZE = 16
# Hex digits of a prompt key (128 bits: no collisions in any campaign).
KEY_HEX_DIGITS = 32


class PayloadError(ValueError):
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
    """

    key: str
    row_id: str
    sample: int
    ids: list[int]
    seed: int | None = None
    source: str = ""
    turn: int = 0

    def to_replay(self) -> dict:
        """JSON-safe form kept with a failure so the prompt can be enqueued again."""
        return {
            "key": self.key, "row_id": self.row_id, "sample": self.sample, "ids": self.ids,
            "seed": self.seed, "source": self.source, "turn": self.turn,
        }

    @classmethod
    def from_replay(cls, data: dict) -> PromptItem:
        return cls(**data)


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

    def sampling_for(self, item: PromptItem) -> dict:
        """The sampling_params one prompt sample is sent with: the batch's, plus its own seed."""
        return self.sampling if item.seed is None else {**self.sampling, "sampling_seed": item.seed}

    def encode(self) -> dict:
        """The msgpack-ready dict sent as the task's only argument."""
        lengths = [len(item.ids) for item in self.items]
        blob = b"".join(pack_ids(item.ids) for item in self.items)
        return {
            "v": PAYLOAD_VERSION,
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

    @classmethod
    def decode(cls, data: dict) -> TaskPayload:
        """Rebuild a payload; raises PayloadError on anything malformed."""
        if not isinstance(data, dict) or data.get("v") != PAYLOAD_VERSION:
            raise PayloadError(f"unknown payload version {data.get('v') if isinstance(data, dict) else type(data)}")
        try:
            blob = zstandard.ZstdDecompressor().decompress(data["ids"])
            lengths = data["lengths"]
            if sum(lengths) * 4 != len(blob):
                raise PayloadError("payload ids do not match their lengths")
            all_ids = unpack_ids(blob)
            bounds = [0, *accumulate(lengths)]
            items = [
                PromptItem(
                    key=data["keys"][i],
                    row_id=data["rows"][i],
                    sample=data["samples"][i],
                    ids=all_ids[bounds[i]: bounds[i + 1]],
                    seed=data["seeds"][i],
                    source=data["sources"][i],
                    turn=data["turns"][i],
                )
                for i in range(len(lengths))
            ]
        except (KeyError, IndexError, TypeError, zstandard.ZstdError) as exc:
            raise PayloadError(f"malformed payload: {exc!r}") from exc
        return cls(campaign=data["campaign"], batch=data["batch"], sampling=data["sampling"], items=items)


def batch_id(keys: list[str]) -> str:
    """Stable id of a batch: the same prompts make the same batch id."""
    return hashlib.blake2b("\n".join(keys).encode(), digest_size=8).hexdigest()
