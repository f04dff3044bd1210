"""export: training rows (input_ids, loss_mask, provenance) as JSONL or Parquet, filters,
sharding, and a memory footprint that does not grow with the campaign."""

from __future__ import annotations

import gzip
import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from eagle_synth.cli.commands import app
from eagle_synth.records import Record, write_record_file
from eagle_synth.tools import export as export_module
from eagle_synth.tools.export import ExportFilters, export_records
from eagle_synth.tools.export_rows import columns

THINK, IM_END = 248068, 248046


def rec(n: int, *, prompt_len: int = 5, output_len: int = 4, finish: str = "stop") -> Record:
    prompt = [248045, 846, 198] + [10_000 + n] * (prompt_len - 5) + [THINK, 198]
    output = [20_000 + n] * (output_len - 1) + ([IM_END] if finish == "stop" else [7])
    return Record(
        key=f"key{n:04d}",
        id=f"row{n}",
        sample=n % 2,
        turn=1,
        prompt_ids=prompt,
        output_ids=output,
        finish_reason=finish,
        finish_matched=IM_END if finish == "stop" else None,
        prompt_tokens=len(prompt),
        completion_tokens=len(output),
    )


@pytest.fixture
def campaign(tmp_path):
    folder = tmp_path / "camp"
    records = [
        rec(0, prompt_len=6, output_len=3),
        rec(1, prompt_len=8, output_len=5, finish="length"),
        rec(2, prompt_len=5, output_len=1),
        rec(3, prompt_len=40, output_len=40),
    ]
    write_record_file(folder, campaign="camp", batch="aa", records=records[:2])
    write_record_file(folder, campaign="camp", batch="bb", records=records[2:])
    return folder, {r.key: r for r in records}


def test_parquet_rows_have_ids_mask_and_provenance(campaign, tmp_path):
    folder, records = campaign
    result = export_records(folder, tmp_path / "train.parquet", format="parquet")
    assert result.rows == 4 and result.paths == [tmp_path / "train.parquet"]
    table = pq.read_table(tmp_path / "train.parquet")
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert table.column_names == [c.name for c in columns()]
    for row in table.to_pylist():
        r = records[row["key"]]
        assert row["input_ids"] == r.prompt_ids + r.output_ids
        assert row["loss_mask"] == [0] * len(r.prompt_ids) + [1] * len(r.output_ids)
        assert (row["id"], row["sample"], row["turn"], row["finish_reason"]) == (r.id, r.sample, 1, r.finish_reason)
        assert (row["prompt_tokens"], row["completion_tokens"]) == (len(r.prompt_ids), len(r.output_ids))
        # The template's <think> is prompt (0); the generated end of turn is output (1).
        assert row["loss_mask"][row["input_ids"].index(THINK)] == 0
        if r.finish_reason == "stop":
            assert row["input_ids"][-1] == IM_END and row["loss_mask"][-1] == 1


def test_parquet_loads_with_hugging_face_datasets(campaign, tmp_path):
    datasets = pytest.importorskip("datasets")
    folder, records = campaign
    export_records(folder, tmp_path / "out", format="parquet", shard_rows=3)
    files = sorted(str(p) for p in (tmp_path / "out").glob("part-*.parquet"))
    dataset = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf"))
    assert dataset.num_rows == 4
    assert dataset.features["input_ids"].feature.dtype == "int32"
    row = next(r for r in dataset if r["key"] == "key0003")
    assert row["input_ids"] == records["key0003"].input_ids and sum(row["loss_mask"]) == 40


def test_jsonl_and_gzip_rows_match_parquet(campaign, tmp_path):
    folder, _ = campaign
    export_records(folder, tmp_path / "t.parquet", format="parquet")
    export_records(folder, tmp_path / "t.jsonl", format="jsonl")
    export_records(folder, tmp_path / "t.jsonl.gz", format="jsonl")
    parquet_rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    jsonl_rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    with gzip.open(tmp_path / "t.jsonl.gz", "rt") as handle:
        gz_rows = [json.loads(line) for line in handle]
    assert jsonl_rows == parquet_rows == gz_rows


def test_filters_drop_and_count(campaign, tmp_path):
    folder, _ = campaign
    filters = ExportFilters(drop_truncated=True, min_output_tokens=2, max_length=20, drop_longer=True)
    result = export_records(folder, tmp_path / "f.parquet", format="parquet", filters=filters)
    assert [r["key"] for r in pq.read_table(tmp_path / "f.parquet").to_pylist()] == ["key0000"]
    assert result.stats.dropped == {"truncated": 1, "short_output": 1, "too_long": 1}


