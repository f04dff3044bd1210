"""Exports the drafter trainers read as they are: SpecForge JSONL, speculators and HF dataset folders.

- `specforge`: JSONL of `{"input_ids": [...], "loss_mask": [...]}` and nothing else, what
  SpecForge's `data.prompts_path` takes as pre-tokenized (it decides from the first row
  having both keys, and opens the file as plain text: no gzip).
- `speculators`: the folder speculators' `prepare_data` would save (`save_to_disk`): columns
  `input_ids`, `loss_mask`, `seq_len` plus flat provenance columns, and `token_freq` (id ->
  count over mask-1 ids) as `token_freq.json`, and `token_freq.pt` with rows in the torch
  format its trainer reads when torch is importable.
- `hf`: a `datasets` folder (a Dataset, or a DatasetDict with splits) of every exported column.

Rows are staged as Arrow IPC streams, built from the ids' bytes (export_rows.arrow_batch), and
`datasets` then writes its own folder from them memory-mapped: memory stays flat, and the
disk holds the rows twice until the staging files are deleted at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from eagle_synth.records import RawRecord
from eagle_synth.tools.export_rows import Column, arrow_batch, arrow_schema
from eagle_synth.tools.filters import ExportError
from eagle_synth.tools.vocab import TokenCounts, torch_module, write_token_freq

DATASET_FORMATS = ("speculators", "hf")
# Files that mark a folder as a saved `datasets` folder, which a new export may replace.
DATASET_MARKERS = ("state.json", "dataset_dict.json")
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
    "torch is not importable here: wrote token_freq.json but not token_freq.pt, and the rows "
    "without the torch format speculators' trainer indexes them in; run this export where torch "
    "is installed (the training machine) for a drop-in folder"
)


def specforge_lines(group: Sequence[RawRecord]) -> str:
    """The JSONL lines of a row group: input_ids and loss_mask only, so no other key can mislead a reader."""
    from eagle_synth.ids import unpack_ids

    lines = []
    for raw in group:
        mask = ",".join(["0"] * raw.prompt_len + ["1"] * raw.output_len)
        ids = json.dumps(unpack_ids(raw.prompt_u32 + raw.output_u32), separators=(",", ":"))
        lines.append(f'{{"input_ids":{ids},"loss_mask":[{mask}]}}\n')
    return "".join(lines)


def require_datasets(format: str) -> None:
    """Raise ExportError saying what to install when `datasets` is missing."""
    import importlib.util

    if importlib.util.find_spec("datasets") is None:
        raise ExportError(
            f"--format {format} writes a Hugging Face datasets folder and needs the `datasets` "
            "package: pip install 'eagle-synth[trainers]' (or pip install datasets)"
        )


def check_dataset_out(out: Path) -> None:
    """Refuse an --out folder that holds something other than an earlier datasets export."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: give a folder for a datasets export")
    if out.is_dir() and any(out.iterdir()) and not any((out / name).exists() for name in DATASET_MARKERS):
        raise ExportError(
            f"--out {out} is a folder with other files in it; give a new or empty folder "
            "(an earlier datasets export there is replaced)"
        )


class StagedSplit:
    """One split's rows, staged as an Arrow IPC stream file until the datasets folder is written.

    Parameters:
        path: the staging file.
        selected: the columns to write.
        count_tokens: also count the rows' loss-masked ids (speculators' token_freq).
    """

    def __init__(self, path: Path, *, selected: Sequence[Column] | None, count_tokens: bool) -> None:
        import pyarrow as pa

        self.path = path
        self.selected = selected
        self.schema = arrow_schema(selected)
        self.counts = TokenCounts() if count_tokens else None
        self._file: IO[bytes] = open(path, "wb")
        self._writer = pa.ipc.new_stream(self._file, self.schema)
        self._open = True

    def add_group(self, group: Sequence[RawRecord]) -> None:
        self._writer.write_batch(arrow_batch(group, self.schema, self.selected))
        if self.counts is not None:
            self.counts.add_rows(group)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._writer.close()
            self._file.close()


def _shards(rows: int, shard_rows: int | None) -> int | None:
    """Shards for save_to_disk: None lets `datasets` size them, except that an empty dataset saved
    that way has no data file and does not load again, so it gets one."""
    if not rows:
        return 1
    return -(-rows // shard_rows) if shard_rows else None


def _save(dataset: Any, folder: Path, shard_rows: int | None) -> None:
    dataset.save_to_disk(str(folder), num_shards=_shards(dataset.num_rows, shard_rows))


def write_dataset_folder(
    out: Path, staged: dict[str | None, StagedSplit], *, format: str, shard_rows: int | None
) -> tuple[list[Path], list[str]]:
    """Write the datasets folder from staged splits; returns (paths written, warnings).

    The folder is built under a dot name next to `out` and renamed into place, so an
    interrupted export leaves the earlier one (or nothing), never half a folder.
    """
    from datasets import Dataset, DatasetDict
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    warnings: list[str] = []
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(4)}"
    quiet = are_progress_bars_disabled()
    disable_progress_bars()  # our own progress line is the one shown
    try:
        loaded = {name: Dataset.from_file(str(part.path)) for name, part in staged.items()}
        if format == "hf":
            if None in loaded:
                _save(loaded[None], tmp, shard_rows)
            else:
                DatasetDict(loaded).save_to_disk(
                    str(tmp), num_shards={name: _shards(d.num_rows, shard_rows) for name, d in loaded.items()}
                )
        else:
            torch = torch_module()
            if torch is None:
                warnings.append(TORCH_MISSING)
            for name, dataset in loaded.items():
                folder = tmp if name is None else tmp / name
                if torch is not None:
                    dataset = dataset.with_format("torch")
                _save(dataset, folder, shard_rows)
                counts = staged[name].counts
                assert counts is not None
                write_token_freq(folder, counts)
        del loaded  # unmaps the staging files before they are deleted
        _replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if not quiet:
            enable_progress_bars()
    return [out if name is None else out / name for name in staged], warnings


def _replace_folder(new: Path, out: Path) -> None:
    if not out.exists():
        os.replace(new, out)
        return
    old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
    os.replace(out, old)
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)
