"""Record files: round trips, the u24 codec and its wide fallback, version 1 files, damage,
batch_files, and the reader's deduplication."""

from __future__ import annotations

import msgpack
import pytest
import zstandard

from eagle_synth.errors import RecordFormatError
from eagle_synth.ids import pack_ids
from eagle_synth.records import (
    FORMAT_NAME,
    FORMAT_VERSION,
    ID_CODEC,
    Record,
    batch_files,
    iter_raw_records,
    iter_records,
    read_file_header,
    read_record_file,
    record_files,
    scan_campaign,
    write_record_file,
)


def rec(key: str, prompt=(1, 2, 3), output=(4, 5, 6), **extra) -> Record:
    values = dict(
        key=key,
        id=f"row-{key}",
        sample=0,
        turn=0,
        prompt_ids=list(prompt),
        output_ids=list(output),
        finish_reason="stop",
        finish_matched=6,
        prompt_tokens=len(prompt),
        completion_tokens=len(output),
    )
    values.update(extra)
    return Record(**values)


def _unpack(raw: bytes):
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    yield from unpacker


def write_v1(folder, batch: str, records: list[Record]) -> None:
    """A version 1 file exactly as the first release wrote it: u32le ids, no per-record batch."""
    header = {
        "format": FORMAT_NAME,
        "version": 1,
        "id_codec": "u32le",
        "campaign": "old",
        "batch": batch,
        "created_at": 0.0,
    }
    parts = [msgpack.packb(header, use_bin_type=True)]
    for r in records:
        wire = {k: getattr(r, k) for k in Record.__dataclass_fields__ if k != "batch"}
        wire["prompt_ids"], wire["output_ids"] = pack_ids(r.prompt_ids), pack_ids(r.output_ids)
        parts.append(msgpack.packb(wire, use_bin_type=True))
    (folder / "records").mkdir(parents=True, exist_ok=True)
    (folder / "records" / f"{batch}-00000000.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(parts)))


def test_round_trip_keeps_every_field_and_fills_batch(tmp_path):
    original = rec(
        "k1",
        prompt=[248045, 0, 248068],
        output=[11, 248046],
        finish_matched=248046,
        cached_tokens=2,
        campaign="c",
        sampling={"temperature": 0.6, "sampling_seed": 7},
        source="a.jsonl:3",
        server="http://s:30000",
        worker="w@h",
        e2e_latency=1.5,
        created_at=123.0,
        repaired_prefix=1,
    )
    path = write_record_file(tmp_path, campaign="c", batch="00ff", records=[original])
    (back,) = list(read_record_file(path))
    assert back.batch == "00ff"
    back.batch = ""
    assert back == original
    assert back.input_ids == [248045, 0, 248068, 11, 248046]
    assert back.loss_mask == [0, 0, 0, 1, 1]


def test_ids_take_three_bytes_and_a_wide_id_falls_back_per_record(tmp_path):
    narrow, wide = rec("n", prompt=[248076] * 10, output=[1] * 5), rec("w", prompt=[2**24], output=[2**32 - 1])
    path = write_record_file(tmp_path, campaign="c", batch="ab", records=[narrow, wide])
    header, first, second = list(_unpack(zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())))
    assert header["id_codec"] == ID_CODEC == "u24le" and header["version"] == FORMAT_VERSION == 2
    assert len(first["prompt_ids"]) == 30 and "id_codec" not in first
    assert second["id_codec"] == "u32le" and len(second["prompt_ids"]) == 4
    back = {r.key: r for r in read_record_file(path)}
    assert back["n"].prompt_ids == [248076] * 10
    assert back["w"].prompt_ids == [2**24] and back["w"].output_ids == [2**32 - 1]
    raw = {r.key: r for r in iter_raw_records(tmp_path)}
    assert raw["w"].prompt_u32 == pack_ids([2**24]) and raw["n"].prompt_len == 10


def test_version_1_files_are_still_read(tmp_path):
    write_v1(tmp_path, "0a0a", [rec("old1", prompt=[70000, 3]), rec("old2")])
    write_record_file(tmp_path, campaign="c", batch="0b0b", records=[rec("new1")])
    records = {r.key: r for r in iter_records(tmp_path)}
    assert set(records) == {"old1", "old2", "new1"}
    assert records["old1"].prompt_ids == [70000, 3]
    assert records["old1"].batch == "0a0a" and records["old1"].campaign == "old"