def test_shards_hold_shard_rows_each_and_stale_shards_go(tmp_path):
    folder = tmp_path / "camp"
    write_record_file(folder, campaign="c", batch="aa", records=[rec(n) for n in range(7)])
    result = export_records(folder, tmp_path / "out.parquet", format="parquet", shard_rows=3)
    assert [p.name for p in result.paths] == ["out-00000.parquet", "out-00001.parquet", "out-00002.parquet"]
    assert [pq.read_metadata(p).num_rows for p in result.paths] == [3, 3, 1]
    result = export_records(folder, tmp_path / "out.jsonl", format="jsonl", shard_rows=4)
    assert [len(p.read_text().splitlines()) for p in result.paths] == [4, 3]
    # A second export to the same name with fewer shards must not leave the old third one behind.
    export_records(folder, tmp_path / "out.parquet", format="parquet", shard_rows=5)
    assert sorted(p.name for p in tmp_path.glob("out-*.parquet")) == ["out-00000.parquet", "out-00001.parquet"]
    assert not list(tmp_path.glob(".*tmp"))


def test_nothing_kept_still_writes_the_schema(campaign, tmp_path):
    folder, _ = campaign
    result = export_records(
        folder, tmp_path / "e.parquet", format="parquet", filters=ExportFilters(min_output_tokens=999)
    )
    assert result.rows == 0 and pq.read_table(tmp_path / "e.parquet").schema.names == [c.name for c in columns()]


def test_memory_stays_flat_as_the_campaign_grows(tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "ROW_GROUP_ROWS", 50)

    def peak(records: int) -> int:
        folder = tmp_path / f"c{records}"
        for b in range(0, records, 100):
            write_record_file(
                folder,
                campaign="c",
                batch=f"{b:016x}",
                records=[rec(n, prompt_len=60, output_len=200) for n in range(b, b + 100)],
            )
        tracemalloc.start()
        export_records(folder, tmp_path / f"o{records}.parquet", format="parquet")
        _, high = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return high

    peak(100)  # the first export imports pyarrow: not part of the footprint
    small, large = peak(300), peak(1500)
    assert large < small * 1.3 + 200_000, (small, large)


def test_cli_export_reports_and_refuses_bad_format(campaign, tmp_path):
    folder, _ = campaign
    runner = CliRunner()
    ok = runner.invoke(
        app,
        [
            "export",
            str(folder),
            "--out",
            str(tmp_path / "c.parquet"),
            "--format",
            "parquet",
            "--drop-truncated",
            "--json",
        ],
    )
    assert ok.exit_code == 0, ok.output
    summary = json.loads(ok.stdout)
    assert summary["rows"] == 3 and summary["dropped"] == {"truncated": 1}
    bad = runner.invoke(app, ["export", str(folder), "--out", str(tmp_path / "c.csv"), "--format", "csv"])
    assert bad.exit_code == 2 and "jsonl, parquet" in bad.output
    folder_out = runner.invoke(app, ["export", str(folder), "--out", str(tmp_path)])
    assert folder_out.exit_code == 2 and "--shard-rows" in folder_out.output


def test_an_out_with_an_extension_no_format_has_is_refused(campaign, tmp_path):
    """`--out train.csv` would have been JSONL under a CSV name: refused in one line listing the formats."""
    folder, _ = campaign
    refused = CliRunner().invoke(app, ["export", str(folder), "--out", str(tmp_path / "train.csv")])
    assert refused.exit_code == 2
    assert "'.csv'" in refused.output and ".jsonl.gz, .jsonl, .parquet" in refused.output
    assert "jsonl, parquet, specforge, speculators, hf" in refused.output
    assert not (tmp_path / "train.csv").exists()
    named = CliRunner().invoke(app, ["export", str(folder), "--out", str(tmp_path / "train.csv"), "--format", "jsonl"])
    assert named.exit_code == 0, named.output


@pytest.mark.parametrize("command", ["export", "vocab"])
def test_an_out_that_cannot_be_written_is_one_line(campaign, tmp_path, command):
    """--out under a regular file (a path no one can create): one `error:` line naming the path
    and the OS error, no traceback."""
    folder, _ = campaign
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / ("train.jsonl" if command == "export" else "vocab")
    args = [command, str(folder), "--out", str(out)]
    if command == "vocab":
        args += ["--draft-vocab-size", "4", "--target-vocab-size", "300000"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(out) in lines[0], result.output
    assert lines[0].endswith((": File exists", ": Not a directory")), lines[0]
    assert "Traceback" not in result.output


def test_compact_on_a_full_disk_is_one_line(campaign, monkeypatch):
    """An OSError out of compact (ENOSPC here) ends the CLI in one line naming the path and the error."""
    import errno

    from eagle_synth.cli import records as records_cli

    folder, _ = campaign
    shard = folder / "records" / "shard-0001.msgpack.zst"

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(shard))

    monkeypatch.setattr(records_cli, "run_compact", full_disk)
    result = CliRunner().invoke(app, ["compact", str(folder)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(shard) in lines[0] and "No space left on device" in lines[0], result.output
