"""Which records become training rows, clipped how, in which split: applied in one pass.

Every export format and `eagle-synth vocab` select rows here, in ExportFilters.shape's order, then
`sample` (a seeded hash of the key: exact N needs the candidates' hashes first, so a sampled export
reads twice) and `splits` (a hash of the conversation key: a conversation lands in one split, the
remainder in `train`). Docs: docs/records.md, "Filters".
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated

from eagle_synth.errors import ExportError
from eagle_synth.flags import Flag
from eagle_synth.records import RawRecord

# The split that takes every row no named split claims.
SPLIT_REMAINDER = "train"
# Split names become file names and DatasetDict keys: plain word characters only.
SPLIT_NAME = re.compile(r"[A-Za-z0-9_]+")
# Default of min_loss_tokens: rows with no generated id teach nothing, and both trainers drop them.
DEFAULT_MIN_LOSS_TOKENS = 1
# blake2b personalisations: the split and sample hashes of one key are independent of each other.
_SPLIT_PERSON = b"eagle-synth-spl"
_SAMPLE_PERSON = b"eagle-synth-smp"
_GROUP_PERSON = b"eagle-synth-grp"
_HASH_RANGE = float(1 << 64)


def parse_split(text: str | None) -> tuple[tuple[str, float], ...]:
    """`test=0.01,val=0.02` as ((name, fraction), ...); the rest of the rows go to `train`."""
    if not text:
        return ()
    splits: list[tuple[str, float]] = []
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        try:
            fraction = float(value)
        except ValueError:
            fraction = -1.0
        if not sep or not SPLIT_NAME.fullmatch(name) or not 0.0 < fraction < 1.0:
            raise ExportError(
                f"--split {text!r}: give NAME=FRACTION pairs, comma-separated, each fraction "
                "between 0 and 1, e.g. --split test=0.01"
            )
        splits.append((name, fraction))
    _check_splits(tuple(splits), flag=f"--split {text!r}")
    return tuple(splits)


def _check_splits(splits: tuple[tuple[str, float], ...], *, flag: str = "--split") -> None:
    names = [name for name, _ in splits]
    if SPLIT_REMAINDER in names:
        raise ExportError(f"{flag}: {SPLIT_REMAINDER!r} takes every row the other splits do not; name only the others")
    if len(set(names)) != len(names):
        raise ExportError(f"{flag}: a split is named twice")
    if sum(fraction for _, fraction in splits) >= 1.0:
        raise ExportError(f"{flag}: the fractions add up to 1 or more, leaving nothing for {SPLIT_REMAINDER!r}")


def conversation_key(meta: dict) -> str:
    """What ties a record to its conversation, for splitting: its `conversation` field, else the
    row id plus sample index (sample s of each `--turns all` turn continues one conversation), else its key."""
    conversation = meta.get("conversation")
    if conversation not in (None, ""):
        if isinstance(conversation, str):
            return conversation
        return json.dumps(conversation, sort_keys=True, separators=(",", ":"))
    row_id = meta.get("id")
    if row_id in (None, ""):
        return f"key\x00{meta['key']}"
    return f"{row_id}\x00{int(meta.get('sample', 0))}"


def hash64(text: str, person: bytes = b"") -> int:
    """An 8-byte blake2b hash of `text` as an int; `person` keeps hashes of different uses apart."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8, person=person).digest(), "little")


def row_group(meta: dict) -> str:
    """What ties every record of one input row (samples, turns, variants): its id, else its conversation
    key; kept together in speculators' row order, so a tail split never divides a prompt's samples."""
    row_id = meta.get("id")
    return f"id\x00{row_id}" if row_id not in (None, "") else conversation_key(meta)


def row_group_hash(meta: dict) -> int:
    return hash64(row_group(meta), _GROUP_PERSON)


def split_of(meta: dict, splits: tuple[tuple[str, float], ...]) -> str:
    """Named splits take consecutive slices of [0, 1) in order; the rest is `train`."""
    point = hash64(conversation_key(meta), _SPLIT_PERSON) / _HASH_RANGE
    edges = itertools.accumulate(fraction for _, fraction in splits)
    return next((name for (name, _), edge in zip(splits, edges, strict=True) if point < edge), SPLIT_REMAINDER)


def sample_priority(key: str, seed: int) -> int:
    return hash64(f"{seed}\x00{key}", _SAMPLE_PERSON)


# The help of the filter flags whose text would not fit the field's line (eagle_synth/flags.py).
MAX_LENGTH_HELP = "Clip rows to N ids (prompt + output), the mask cut with them; see --drop-longer."
SAMPLE_HELP = "Keep N rows drawn by a hash of (--seed, key): deterministic; reads the records twice."
SPLIT_FLAG = Flag(
    "NAME=FRACTION[,...], e.g. test=0.01: split by a hash of the conversation (its turns stay together); the rest "
    "is 'train'. One output per split.",
    names=("--split",),
    type=str | None,
    default=None,
    parse=parse_split,
)