def test_a_newer_version_is_refused_with_advice(tmp_path):
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION + 1, "id_codec": "u24le", "campaign": "c"}
    path = tmp_path / "records" / "ff-1.zst"
    path.parent.mkdir()
    path.write_bytes(zstandard.ZstdCompressor().compress(msgpack.packb(header)))
    with pytest.raises(RecordFormatError, match="upgrade eagle-synth"):
        list(read_record_file(path))


@pytest.mark.parametrize("damage", ["truncate", "flip", "trailing"])
def test_damaged_files_raise_naming_the_file(tmp_path, damage):
    path = write_record_file(
        tmp_path, campaign="c", batch="ab", records=[rec(f"k{i}", prompt=list(range(i, i + 300))) for i in range(50)]
    )
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 40]
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data += b"junk"
    path.write_bytes(bytes(data))
    with pytest.raises(RecordFormatError, match=path.name):
        list(read_record_file(path))


def test_batch_files_match_only_that_batch_never_shards_or_temporaries(tmp_path):
    mine = write_record_file(tmp_path, campaign="c", batch="abcd", records=[rec("1")])
    write_record_file(tmp_path, campaign="c", batch="abcd-ef", records=[rec("2")])
    write_record_file(tmp_path, campaign="c", batch="abcdef", records=[rec("3")])
    folder = tmp_path / "records"
    (folder / "shard-20260101T000000-abcd0000.zst").write_bytes(mine.read_bytes())
    (folder / ".tmp-abcd-x.zst").write_bytes(b"")
    assert batch_files(tmp_path, "abcd") == [mine]
    assert batch_files(tmp_path, "shard") == []
    assert [p.name for p in record_files(tmp_path)][-1].startswith("shard-")
    with pytest.raises(ValueError, match="reserved"):
        write_record_file(tmp_path, campaign="c", batch="shard", records=[rec("4")])


def test_a_key_repeated_within_a_batch_is_read_once(tmp_path):
    # A crash after the rename, a redo elsewhere: two files of one batch share a key.
    write_record_file(tmp_path, campaign="c", batch="aa", records=[rec("k1"), rec("k2")])
    write_record_file(tmp_path, campaign="c", batch="aa", records=[rec("k2", output=[9]), rec("k3")])
    write_record_file(tmp_path, campaign="c", batch="bb", records=[rec("k4")])
    assert scan_campaign(tmp_path).repeated_batches == {"aa"}
    assert sorted(r.key for r in iter_records(tmp_path)) == ["k1", "k2", "k3", "k4"]
    assert sorted(r.key for r in iter_records(tmp_path, dedupe=False)) == ["k1", "k2", "k2", "k3", "k4"]


def test_reader_ignores_temporaries_and_explains_a_missing_folder(tmp_path):
    write_record_file(tmp_path, campaign="c", batch="aa", records=[rec("k1")])
    (tmp_path / "records" / ".tmp-half.zst").write_bytes(b"\x28\xb5")
    assert [r.key for r in iter_records(tmp_path)] == ["k1"]
    with pytest.raises(FileNotFoundError, match="campaign folder"):
        list(iter_records(tmp_path / "nope"))


def test_header_reads_without_reading_records(tmp_path):
    path = write_record_file(tmp_path, campaign="c", batch="aa", records=[rec("k1")])
    header = read_file_header(path)
    assert header["kind"] == "batch" and header["batch"] == "aa" and header["campaign"] == "c"


def test_key_set_remembers_every_key_compactly():
    from eagle_synth.key_set import KeySet

    seen = KeySet()
    keys = [f"key-{i}" for i in range(50_000)]
    assert all(seen.add(k) for k in keys)
    assert not any(seen.add(k) for k in keys[::7])
    assert seen._count == 50_000
    assert len(seen._slots) * seen._slots.itemsize <= 32 * 50_000, (
        "at most 32 bytes per key (a table between a quarter and half full)"
    )
