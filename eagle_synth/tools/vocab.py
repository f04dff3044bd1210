"""`eagle-synth vocab`: loss-masked token frequencies and the EAGLE-3 draft vocabulary mapping.

EAGLE-3 drafters predict over a reduced vocabulary: the N target ids most frequent among the
tokens they learn (mask 1). Both trainers build the same two arrays from those counts:

- `d2t` (draft -> target), int64 of length N: draft index i stands for target id `i + d2t[i]`;
- `t2d` (target -> draft), bool of length target_vocab_size: True on the N chosen ids.

The chosen ids are sorted ascending, so `nonzero(t2d) == d2t + arange(N)`. Order: higher
count first, then lower id; with fewer than N distinct ids counted, the lowest unused ids
fill the rest (count 0). This is speculators' rule exactly; SpecForge breaks ties between
equal counts in the order it first met the ids, so the two can differ only among ids tied at
the cut. Written as .npy (speculators' `d2t.npy` / `t2d.npy`), JSON, and, when torch is
importable, SpecForge's `vocab_mapping.pt` and speculators' `token_freq.pt`. docs/records.md.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eagle_synth.errors import UserError
from eagle_synth.records import (
    RawRecord,
    atomic_write_bytes,
    iter_raw_records,
    read_manifest,
)
from eagle_synth.tools.export_progress import Progress, reported
from eagle_synth.tools.filters import (
    SPLIT_REMAINDER,
    ExportFilters,
    SelectionStats,
    sample_cutoff,
    select_rows,
)

# Rows whose output ids are counted in one numpy call: amortises the call, keeps memory small.
COUNT_BATCH_ROWS = 1024
# File names, as the trainers look for them.
TOKEN_FREQ_JSON = "token_freq.json"
TOKEN_FREQ_TORCH = "token_freq.pt"  # speculators: {data-path}/token_freq.pt, a dict id -> count
D2T_NPY, T2D_NPY = "d2t.npy", "t2d.npy"  # speculators: {data-path}/d2t.npy and t2d.npy
VOCAB_MAPPING_JSON = "vocab_mapping.json"
VOCAB_MAPPING_TORCH = "vocab_mapping.pt"  # SpecForge: model.vocab_mapping_path, {"d2t", "t2d"} tensors
# What the user is told when torch is missing.
TORCH_MISSING = (
    "torch is not importable here: wrote the .npy and JSON files, not token_freq.pt and "
    "vocab_mapping.pt (SpecForge's model.vocab_mapping_path); run where torch is installed for them"
)
# Where the target model's vocabulary size is read when --target-vocab-size is not given.
MODEL_CONFIG_NAME = "config.json"


class VocabError(UserError, ValueError):
    """A vocabulary mapping cannot be built as asked; the message says what to pass."""


def torch_module() -> Any | None:
    """torch when it is importable (the trainers' own file format needs it), else None."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


class TokenCounts:
    """Counts of token ids; an int64 array that grows to the largest id seen (2 MB for 250k ids)."""

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)

    def add_u32(self, ids_u32: bytes) -> None:
        """Count the ids in little-endian uint32 bytes."""
        if not ids_u32:
            return
        found = np.bincount(np.frombuffer(ids_u32, dtype="<u4"))
        if len(found) > len(self.counts):
            grown = np.zeros(len(found), dtype=np.int64)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        self.counts[: len(found)] += found

    def add_rows(self, rows: Iterable[RawRecord]) -> None:
        """Count the loss-masked ids (the output) of rows, a batch of rows per numpy call."""
        batch: list[bytes] = []
        for raw in rows:
            batch.append(raw.output_u32)
            if len(batch) >= COUNT_BATCH_ROWS:
                self.add_u32(b"".join(batch))
                batch = []
        self.add_u32(b"".join(batch))

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def as_dict(self) -> dict[int, int]:
        """{token id: count} for every id counted at least once, ids ascending."""
        ids = np.flatnonzero(self.counts)
        return dict(zip(ids.tolist(), self.counts[ids].tolist(), strict=True))


