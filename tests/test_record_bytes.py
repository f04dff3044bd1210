"""Record file bytes are pinned: a batch file and a shard written from fixed records must stay
byte-identical (the on-disk format is a contract with every reader, old and new)."""

from __future__ import annotations

import hashlib

import zstandard

import eagle_synth.records as records
from eagle_synth.records import RawRecord, Record, ShardWriter, encode_record_file

# sha256 of what the format wrote when these were pinned (commit 1adaf61).
BATCH_FILE_SHA = "8b82dedf9c8331e2d74cc281e5e569f6cce745ee28473423c736c1ec36a8aa50"
BATCH_STREAM_SHA = "6a884478e49f90462aa41bd75ae673a76d3bad61ba30225f684cefe24295d752"
SHARD_STREAM_SHA = "927f90a016a61a22b346ce183936fd86c9214a5a77d57647421d6cfa7444b292"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_batch_file_bytes_are_pinned(monkeypatch):
    monkeypatch.setattr(records.time, "time", lambda: 1700000000.25)
    recs = [
        Record(
            key="k1", id="row-1", sample=0, turn=0, prompt_ids=[1, 2, 70000], output_ids=[4, 5, 6],
            finish_reason="stop", finish_matched=6, prompt_tokens=3, completion_tokens=3, campaign="c",
            sampling={"temperature": 0.6, "sampling_seed": 7}, source="in.jsonl:1", server="http://s",
            worker="w@h", e2e_latency=1.5, created_at=1700000000.5, repaired_prefix=1, backend="vllm",
        ),
        Record(
            key="k2", id="row-2", sample=1, turn=2, prompt_ids=[1 << 25], output_ids=[], finish_reason="length",
            finish_matched=None, prompt_tokens=1, completion_tokens=0, conversation="conv", variant="v", tool_calls=2,
        ),
    ]  # fmt: skip
    data = encode_record_file(recs, campaign="c", batch="b1")
    assert _sha(zstandard.ZstdDecompressor().decompress(data)) == BATCH_STREAM_SHA
    assert _sha(data) == BATCH_FILE_SHA


def test_shard_bytes_are_pinned(monkeypatch, tmp_path):
    monkeypatch.setattr(records.time, "time", lambda: 1700000000.25)
    meta = {"key": "k3", "id": "r3", "sample": 0, "turn": 0, "finish_reason": "stop", "finish_matched": 2}
    meta.update(prompt_tokens=1, completion_tokens=1, campaign="c", batch="b")
    with ShardWriter(tmp_path, campaign="c", sources=["b-00.zst"], level=3) as writer:
        writer.add(RawRecord(meta=meta, prompt_u32=b"\x01\x00\x00\x00", output_u32=b"\x02\x00\x00\x01", src=0))
        path = writer.commit()
    stream = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
    assert _sha(stream) == SHARD_STREAM_SHA
