"""Exports the drafter trainers read as they are (SpecForge JSONL, speculators and HF dataset
folders), each loaded with the real reader on this machine and checked against iter_records."""

from __future__ import annotations

import json
from collections import Counter

import datasets
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from eagle_synth.cli.commands import app
from eagle_synth.records import Record
from eagle_synth.tools import export as export_module
from eagle_synth.tools.export import export_records, export_rows
from eagle_synth.tools.filters import ExportFilters
from eagle_synth.tools.trainer_formats import TORCH_MISSING
from eagle_synth.tools.vocab import torch_module
from tests.export_helpers import by_key, conversation_records, torch_format_stand_in, write_campaign


@pytest.fixture
def campaign(tmp_path):
    folder = write_campaign(tmp_path / "camp", conversation_records(12))
    return folder, by_key(folder)


def expected_row(record: Record, max_length: int | None = None) -> tuple[list[int], list[int]]:
    ids, mask = record.input_ids, record.loss_mask
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask


def hf_load(path, tmp_path, **kwargs):
    return datasets.load_dataset(path, split="train", cache_dir=str(tmp_path / "hf-cache"), **kwargs)


def test_specforge_rows_are_pre_tokenized_ids_and_mask_only(campaign, tmp_path):
    folder, records = campaign
    out = tmp_path / "prompts.jsonl"
    result = export_records(folder, out, format="specforge", filters=ExportFilters(max_length=14))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert result.rows == len(lines) and result.paths == [out]
    # What SpecForge's reader decides on: the first record has both keys; nothing else is there to misread.
    assert all(set(line) == {"input_ids", "loss_mask"} for line in lines)
    expected = [expected_row(r, 14) for r in records.values() if sum(expected_row(r, 14)[1]) >= 1]
    assert sorted((line["input_ids"], line["loss_mask"]) for line in lines) == sorted(expected)
    for line in lines:
        assert all(type(v) is int and v in (0, 1) for v in line["loss_mask"])
        assert len(line["input_ids"]) == len(line["loss_mask"]) <= 14 and line["input_ids"]
    # The same file through `datasets` (what speculators' prepare_data uses on JSONL): one flat schema.
    loaded = hf_load("json", tmp_path, data_files=str(out))
    assert loaded.column_names == ["input_ids", "loss_mask"] and loaded.num_rows == len(lines)


