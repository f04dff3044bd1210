"""Tests for producer.sources: real files in tmp_path, every format and failure mode."""

from __future__ import annotations

import gzip
import io
import json
import os
import tracemalloc

import pytest

from eagle_synth.errors import InputError
from producer import sources
from producer.resume import ResumeCursors
from producer.sources import BadRow, SourceRow, expand_inputs, iter_source_rows


def _rows(paths, **kwargs):
    return list(iter_source_rows([str(p) for p in paths], **kwargs))


def _summary(items):
    """(kind, line, payload) triples: data dict for rows, reason for bad rows."""
    return [("row", it.line, it.data) if isinstance(it, SourceRow) else ("bad", it.line, it.reason) for it in items]


def _jsonl_bytes(objs) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


# --------------------------------------------------------------------------- JSONL


def test_jsonl_rows_numbered_by_physical_line_and_blank_lines_skipped(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n\n   \r\n{"a": 2}\r\n')
    items = _rows([p])
    assert items == [SourceRow(str(p), 1, {"a": 1}), SourceRow(str(p), 4, {"a": 2})]


def test_jsonl_bad_lines_become_bad_rows_and_reading_continues(tmp_path):
    p = tmp_path / "a.ndjson"
    p.write_bytes(b'{"a": 1}\n{"a": \n[1, 2]\n"str"\n{"b": "\xff\xfe"}\n{"a": 3}\n')
    assert _summary(_rows([p])) == [
        ("row", 1, {"a": 1}),
        ("bad", 2, "bad-json"),
        ("bad", 3, "not-an-object"),
        ("bad", 4, "not-an-object"),
        ("bad", 5, "non-utf8"),
        ("row", 6, {"a": 3}),
    ]


def test_bad_json_detail_carries_the_parser_message(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1,}\n')
    (bad,) = _rows([p])
    assert bad.reason == "bad-json" and "column" in bad.detail


def test_jsonl_deep_nesting_and_huge_int_are_bad_json_not_crashes(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"[" * 100_000 + b"\n" + b'{"n": ' + b"9" * 5000 + b"}\n" + b'{"ok": 1}\n')
    assert _summary(_rows([p])) == [("bad", 1, "bad-json"), ("bad", 2, "bad-json"), ("row", 3, {"ok": 1})]


def test_final_line_without_newline_parses_if_complete(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert _summary(_rows([p])) == [("row", 1, {"a": 1}), ("row", 2, {"a": 2})]


def test_final_line_cut_short_is_truncated_file_after_earlier_rows(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": "hel')
    items = _rows([p])
    assert _summary(items) == [("row", 1, {"a": 1}), ("row", 2, {"a": 2}), ("bad", 3, "truncated-file")]


def test_final_line_cut_inside_utf8_char_is_truncated_not_non_utf8(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": "caf' + "é".encode()[:1])
    assert _summary(_rows([p]))[-1] == ("bad", 2, "truncated-file")


def test_utf8_bom_on_first_line_is_ignored(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"a": "\xc3\xa9"}\n')
    assert _rows([p]) == [SourceRow(str(p), 1, {"a": "é"})]


def test_content_strings_are_not_altered(tmp_path):
    p = tmp_path / "a.jsonl"
    row = {"prompt": "  two spaces\n\ttab and trailing newline\n", "n": 1.5}
    p.write_bytes(_jsonl_bytes([row]))
    assert _rows([p])[0].data == row


def test_gzip_jsonl(tmp_path):
    p = tmp_path / "a.jsonl.gz"
    p.write_bytes(gzip.compress(_jsonl_bytes([{"i": i} for i in range(5)])))
    assert [it.data["i"] for it in _rows([p])] == list(range(5))


def test_truncated_gzip_yields_earlier_rows_then_truncated_file(tmp_path):
    p = tmp_path / "a.jsonl.gz"
    payload = _jsonl_bytes([{"i": i, "pad": os.urandom(8).hex()} for i in range(3000)])
    p.write_bytes(gzip.compress(payload)[:-300])
    items = _rows([p])
    rows, bad = items[:-1], items[-1]
    assert all(isinstance(r, SourceRow) for r in rows)
    assert 100 < len(rows) < 3000
    assert [r.data["i"] for r in rows] == list(range(len(rows)))
    assert bad.reason == "truncated-file" and bad.line == len(rows) + 1


def test_corrupt_gzip_is_unreadable_file(tmp_path):
    p = tmp_path / "a.jsonl.gz"
    p.write_bytes(b"this is not gzip at all\n")
    (bad,) = _rows([p])
    assert (bad.reason, bad.line) == ("unreadable-file", 1)


def test_zstd_jsonl_multi_frame_and_truncated(tmp_path):
    zstd = pytest.importorskip("zstandard")
    compressor = zstd.ZstdCompressor()
    whole = tmp_path / "a.jsonl.zst"
    # Two concatenated frames, as produced by appending or parallel compressors.
    whole.write_bytes(
        compressor.compress(_jsonl_bytes([{"i": 0}, {"i": 1}])) + compressor.compress(_jsonl_bytes([{"i": 2}]))
    )
    assert [it.data["i"] for it in _rows([whole])] == [0, 1, 2]

    cut = tmp_path / "b.jsonl.zst"
    payload = _jsonl_bytes([{"i": i, "pad": os.urandom(16).hex()} for i in range(20000)])
    cut.write_bytes(compressor.compress(payload)[:-500])
    items = _rows([cut])
    assert isinstance(items[-1], BadRow) and items[-1].reason == "truncated-file"
    rows = items[:-1]
    assert len(rows) > 1000 and [r.data["i"] for r in rows] == list(range(len(rows)))


def test_corrupt_zstd_is_unreadable_file(tmp_path):
    pytest.importorskip("zstandard")
    p = tmp_path / "a.jsonl.zst"
    p.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00garbage" * 10)
    (bad,) = _rows([p])
    assert (bad.reason, bad.line) == ("unreadable-file", 1)


def test_zstd_garbage_after_a_frame_keeps_the_frame_rows(tmp_path):
    zstd = pytest.importorskip("zstandard")
    p = tmp_path / "a.jsonl.zst"
    p.write_bytes(zstd.ZstdCompressor().compress(_jsonl_bytes([{"i": 0}, {"i": 1}])) + b"not zstd")
    assert _summary(_rows([p])) == [("row", 1, {"i": 0}), ("row", 2, {"i": 1}), ("bad", 3, "unreadable-file")]


def test_stdin_jsonl_via_argument(tmp_path):
    stream = io.BytesIO(b'{"a": 1}\nnope\n')
    items = _rows(["-"], stdin=stream)
    assert _summary(items) == [("row", 1, {"a": 1}), ("bad", 2, "bad-json")]
    assert {it.source for it in items} == {"-"}
    assert not stream.closed


# --------------------------------------------------------------------------- JSON


def test_json_array_streams_objects_with_1_based_index(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('\n  [{"a": 1}, 7, {"a": 2.5, "b": [1, {"c": null}]}]\n')
    assert _summary(_rows([p])) == [
        ("row", 1, {"a": 1}),
        ("bad", 2, "not-an-object"),
        ("row", 3, {"a": 2.5, "b": [1, {"c": None}]}),
    ]
    # floats, not Decimal: rows must be plain JSON-compatible python values
    assert type(_rows([p])[2].data["a"]) is float


def test_json_array_truncated(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('[{"a": 1}, {"a": 2}, {"a": ')
    assert _summary(_rows([p])) == [("row", 1, {"a": 1}), ("row", 2, {"a": 2}), ("bad", 3, "truncated-file")]


def test_json_array_syntax_error_stops_file_with_bad_json(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('[{"a": 1},, {"a": 2}]')
    assert _summary(_rows([p])) == [("row", 1, {"a": 1}), ("bad", 2, "bad-json")]


def test_json_array_with_bom_and_gzip(tmp_path):
    p = tmp_path / "a.json.gz"
    p.write_bytes(gzip.compress(b'\xef\xbb\xbf[{"a": 1}]'))
    assert _summary(_rows([p])) == [("row", 1, {"a": 1})]


def test_json_file_holding_jsonl(tmp_path):
    p = tmp_path / "a.json"
    p.write_bytes(b'\n{"a": 1}\n{"a": 2}\n')
    assert _summary(_rows([p])) == [("row", 2, {"a": 1}), ("row", 3, {"a": 2})]


def test_pretty_printed_json_object_is_one_unsupported_layout_row(tmp_path):
    p = tmp_path / "a.json"
    p.write_text(json.dumps({"data": [{"a": 1}, {"a": 2}]}, indent=2))
    assert _summary(_rows([p])) == [("bad", 1, "unsupported-layout")]


def test_empty_files_yield_nothing(tmp_path):
    (tmp_path / "a.json").write_bytes(b"  \n")
    (tmp_path / "b.jsonl").write_bytes(b"")
    (tmp_path / "c.json").write_text("[]")
    assert _rows([tmp_path / "a.json", tmp_path / "b.jsonl", tmp_path / "c.json"]) == []


# --------------------------------------------------------------------------- Parquet / datasets


def test_parquet_rows_across_batches(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setattr(sources, "PARQUET_BATCH_ROWS", 3)
    rows = [{"id": i, "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(10)]
    p = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p, row_group_size=4)
    items = _rows([p])
    assert [it.line for it in items] == list(range(1, 11))
    assert [it.data for it in items] == rows


def test_corrupt_parquet_is_unreadable_file(tmp_path):
    pytest.importorskip("pyarrow")
    p = tmp_path / "a.parquet"
    p.write_bytes(b"PAR1 definitely not parquet")
    (bad,) = _rows([p])
    assert (bad.reason, bad.line) == ("unreadable-file", 0)


def test_saved_dataset_reads_shards_in_state_order(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"id": i, "prompt": f"p{i}"} for i in range(7)]
    path = tmp_path / "ds"
    datasets.Dataset.from_list(rows).save_to_disk(str(path), num_shards=3)
    items = _rows([path])
    assert [it.data for it in items] == rows
    assert [it.line for it in items] == list(range(1, 8))
    assert {it.source for it in items} == {str(path)}


def test_saved_dataset_dict_reads_each_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "dd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}]),
            "test": datasets.Dataset.from_list([{"prompt": "c"}]),
        }
    ).save_to_disk(str(path))
    items = _rows([path])
    assert [(it.source, it.line, it.data["prompt"]) for it in items] == [
        (os.path.join(str(path), "train"), 1, "a"),
        (os.path.join(str(path), "train"), 2, "b"),
        (os.path.join(str(path), "test"), 1, "c"),
    ]


def test_dataset_with_damaged_shard_reports_unreadable_after_good_rows(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "ds"
    datasets.Dataset.from_list([{"x": i} for i in range(6)]).save_to_disk(str(path), num_shards=2)
    shard = json.loads((path / "state.json").read_text())["_data_files"][1]["filename"]
    (path / shard).write_bytes(b"garbage")
    items = _rows([path])
    assert _summary(items) == [("row", i + 1, {"x": i}) for i in range(3)] + [("bad", 4, "unreadable-file")]


# --------------------------------------------------------------------------- discovery and errors


def test_multiple_inputs_keep_order_and_source(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.json"
    a.write_bytes(_jsonl_bytes([{"f": "a"}]))
    b.write_text('[{"f": "b"}]')
    assert [(it.source, it.data["f"]) for it in _rows([b, a])] == [(str(b), "b"), (str(a), "a")]


def test_iter_source_rows_checks_all_paths_before_reading(tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_bytes(b'{"a": 1}\n')
    with pytest.raises(InputError, match="missing.jsonl"):
        iter_source_rows([str(good), str(tmp_path / "missing.jsonl")])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputError, match=r"notes\.txt.*unknown input format"):
        iter_source_rows([str(tmp_path / "notes.txt")])
    with pytest.raises(InputError, match="not a saved Hugging Face dataset"):
        iter_source_rows([str(tmp_path)])
    (tmp_path / "x.parquet.gz").write_bytes(b"")
    with pytest.raises(InputError, match="compressed parquet"):
        iter_source_rows([str(tmp_path / "x.parquet.gz")])


def test_expand_inputs_globs_sorted_dedup_and_stdin(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.parquet.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.json").write_text("[]")
    a, b, d = (str(tmp_path / n) for n in ("a.jsonl", "b.jsonl", os.path.join("sub", "d.json")))
    assert expand_inputs([str(tmp_path / "*.jsonl"), "-", b, str(tmp_path / "**" / "*.json")]) == [a, b, "-", d]


def test_expand_inputs_glob_keeps_dataset_dirs_and_skips_plain_dirs(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "state.json").write_text("{}")
    (tmp_path / "plain").mkdir()
    (tmp_path / "x.jsonl").write_text("")
    assert expand_inputs([str(tmp_path / "*")]) == [str(tmp_path / "ds"), str(tmp_path / "x.jsonl")]


def test_expand_inputs_errors_name_the_pattern(tmp_path):
    with pytest.raises(InputError, match=r"nothing-\*\.jsonl.*matched no input files"):
        expand_inputs([str(tmp_path / "nothing-*.jsonl")])
    with pytest.raises(InputError, match="nope.jsonl.*no such file"):
        expand_inputs([str(tmp_path / "nope.jsonl")])
    with pytest.raises(InputError, match="no inputs given"):
        expand_inputs([])
    (tmp_path / "r.md").write_text("")
    with pytest.raises(InputError, match=r"r\.md.*unknown input format"):
        expand_inputs([str(tmp_path / "*.md")])


def test_an_input_is_identified_by_its_size_and_mtime(tmp_path):
    # How a rerun tells it reads the same file: producer/resume.py's cursor field, read afresh each time.
    def identity(path):
        return ResumeCursors(None, None, scope="s", enabled=True)._field(str(path))

    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n')
    os.utime(p, ns=(1_000_000_000, 1_000_000_000))
    first = identity(p)
    assert first == f"s|{p.resolve()}|9|1000000000"
    assert identity(p) == first
    p.write_bytes(b'{"a": 12}\n')
    os.utime(p, ns=(1_000_000_000, 1_000_000_000))
    assert identity(p) != first
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "state.json").write_text("{}")
    # stdin, a dataset folder and a missing file have no identity: no cursor applies to them.
    assert [identity(x) for x in ("-", tmp_path / "ds", tmp_path / "gone.jsonl")] == [None] * 3


# --------------------------------------------------------------------------- memory


@pytest.mark.parametrize("layout", ["jsonl", "json"])
def test_memory_stays_flat_while_streaming(tmp_path, layout):
    n, pad = 20_000, "x" * 200  # ~4.5 MB of input
    if layout == "jsonl":
        p = tmp_path / "big.jsonl"
        p.write_bytes(_jsonl_bytes({"i": i, "pad": pad} for i in range(n)))
    else:
        p = tmp_path / "big.json"
        p.write_text("[" + ",".join(json.dumps({"i": i, "pad": pad}) for i in range(n)) + "]")
    assert p.stat().st_size > 4_000_000
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_source_rows([str(p)]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n
    assert peak < 1_000_000, f"peak {peak} bytes while streaming a {p.stat().st_size} byte file"