@dataclass(frozen=True, slots=True)
class VocabMapping:
    """The draft vocabulary of an EAGLE-3 drafter.

    Parameters:
        d2t: int64 [draft_vocab_size]: target id of draft index i is i + d2t[i].
        t2d: bool [target_vocab_size]: True on the target ids the draft vocabulary keeps.
        covered: loss-masked tokens whose id the draft vocabulary keeps.
        total: loss-masked tokens counted.
    """

    d2t: np.ndarray
    t2d: np.ndarray
    covered: int
    total: int

    @property
    def coverage(self) -> float:
        return self.covered / self.total if self.total else 0.0


def check_sizes(*, draft_vocab_size: int, target_vocab_size: int) -> None:
    """Raise VocabError naming the flag when the two sizes cannot make a mapping."""
    if draft_vocab_size < 1:
        raise VocabError("--draft-vocab-size must be at least 1")
    if draft_vocab_size > target_vocab_size:
        raise VocabError(
            f"--draft-vocab-size {draft_vocab_size} is larger than the target vocabulary ({target_vocab_size})"
        )


def build_vocab_mapping(counts: np.ndarray, *, draft_vocab_size: int, target_vocab_size: int) -> VocabMapping:
    """Keep the draft_vocab_size most frequent target ids (ties: lower id first), sorted by id."""
    check_sizes(draft_vocab_size=draft_vocab_size, target_vocab_size=target_vocab_size)
    counted = np.flatnonzero(counts)
    if len(counted) and counted[-1] >= target_vocab_size:
        raise VocabError(
            f"the records hold token id {int(counted[-1])}, outside a target vocabulary of "
            f"{target_vocab_size}: pass the target model's vocab_size as --target-vocab-size"
        )
    full = np.zeros(target_vocab_size, dtype=np.int64)
    full[: len(counts)] = counts[:target_vocab_size]
    # A stable sort on -count keeps equal counts in id order: higher count first, then lower id.
    chosen = np.sort(np.argsort(-full, kind="stable")[:draft_vocab_size])
    t2d = np.zeros(target_vocab_size, dtype=np.bool_)
    t2d[chosen] = True
    d2t = chosen.astype(np.int64) - np.arange(draft_vocab_size, dtype=np.int64)
    return VocabMapping(d2t=d2t, t2d=t2d, covered=int(full[chosen].sum()), total=int(full.sum()))


def target_vocab_size_of(campaign_path: str | os.PathLike) -> int:
    """The target model's vocab_size: recorded at enqueue, else config.json in the campaign's tokenizer folder.

    t2d must have one entry per row of the target's lm_head, which can be more than the
    tokenizer's length (padded vocabularies), so the tokenizer length is not used.
    """
    settings = (read_manifest(campaign_path) or {}).get("settings") or {}
    if isinstance(settings.get("model_vocab_size"), int):
        return settings["model_vocab_size"]  # read from that config.json at enqueue (model_identity.py)
    folder = settings.get("tokenizer_path")
    config_path = Path(folder) / MODEL_CONFIG_NAME if folder else None
    if config_path is None or not config_path.is_file():
        raise VocabError(
            "pass --target-vocab-size: the target model's vocab_size from its config.json "
            f"({'no tokenizer_path in manifest.json' if folder is None else f'{config_path} not found'})"
        )
    try:
        config = json.loads(config_path.read_text())
        size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    except (OSError, ValueError, AttributeError) as exc:
        raise VocabError(f"{config_path}: cannot read vocab_size ({exc}); pass --target-vocab-size") from exc
    if not isinstance(size, int) or size < 1:
        raise VocabError(f"{config_path} has no vocab_size; pass --target-vocab-size")
    return size