def test_specforge_refuses_what_its_reader_cannot_open(campaign, tmp_path):
    folder, _ = campaign
    with pytest.raises(ValueError, match="plain text"):
        export_records(folder, tmp_path / "p.jsonl.gz", format="specforge")
    # Sharded exports are allowed since #24 (one SpecForge run per file keeps its memory bounded).
    sharded = export_records(folder, tmp_path / "p.jsonl", format="specforge", shard_rows=10)
    assert len(sharded.paths) == -(-sharded.rows // 10) and sharded.paths[0].name == "p-00000.jsonl"


def test_speculators_folder_loads_with_datasets_and_counts_masked_tokens(campaign, tmp_path, monkeypatch):
    torch_format_stand_in(monkeypatch)
    folder, records = campaign
    out = tmp_path / "spec"
    filters = ExportFilters(max_length=16, drop_truncated=True)
    result = export_records(folder, out, format="speculators", filters=filters, shard_rows=20)
    dataset = datasets.load_from_disk(str(out))
    assert dataset.column_names[:3] == ["input_ids", "loss_mask", "seq_len"]
    assert "messages" not in dataset.column_names  # its loader would send such rows to the chat API
    assert len(list(out.glob("data-*.arrow"))) == -(-dataset.num_rows // 20)
    kept = {k: r for k, r in records.items() if r.finish_reason == "stop" and sum(expected_row(r, 16)[1]) >= 1}
    assert dataset.num_rows == result.rows == len(kept)
    counts: Counter[int] = Counter()
    for row in dataset.with_format(None):
        ids, mask = expected_row(kept[row["key"]], 16)
        assert (row["input_ids"], row["loss_mask"], row["seq_len"]) == (ids, mask, len(ids))
        counts.update(i for i, m in zip(ids, mask, strict=True) if m)
    freq = json.loads((out / "token_freq.json").read_text())
    assert {int(k): v for k, v in freq.items()} == dict(counts)
    torch = torch_module()
    if torch is None:
        assert result.warnings == [TORCH_MISSING] and not (out / "token_freq.pt").exists()
    else:
        assert torch.load(out / "token_freq.pt") == dict(counts)
    assert json.loads((out / "state.json").read_text())["_format_type"] == "torch"


def test_hf_folder_has_every_record_field_and_equals_the_parquet_export(campaign, tmp_path):
    folder, records = campaign
    export_records(folder, tmp_path / "hf", format="hf", shard_rows=25)
    export_records(folder, tmp_path / "pq", format="parquet", shard_rows=25)
    saved = datasets.load_from_disk(str(tmp_path / "hf"))
    assert len(list((tmp_path / "hf").glob("data-*.arrow"))) == -(-saved.num_rows // 25)
    from_parquet = hf_load("parquet", tmp_path, data_files=sorted(str(p) for p in (tmp_path / "pq").glob("*.parquet")))
    assert saved.features == from_parquet.features
    assert saved.to_list() == from_parquet.to_list()
    fields = set(Record.__dataclass_fields__) - {"prompt_ids", "output_ids"}
    assert fields | {"input_ids", "loss_mask"} == set(saved.column_names)
    assert saved.num_rows == len(records)
    for row in saved:
        record = records[row["key"]]
        assert (row["input_ids"], row["loss_mask"]) == expected_row(record)
        assert (row["id"], row["turn"], row["finish_reason"], row["server"]) == (
            record.id,
            record.turn,
            record.finish_reason,
            record.server,
        )
        # A map becomes JSON text, so every row has one type.
        assert json.loads(row["sampling"]) == record.sampling
        assert (None if row["finish_matched"] is None else json.loads(row["finish_matched"])) == record.finish_matched
    assert {type(r.finish_matched) for r in records.values()} == {int, str, type(None)}


def test_dataset_splits_are_folders_and_a_datasetdict(campaign, tmp_path, monkeypatch):
    torch_format_stand_in(monkeypatch)
    folder, records = campaign
    filters = ExportFilters(splits=(("test", 0.3),))
    hf = export_records(folder, tmp_path / "hf", format="hf", filters=filters)
    spec = export_records(folder, tmp_path / "spec", format="speculators", filters=filters)
    assert hf.paths == [tmp_path / "hf" / "train", tmp_path / "hf" / "test"]
    assert spec.paths == [tmp_path / "spec" / "train", tmp_path / "spec" / "test"]
    loaded = datasets.load_from_disk(str(tmp_path / "hf"))
    assert isinstance(loaded, datasets.DatasetDict) and list(loaded) == ["train", "test"]
    assert {name: loaded[name].num_rows for name in loaded} == hf.split_rows == spec.split_rows
    assert min(hf.split_rows.values()) > 0 and sum(hf.split_rows.values()) == len(records)
    for name in ("train", "test"):
        spec_split = datasets.load_from_disk(str(tmp_path / "spec" / name))
        assert sorted(spec_split["key"]) == sorted(loaded[name]["key"])
        assert (tmp_path / "spec" / name / "token_freq.json").exists()


def test_dataset_out_replaces_an_earlier_export_and_refuses_other_folders(campaign, tmp_path):
    folder, _ = campaign
    out = tmp_path / "hf"
    export_records(folder, out, format="hf", filters=ExportFilters(sample=5))
    export_records(folder, out, format="hf", filters=ExportFilters(sample=7))
    assert datasets.load_from_disk(str(out)).num_rows == 7
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="other files"):
        export_records(folder, other, format="speculators")
    assert (other / "notes.txt").read_text() == "keep me"


def test_nothing_kept_still_writes_loadable_datasets(campaign, tmp_path):
    folder, _ = campaign
    result = export_records(folder, tmp_path / "hf", format="hf", filters=ExportFilters(min_output_tokens=10_000))
    assert result.rows == 0
    assert datasets.load_from_disk(str(tmp_path / "hf")).num_rows == 0
    # One row, two splits: one of them is empty and must load all the same.
    one = export_records(
        folder, tmp_path / "split", format="hf", filters=ExportFilters(sample=1, splits=(("test", 0.5),))
    )
    loaded = datasets.load_from_disk(str(tmp_path / "split"))
    assert sorted(loaded[name].num_rows for name in loaded) == [0, 1] == sorted(one.split_rows.values())


def test_export_streams_rows_out_before_the_input_ends(campaign, tmp_path, monkeypatch):
    folder, records = campaign
    monkeypatch.setattr(export_module, "ROW_GROUP_ROWS", 10)
    handed_to_writer = []
    real_lines = export_module.specforge_lines
    monkeypatch.setattr(
        export_module, "specforge_lines", lambda group: handed_to_writer.extend(group) or real_lines(group)
    )
    from eagle_synth.records import iter_raw_records

    written_while_reading = []

    def records_then_look():
        for n, raw in enumerate(iter_raw_records(folder), 1):
            if n == 60:
                written_while_reading.append(len(handed_to_writer))
            yield raw

    result = export_rows(records_then_look(), tmp_path / "prompts.jsonl", format="specforge")
    assert result.rows == len(records) == len(handed_to_writer) and result.stats.read == len(records)
    # Row groups of 10 were written while the input was still being read: rows flow out as records flow in.
    assert written_while_reading and written_while_reading[0] >= 50


def test_cli_exports_for_trainers_and_says_what_is_wrong(campaign, tmp_path):
    folder, _ = campaign
    runner = CliRunner()
    ok = runner.invoke(
        app,
        [
            "export",
            str(folder),
            "--out",
            str(tmp_path / "spec"),
            "--format",
            "speculators",
            "--max-length",
            "12",
            "--split",
            "test=0.2",
            "--json",
        ],
    )
    assert ok.exit_code == 0, ok.output
    summary = json.loads(ok.stdout)
    assert summary["format"] == "speculators" and set(summary["splits"]) == {"train", "test"}
    assert summary["clipped"] > 0 and summary["rows"] == sum(summary["splits"].values())
    for args, message in [
        (["--split", "train=0.5"], "takes every row"),
        (["--split", "test=2"], "NAME=FRACTION"),
        (["--drop-longer"], "--drop-longer needs --max-length"),
        (["--format", "csv"], "jsonl, parquet, specforge, speculators, hf"),
        (["--sample", "0"], "--sample must be at least 1"),
    ]:
        bad = runner.invoke(app, ["export", str(folder), "--out", str(tmp_path / "x.jsonl"), *args])
        assert bad.exit_code == 2 and message in bad.output, (args, bad.output)
        assert "Traceback" not in bad.output


def test_parquet_split_shards_are_named_for_load_dataset(campaign, tmp_path):
    folder, records = campaign
    result = export_records(
        folder, tmp_path / "pq", format="parquet", shard_rows=30, filters=ExportFilters(splits=(("test", 0.3),))
    )
    names = sorted(p.name for p in result.paths)
    assert names[0].startswith("test-00000") and "train-00000.parquet" in names
    # `datasets` maps train-*/test-* file names to splits by itself.
    loaded = datasets.load_dataset("parquet", data_dir=str(tmp_path / "pq"), cache_dir=str(tmp_path / "c"))
    assert {name: loaded[name].num_rows for name in loaded} == result.split_rows
    assert sum(pq.read_metadata(p).num_rows for p in result.paths) == len(records)