@dataclass(frozen=True, slots=True)
class ExportFilters:
    """Which records become rows, clipped how, and split how: each field is the filter of the same
    name in docs/records.md, "Filters" (splits as parse_split gives them; sample None keeps all)."""

    drop_truncated: Annotated[
        bool, Flag("Skip records that hit max_new_tokens (finish_reason length).", negatable=False)
    ] = False
    min_output_tokens: Annotated[int, Flag("Skip records with fewer generated ids (before clipping).")] = 0
    max_length: Annotated[int | None, Flag(MAX_LENGTH_HELP)] = None
    drop_longer: Annotated[
        bool, Flag("With --max-length: skip longer records instead of clipping them.", negatable=False)
    ] = False
    min_loss_tokens: Annotated[int, Flag("Skip rows with fewer mask-1 (generated) ids after clipping.")] = (
        DEFAULT_MIN_LOSS_TOKENS
    )
    splits: Annotated[tuple[tuple[str, float], ...], SPLIT_FLAG] = ()
    sample: Annotated[int | None, Flag(SAMPLE_HELP)] = None
    seed: Annotated[int, Flag("Seed of --sample.")] = 0

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 1:
            raise ExportError("--max-length must be at least 1")
        if self.drop_longer and self.max_length is None:
            raise ExportError("--drop-longer needs --max-length")
        if self.min_output_tokens < 0 or self.min_loss_tokens < 0:
            raise ExportError("--min-output-tokens and --min-loss-tokens cannot be negative")
        if self.sample is not None and self.sample < 1:
            raise ExportError("--sample must be at least 1")
        _check_splits(self.splits)

    @property
    def split_names(self) -> tuple[str, ...]:
        """The splits rows go to: `train` then the named ones; () when not splitting."""
        return (SPLIT_REMAINDER, *(name for name, _ in self.splits)) if self.splits else ()

    def shape(self, raw: RawRecord) -> tuple[RawRecord | None, str | None]:
        """(the row, None) for a record kept (clipped if need be), or (None, the filter that drops it)."""
        if self.drop_truncated and raw.meta.get("finish_reason") == "length":
            return None, "truncated"
        if raw.output_len < self.min_output_tokens:
            return None, "short_output"
        if self.max_length is not None and raw.prompt_len + raw.output_len > self.max_length:
            if self.drop_longer:
                return None, "too_long"
            raw = clip(raw, self.max_length)
        if raw.output_len < self.min_loss_tokens:
            return None, "few_loss_tokens"
        return raw, None


def clip(raw: RawRecord, max_length: int) -> RawRecord:
    """The record cut to its first max_length ids: the output first, then the prompt."""
    prompt_keep = min(raw.prompt_len, max_length)
    output_keep = max_length - prompt_keep
    return RawRecord(
        meta=raw.meta,
        prompt_u32=raw.prompt_u32[: 4 * prompt_keep],
        output_u32=raw.output_u32[: 4 * output_keep],
        src=raw.src,
    )


@dataclass(slots=True)
class SelectionStats:
    """Records a selection pass read, left out by filter (ExportFilters.shape's names, not_sampled), clipped."""

    read: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    clipped: int = 0


def sample_cutoff(records: Iterable[RawRecord], filters: ExportFilters) -> int | None:
    """The largest sample priority `filters.sample` keeps (None: all); a pass before the export's,
    holding one 8-byte hash per sampled row."""
    if filters.sample is None:
        return None
    # nsmallest keeps a heap of the N smallest priorities so far, not the whole stream.
    priorities = (sample_priority(raw.key, filters.seed) for raw in records if filters.shape(raw)[0] is not None)
    smallest = heapq.nsmallest(filters.sample, priorities)
    return smallest[-1] if len(smallest) == filters.sample else None


def select_rows(
    records: Iterable[RawRecord], filters: ExportFilters, stats: SelectionStats, *, cutoff: int | None = None
) -> Iterator[tuple[str | None, RawRecord]]:
    """(split name or None, row) for each kept record, in order, streaming; `cutoff`: sample_cutoff's
    over the same records (without it a sampled selection keeps every row)."""
    for raw in records:
        stats.read += 1
        row, reason = filters.shape(raw)
        if row is None:
            stats.dropped[reason or ""] += 1
            continue
        if cutoff is not None and sample_priority(raw.key, filters.seed) > cutoff:
            stats.dropped["not_sampled"] += 1
            continue
        if row is not raw:
            stats.clipped += 1
        yield (split_of(row.meta, filters.splits) if filters.splits else None), row