# ----------------------------------------------------------------------------- files


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _torch_bytes(torch: Any, obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def write_token_freq(folder: Path, counts: TokenCounts) -> list[Path]:
    """token_freq.json ({"id": count}) always; token_freq.pt ({id: count}, speculators') with torch."""
    freq = counts.as_dict()
    paths = [folder / TOKEN_FREQ_JSON]
    atomic_write_bytes(paths[0], json.dumps({str(k): v for k, v in freq.items()}, separators=(",", ":")).encode())
    torch = torch_module()
    if torch is not None:
        paths.append(folder / TOKEN_FREQ_TORCH)
        atomic_write_bytes(paths[-1], _torch_bytes(torch, freq))
    return paths


def write_vocab_mapping(folder: Path, mapping: VocabMapping) -> list[Path]:
    """d2t.npy, t2d.npy and vocab_mapping.json always; vocab_mapping.pt (SpecForge's) with torch."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / D2T_NPY, folder / T2D_NPY, folder / VOCAB_MAPPING_JSON]
    atomic_write_bytes(paths[0], _npy_bytes(mapping.d2t))
    atomic_write_bytes(paths[1], _npy_bytes(mapping.t2d))
    summary = {
        "draft_vocab_size": len(mapping.d2t),
        "target_vocab_size": len(mapping.t2d),
        "loss_tokens": mapping.total,
        "covered_tokens": mapping.covered,
        "coverage": round(mapping.coverage, 6),
        "order": "count descending, then token id ascending; kept ids sorted ascending",
        "d2t": mapping.d2t.tolist(),
        "t2d": mapping.t2d.tolist(),
    }
    atomic_write_bytes(paths[2], json.dumps(summary, separators=(",", ":")).encode())
    torch = torch_module()
    if torch is not None:
        paths.append(folder / VOCAB_MAPPING_TORCH)
        tensors = {"d2t": torch.from_numpy(mapping.d2t.copy()), "t2d": torch.from_numpy(mapping.t2d.copy())}
        atomic_write_bytes(paths[-1], _torch_bytes(torch, tensors))
    return paths


# ----------------------------------------------------------------------------- the command


@dataclass(slots=True)
class VocabResult:
    """What `eagle-synth vocab` counted and wrote.

    Parameters:
        mapping: the draft vocabulary.
        rows: rows counted.
        stats: the selection pass (records read, dropped by filter, clipped).
        paths: files written.
        torch_files: whether the torch files were written (torch importable).
        warnings: what the user should know (a trainer file that could not be written).
        seconds: wall time.
    """

    mapping: VocabMapping
    rows: int
    stats: SelectionStats
    paths: list[Path] = field(default_factory=list)
    torch_files: bool = False
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


def count_loss_tokens(
    records: Iterable[RawRecord], filters: ExportFilters, stats: SelectionStats, *, cutoff: int | None = None
) -> tuple[TokenCounts, int]:
    """Counts of loss-masked ids over the rows the filters keep (the `train` split when splitting)."""
    counts = TokenCounts()
    rows = 0

    def kept() -> Iterable[RawRecord]:
        nonlocal rows
        for split, row in select_rows(records, filters, stats, cutoff=cutoff):
            if split in (None, SPLIT_REMAINDER):
                rows += 1
                yield row

    counts.add_rows(kept())
    return counts, rows


def build_vocab(
    campaign_path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    draft_vocab_size: int,
    target_vocab_size: int | None = None,
    filters: ExportFilters = ExportFilters(),
    progress: Progress | None = None,
) -> VocabResult:
    """Count a campaign's loss-masked tokens and write token frequencies and the draft vocabulary.

    Parameters:
        campaign_path: the campaign folder (OUT/<campaign>).
        out: folder for the files (created; a speculators data folder is a good place).
        draft_vocab_size: N, the draft vocabulary's size.
        target_vocab_size: the target model's vocab_size (default: its config.json, found
            through the manifest's tokenizer_path).
        filters: the same filters as the export the drafter trains on; with splits, only
            the `train` split is counted.
        progress: told the phase and the records read as the count goes.
    """
    started = time.perf_counter()
    if target_vocab_size is None:
        target_vocab_size = target_vocab_size_of(campaign_path)
    check_sizes(draft_vocab_size=draft_vocab_size, target_vocab_size=target_vocab_size)
    cutoff = None
    if filters.sample is not None:
        cutoff = sample_cutoff(reported(iter_raw_records(campaign_path), progress, "sampling"), filters)
    stats = SelectionStats()
    counts, rows = count_loss_tokens(
        reported(iter_raw_records(campaign_path), progress, "counting"), filters, stats, cutoff=cutoff
    )
    mapping = build_vocab_mapping(counts.counts, draft_vocab_size=draft_vocab_size, target_vocab_size=target_vocab_size)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = write_token_freq(folder, counts) + write_vocab_mapping(folder, mapping)
    torch_files = torch_module() is not None
    return VocabResult(
        mapping=mapping,
        rows=rows,
        stats=stats,
        paths=paths,
        torch_files=torch_files,
        warnings=[] if torch_files else [TORCH_MISSING],
        seconds=time.perf_counter() - started,
    )
