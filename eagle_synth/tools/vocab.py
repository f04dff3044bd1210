"""`eagle-synth vocab`: loss-masked token frequencies and the EAGLE-3 draft vocabulary mapping.

`d2t` (int64 [N]): draft index i stands for target id `i + d2t[i]`; `t2d` (bool [target vocab size]):
True on the N kept ids. The files, the choice rule (speculators') and why the torch files are made by a
printed command where torch is missing: docs/records.md, `eagle-synth vocab`.
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eagle_synth.errors import VocabError
from eagle_synth.model_identity import MODEL_CONFIG_NAME, config_size
from eagle_synth.progress import Progress, reported
from eagle_synth.records import RawRecord, atomic_write_bytes, iter_raw_records, read_manifest
from eagle_synth.tools.filters import SPLIT_REMAINDER, ExportFilters, SelectionStats, sample_cutoff, select_rows

# Rows whose output ids are counted in one numpy call: amortises the call, keeps memory small.
COUNT_BATCH_ROWS = 1024
# File names, as the trainers look for them.
TOKEN_FREQ_JSON = "token_freq.json"
TOKEN_FREQ_TORCH = "token_freq.pt"  # speculators: {data-path}/token_freq.pt, a dict id -> count
# speculators: {data-path}/d2t.npy and t2d.npy
D2T_NPY = "d2t.npy"
T2D_NPY = "t2d.npy"
VOCAB_MAPPING_JSON = "vocab_mapping.json"
VOCAB_MAPPING_TORCH = "vocab_mapping.pt"  # SpecForge: model.vocab_mapping_path, {"d2t", "t2d"} tensors
MODELOPT_D2T_TORCH = "d2t.pt"  # ModelOpt: data.draft_vocab_cache, the int64 d2t tensor alone
# What the user is told when torch is missing.
TORCH_MISSING = (
    "torch is not importable here: wrote the .npy and JSON files, not token_freq.pt, "
    "vocab_mapping.pt (SpecForge's model.vocab_mapping_path) and d2t.pt (ModelOpt's "
    "data.draft_vocab_cache); run the commands below where torch is installed to make them"
)


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

    def add_rows(self, rows: Iterable[RawRecord]) -> int:
        """Count the loss-masked ids (the output) of rows, a batch of rows per numpy call; returns the rows."""
        rows = iter(rows)
        counted = 0
        while batch := [raw.output_u32 for raw in itertools.islice(rows, COUNT_BATCH_ROWS)]:
            found = np.bincount(np.frombuffer(b"".join(batch), dtype="<u4"))
            self.counts = np.pad(self.counts, (0, max(0, len(found) - len(self.counts))))
            self.counts[: len(found)] += found
            counted += len(batch)
        return counted

    def as_dict(self) -> dict[int, int]:
        """{token id: count} for every id counted at least once, ids ascending."""
        ids = np.flatnonzero(self.counts)
        return dict(zip(ids.tolist(), self.counts[ids].tolist(), strict=True))


@dataclass(frozen=True, slots=True)
class VocabMapping:
    """The draft vocabulary of an EAGLE-3 drafter (d2t, t2d: the module docstring), and how many
    of the `total` loss-masked tokens counted have an id it keeps (`covered`)."""

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


@dataclass(frozen=True, slots=True)
class TargetVocabSize:
    """The size t2d is built with, and where it was read (`config.json text_config.vocab_size`)."""

    size: int
    source: str


def trainer_vocab_sizes(config: dict) -> dict[str, tuple[int | None, str]]:
    """{trainer: (size, where it is read)}: both read text_config if present, else the config; then
    SpecForge its padded_vocab_size, else vocab_size (modeling/target/target_utils.py:66-74 at a6b6b02),
    speculators its vocab_size (train/vocab_mapping.py:121-125, models/utils.py:28-29 at c05b95b)."""
    text = config.get("text_config")
    section, prefix = (text, "text_config.") if isinstance(text, dict) else (config, "")
    padded = config_size(section, "padded_vocab_size")
    plain = config_size(section, "vocab_size")
    specforge = (padded, f"{prefix}padded_vocab_size") if padded else (plain, f"{prefix}vocab_size")
    return {"SpecForge": specforge, "speculators": (plain, f"{prefix}vocab_size")}


def target_vocab_size_of(campaign_path: str | os.PathLike) -> TargetVocabSize:
    """The target's vocabulary size from config.json in the campaign's tokenizer folder as both
    trainers read it (refused when they differ), else as recorded at enqueue. Not the tokenizer's
    length: t2d needs one entry per row of the lm_head, which padded vocabularies make longer."""
    settings = (read_manifest(campaign_path) or {}).get("settings") or {}
    folder = settings.get("tokenizer_path")
    config_path = Path(folder) / MODEL_CONFIG_NAME if folder else None
    recorded = settings.get("model_vocab_size")
    if config_path is None or not config_path.is_file():
        if isinstance(recorded, int):
            return TargetVocabSize(recorded, "manifest.json settings.model_vocab_size (config.json at enqueue)")
        raise VocabError(
            "pass --target-vocab-size: the target model's vocab_size from its config.json "
            f"({'no tokenizer_path in manifest.json' if folder is None else f'{config_path} not found'})"
        )
    try:
        config = json.loads(config_path.read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise VocabError(f"{config_path}: cannot read vocab_size ({exc}); pass --target-vocab-size") from exc
    sizes = trainer_vocab_sizes(config)
    found = {size for size, _ in sizes.values()}
    if found == {None}:
        raise VocabError(f"{config_path} has no vocab_size; pass --target-vocab-size")
    if len(found) > 1:  # two sizes, or one trainer finding none
        said = "; ".join(f"{trainer} reads {where} = {size}" for trainer, (size, where) in sizes.items())
        raise VocabError(
            f"{config_path}: the trainers read different target vocabulary sizes ({said}), so one "
            "mapping cannot load in both; pass --target-vocab-size with the size of the trainer you use"
        )
    keys = " and ".join(sorted({where for _, where in sizes.values()}))
    return TargetVocabSize(size=next(size for size in found if size is not None), source=f"{config_path} {keys}")


def _saved(save: Callable[[io.BytesIO, Any], Any], obj: Any) -> bytes:
    buffer = io.BytesIO()
    save(buffer, obj)
    return buffer.getvalue()


def _with_torch(
    folder: Path, paths: list[Path], files: dict[str, Callable[[Any], Any]], code: str
) -> tuple[list[Path], list[str]]:
    """(`paths` plus the torch files, name -> make(torch) the object saved, []) when torch is importable;
    else (`paths`, [the command running `code` where it is]). Each <file name> in `code` becomes its absolute
    path in double quotes (JSON's escapes are Python's), so the code has no single quote for the shell to escape."""
    torch = torch_module()
    if torch is None:
        code = re.sub(r"<([\w.]+)>", lambda name: json.dumps(str((folder / name[1]).resolve())), code)
        return paths, [f"python -c {shlex.quote(code)}"]
    for name, make in files.items():
        paths.append(folder / name)
        atomic_write_bytes(paths[-1], _saved(lambda buffer, obj: torch.save(obj, buffer), make(torch)))
    return paths, []


def write_token_freq(folder: Path, counts: TokenCounts) -> tuple[list[Path], list[str]]:
    """token_freq.json ({"id": count}); with torch token_freq.pt ({id: count}, speculators'): as _with_torch."""
    freq = counts.as_dict()
    paths = [folder / TOKEN_FREQ_JSON]
    atomic_write_bytes(paths[0], json.dumps({str(k): v for k, v in freq.items()}, separators=(",", ":")).encode())
    code = "import json, torch; torch.save({int(k): v for k, v in json.load(open(<token_freq.json>)).items()}, <token_freq.pt>)"
    return _with_torch(folder, paths, {TOKEN_FREQ_TORCH: lambda torch: freq}, code)


def write_vocab_mapping(folder: Path, mapping: VocabMapping) -> tuple[list[Path], list[str]]:
    """d2t.npy, t2d.npy and vocab_mapping.json; with torch, SpecForge's vocab_mapping.pt
    ({"d2t", "t2d"} tensors) and ModelOpt's d2t.pt (the d2t tensor alone): as _with_torch."""
    paths = [folder / D2T_NPY, folder / T2D_NPY, folder / VOCAB_MAPPING_JSON]
    for path, array in zip(paths, (mapping.d2t, mapping.t2d), strict=False):
        atomic_write_bytes(path, _saved(lambda buffer, obj: np.save(buffer, obj, allow_pickle=False), array))
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
    tensors = {
        VOCAB_MAPPING_TORCH: lambda torch: {
            "d2t": torch.from_numpy(mapping.d2t.copy()),
            "t2d": torch.from_numpy(mapping.t2d.copy()),
        },
        MODELOPT_D2T_TORCH: lambda torch: torch.from_numpy(mapping.d2t.copy()),
    }
    code = (
        "import numpy as np, torch; d2t = torch.from_numpy(np.load(<d2t.npy>)); "
        'torch.save({"d2t": d2t, "t2d": torch.from_numpy(np.load(<t2d.npy>))}, <vocab_mapping.pt>); '
        "torch.save(d2t, <d2t.pt>)"
    )
    return _with_torch(folder, paths, tensors, code)


@dataclass(slots=True)
class VocabResult:
    """What `eagle-synth vocab` counted and wrote; without torch, a warning and the .pt commands."""

    mapping: VocabMapping
    rows: int
    stats: SelectionStats
    paths: list[Path] = field(default_factory=list)
    torch_files: bool = False
    warnings: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    target_vocab_size_source: str = ""
    seconds: float = 0.0


def build_vocab(
    campaign_path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    draft_vocab_size: int,
    target_vocab_size: int | None = None,
    filters: ExportFilters = ExportFilters(),
    progress: Progress | None = None,
) -> VocabResult:
    """Count a campaign's loss-masked tokens (rows `filters` keep; with splits the `train` split) and
    write token frequencies and the draft vocabulary into the folder `out` (a speculators data
    folder is a good place); `target_vocab_size` defaults to target_vocab_size_of's."""
    started = time.perf_counter()
    if target_vocab_size is None:
        target = target_vocab_size_of(campaign_path)
    else:
        target = TargetVocabSize(target_vocab_size, "--target-vocab-size")
    check_sizes(draft_vocab_size=draft_vocab_size, target_vocab_size=target.size)
    # sample_cutoff reads nothing (and starts no progress phase) when filters.sample is None.
    cutoff = sample_cutoff(reported(iter_raw_records(campaign_path), progress, "sampling"), filters)
    stats = SelectionStats()
    counts = TokenCounts()
    records = reported(iter_raw_records(campaign_path), progress, "counting")
    selected = select_rows(records, filters, stats, cutoff=cutoff)
    rows = counts.add_rows(row for split, row in selected if split in (None, SPLIT_REMAINDER))
    mapping = build_vocab_mapping(counts.counts, draft_vocab_size=draft_vocab_size, target_vocab_size=target.size)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    freq_paths, freq_commands = write_token_freq(folder, counts)
    vocab_paths, vocab_commands = write_vocab_mapping(folder, mapping)
    torch_files = torch_module() is not None
    return VocabResult(
        mapping=mapping,
        rows=rows,
        stats=stats,
        paths=freq_paths + vocab_paths,
        torch_files=torch_files,
        warnings=[] if torch_files else [TORCH_MISSING],
        commands=freq_commands + vocab_commands,
        target_vocab_size_source=target.source,
        seconds=time.perf_counter() - started,
    )
