"""Exports the drafter trainers read as they are (docs/records.md, "What the trainers expect"):
`specforge` JSONL of input_ids and loss_mask only; `speculators` (prepare_data's folder: seq_len, flat
provenance columns, state.json naming the torch format, token_freq); `hf` (every exported column).

Rows are staged as Arrow IPC streams built from the ids' bytes, which `datasets` writes its folder
from memory-mapped: memory stays flat; the disk holds the rows twice until the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from eagle_synth.errors import ExportError
from eagle_synth.ids import unpack_ids
from eagle_synth.records import RawRecord, atomic_write_bytes
from eagle_synth.tools.export_rows import Column, arrow_batch, arrow_schema
from eagle_synth.tools.filters import row_group
from eagle_synth.tools.vocab import TOKEN_FREQ_JSON, TOKEN_FREQ_TORCH, TokenCounts, torch_module, write_token_freq

DATASET_FORMATS = ("speculators", "hf")
# Files that mark a folder as a saved `datasets` folder, which a new export may replace.
DATASET_MARKERS = ("state.json", "dataset_dict.json")
# What an export writes into its folder (and so may replace): datasets' own files, the token
# frequencies and our summary. Anything else (speculators' hidden_states/ cache, d2t.npy,
# t2d.npy, `eagle-synth vocab` files, the user's files) is only deleted with --replace.
EXPORT_SUMMARY = "eagle-synth-export.json"
EXPORT_FILES = frozenset(
    {"state.json", "dataset_info.json", "dataset_dict.json", TOKEN_FREQ_JSON, TOKEN_FREQ_TORCH, EXPORT_SUMMARY}
)
EXPORT_FILE_PATTERN = re.compile(r"data-\d{5}-of-\d{5}\.arrow")
# speculators' default --train-data-ratio (train/config/schema.py:213 at c05b95b): the last
# 10% of rows by index are its validation split.
SPECULATORS_TRAIN_DATA_RATIO = 0.9
# Said wherever a speculators folder is replaced.
HIDDEN_STATES_NOTE = (
    "speculators caches hidden states as hidden_states/hs_<row index>.safetensors: keyed by row "
    "index, so a re-export with other rows or filters invalidates them (its trainer then skips "
    "every row whose cached ids differ)"
)
# Provenance columns kept in a speculators folder: flat, one type each, none its loader reads
# specially (a `messages` column would send rows to vLLM's chat API).
SPECULATORS_COLUMNS = (
    Column("input_ids", "ids"),
    Column("loss_mask", "mask"),
    Column("seq_len", "int64"),
    Column("key", "string"),
    Column("id", "string"),
    Column("sample", "int32"),
    Column("turn", "int32"),
    Column("finish_reason", "string"),
)
TORCH_MISSING = (
    "torch is not importable here: wrote token_freq.json but not token_freq.pt (speculators only "
    "needs it when d2t.npy and t2d.npy are absent); run the command below where torch is installed "
    "to make it. The rows load as torch tensors anyway (state.json names the torch format)"
)


def specforge_lines(group: Sequence[RawRecord], *, zero_last_loss: bool = False) -> str:
    """The JSONL lines of a row group. `zero_last_loss` sets the last mask entry to 0: SpecForge's
    EAGLE-3 step shifts its target left and pads it with zeros without shifting the mask (upstream
    #885), so a row ending on a mask-1 token (every row here) trains its last position on a zero."""
    lines = []
    for raw in group:
        flags = ["0"] * raw.prompt_len + ["1"] * raw.output_len
        if zero_last_loss and flags:
            flags[-1] = "0"
        ids = json.dumps(unpack_ids(raw.prompt_u32 + raw.output_u32), separators=(",", ":"))
        lines.append(f'{{"input_ids":{ids},"loss_mask":[{",".join(flags)}]}}\n')
    return "".join(lines)


def _foreign_entries(folder: Path) -> list[str]:
    """Entries of `folder` an export did not write (split folders are looked into)."""
    foreign = []
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and (entry / "state.json").is_file():
            foreign += [f"{entry.name}/{name}" for name in _foreign_entries(entry)]
        elif not entry.is_file() or not (entry.name in EXPORT_FILES or EXPORT_FILE_PATTERN.fullmatch(entry.name)):
            foreign.append(entry.name + ("/" if entry.is_dir() else ""))
    return foreign


def check_dataset_out(format: str, out: Path, *, replace: bool = False) -> None:
    """Refuse a datasets export without `datasets`, or to an --out folder holding anything an export
    did not write, unless `replace`."""
    if importlib.util.find_spec("datasets") is None:
        raise ExportError(
            f"--format {format} writes a Hugging Face datasets folder and needs the `datasets` "
            "package: pip install 'eagle-synth[trainers]' (or pip install datasets)"
        )
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: give a folder for a datasets export")
    if replace or not out.is_dir() or not (foreign := _foreign_entries(out)):
        return
    earlier = any((out / name).exists() for name in DATASET_MARKERS) or any(
        (entry / "state.json").is_file() for entry in out.iterdir() if entry.is_dir()
    )
    if not earlier:
        raise ExportError(
            f"--out {out} is a folder with other files in it; give a new or empty folder "
            "(an earlier datasets export there is replaced), or --replace to delete them"
        )
    shown = ", ".join(foreign[:6]) + (f" and {len(foreign) - 6} more" if len(foreign) > 6 else "")
    raise ExportError(
        f"--out {out} holds files this export did not write ({shown}); --replace deletes them "
        f"with the earlier export. {HIDDEN_STATES_NOTE}; d2t.npy/t2d.npy and the vocab files "
        "must be made again from the new rows"
    )


def train_data_ratio(rows: int, boundaries: Sequence[int]) -> float | None:
    """The --train-data-ratio nearest to speculators' default whose cut (its int(rows * ratio), train/data.py:171
    at c05b95b) falls between row groups (`boundaries`: the rows they start at); None without one."""
    starts = np.asarray(boundaries, dtype=np.int64)
    inside = starts[(starts > 0) & (starts < rows)]
    if not len(inside):
        return None
    # Nearest to the default cut; on a tie the earlier one (argmin takes the first).
    cut = int(inside[np.argmin(np.abs(inside - SPECULATORS_TRAIN_DATA_RATIO * rows))])
    exact = (cut + 0.5) / rows  # half a row of margin either way: int(rows * exact) == cut
    # The shortest decimal that still cuts there, for a readable --train-data-ratio.
    shortest = (round(exact, digits) for digits in range(1, 18))
    return next((r for r in shortest if int(rows * r) == cut and 0 < r < 1), exact)


class StagedSplit:
    """One split's rows as an Arrow IPC stream at `path`; `speculators`: SPECULATORS_COLUMNS, loss ids counted."""

    def __init__(self, path: Path, *, speculators: bool) -> None:
        import pyarrow as pa

        self.path = path
        self.selected = SPECULATORS_COLUMNS if speculators else None
        self.schema = arrow_schema(self.selected)
        self.counts = TokenCounts() if speculators else None
        self.rows = 0
        # Row indexes where a new row group starts (8 bytes each): where a tail split can cut.
        self.boundaries = array("q")
        self._last_group: str | None = None
        self._file: IO[bytes] = open(path, "wb")
        self._writer = pa.ipc.new_stream(self._file, self.schema)

    def add_group(self, group: Sequence[RawRecord]) -> None:
        self._writer.write_batch(arrow_batch(group, self.schema, self.selected))
        if self.counts is not None:
            self.counts.add_rows(group)
        for raw in group:
            key = row_group(raw.meta)
            if key != self._last_group:
                self.boundaries.append(self.rows)
                self._last_group = key
            self.rows += 1

    def close(self) -> None:
        if not self._file.closed:
            self._writer.close()
            self._file.close()


def _shards(rows: int, shard_rows: int | None) -> int | None:
    """Shards for save_to_disk: None lets `datasets` size them, but an empty dataset saved so has no
    data file and does not load again: it gets one."""
    if not rows:
        return 1
    return -(-rows // shard_rows) if shard_rows else None


def write_dataset_folder(out: Path, staged: dict[str | None, StagedSplit], result: Any, shard_rows: int | None) -> None:
    """Write the datasets folder (result.format) from staged splits and set the ExportResult's paths,
    warnings, commands and train_data_ratio. Built under a dot name and renamed into place, so an
    interrupted export leaves the earlier one (or nothing), never half a folder."""
    from datasets import Dataset, DatasetDict
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    result.paths = [out if name is None else out / name for name in staged]
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(4)}"
    quiet = are_progress_bars_disabled()
    disable_progress_bars()  # our own progress line is the one shown
    try:
        loaded = {name: Dataset.from_file(str(part.path)) for name, part in staged.items()}
        if result.format == "hf":
            if None in loaded:
                loaded[None].save_to_disk(str(tmp), num_shards=_shards(loaded[None].num_rows, shard_rows))
            else:
                DatasetDict(loaded).save_to_disk(
                    str(tmp), num_shards={name: _shards(d.num_rows, shard_rows) for name, d in loaded.items()}
                )
        else:
            if torch_module() is None:
                result.warnings.append(TORCH_MISSING)
            for (name, dataset), final in zip(loaded.items(), result.paths, strict=True):
                folder = tmp if name is None else tmp / name
                dataset.save_to_disk(str(folder), num_shards=_shards(dataset.num_rows, shard_rows))
                # The torch format named in state.json, as `with_format("torch")` before save_to_disk
                # would: load_from_disk applies it, so rows come back as tensors where torch is.
                state = json.loads((folder / "state.json").read_text())
                state.update(_format_type="torch", _format_kwargs={}, _format_columns=None, _output_all_columns=False)
                atomic_write_bytes(folder / "state.json", (json.dumps(state, indent=2, sort_keys=True) + "\n").encode())
                part = staged[name]
                assert part.counts is not None
                _, commands = write_token_freq(folder, part.counts)
                result.commands += [c.replace(str(folder.resolve()), str(final.resolve())) for c in commands]
                ratio = train_data_ratio(part.rows, part.boundaries)
                result.train_data_ratio[name or "all"] = ratio
                summary = {
                    "format": "speculators",
                    "rows": part.rows,
                    "row_order": "each input row's samples and turns together, rows ordered by a hash of their id",
                    "train_data_ratio": ratio,
                    "hidden_states": HIDDEN_STATES_NOTE,
                }
                atomic_write_bytes(folder / EXPORT_SUMMARY, (json.dumps(summary, indent=2) + "\n").encode())
        del loaded  # unmaps the staging files before they are deleted
        old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if not quiet:
            enable_progress_bars()
