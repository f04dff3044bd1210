"""Export filters: clipping with the mask aligned, drops counted, splits that keep a conversation
together, deterministic sampling; checked on the real output files against iter_records."""

from __future__ import annotations

import json
import shutil

import pytest

from eagle_synth.progress import reported
from eagle_synth.records import RawRecord
from eagle_synth.tools.export import export_records
from eagle_synth.tools.filters import ExportFilters, conversation_key, parse_split, split_of
from tests.export_helpers import by_key, conversation_records, write_campaign


def jsonl_rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def campaign(tmp_path):
    folder = write_campaign(tmp_path / "camp", conversation_records(40))
    return folder, by_key(folder)


def test_max_length_clips_ids_and_mask_together(campaign, tmp_path):
    folder, records = campaign
    result = export_records(folder, tmp_path / "c.jsonl", filters=ExportFilters(max_length=13))
    rows = {row["key"]: row for row in jsonl_rows(tmp_path / "c.jsonl")}
    longer = [r for r in records.values() if len(r.input_ids) > 13]
    # Prompts of the third turn are 16 ids: clipped to 13 they hold no generated id and are left out.
    no_loss = [r for r in longer if len(r.prompt_ids) >= 13]
    assert longer and no_loss and len(no_loss) < len(longer)
    assert result.stats.clipped == len(longer) - len(no_loss)
    assert result.stats.dropped == {"few_loss_tokens": len(no_loss)}
    assert len(rows) == len(records) - len(no_loss)
    for key, row in rows.items():
        record = records[key]
        assert row["input_ids"] == record.input_ids[:13] and row["loss_mask"] == record.loss_mask[:13]
        matched = row["finish_matched"]  # JSON text: an id, a (non-ASCII) stop string, or null
        assert (None if matched is None else json.loads(matched)) == record.finish_matched
        assert (row["prompt_tokens"], row["completion_tokens"]) == (
            len(record.prompt_ids),
            min(len(record.output_ids), 13 - len(record.prompt_ids)),
        )


def test_filters_drop_in_order_and_count_each_reason(campaign, tmp_path):
    folder, records = campaign
    filters = ExportFilters(
        drop_truncated=True, min_output_tokens=3, max_length=16, drop_longer=True, min_loss_tokens=4
    )
    result = export_records(folder, tmp_path / "f.jsonl", filters=filters)
    expected: dict[str, int] = {}
    kept = []
    for record in records.values():
        if record.finish_reason == "length":
            reason = "truncated"
        elif len(record.output_ids) < 3:
            reason = "short_output"
        elif len(record.input_ids) > 16:
            reason = "too_long"
        elif len(record.output_ids) < 4:
            reason = "few_loss_tokens"
        else:
            kept.append(record.key)
            continue
        expected[reason] = expected.get(reason, 0) + 1
    assert result.stats.dropped == expected and len(expected) == 4
    assert sorted(row["key"] for row in jsonl_rows(tmp_path / "f.jsonl")) == sorted(kept)
    assert result.stats.read == len(records) and result.stats.clipped == 0


def test_split_keeps_every_turn_and_sample_of_a_conversation_together(campaign, tmp_path):
    folder, records = campaign
    filters = ExportFilters(splits=(("test", 0.2), ("val", 0.1)))
    result = export_records(folder, tmp_path / "data.jsonl", filters=filters)
    assert [p.name for p in result.paths] == ["data-train.jsonl", "data-test.jsonl", "data-val.jsonl"]
    split_by_key = {
        row["key"]: name for name in ("train", "test", "val") for row in jsonl_rows(tmp_path / f"data-{name}.jsonl")
    }
    assert set(split_by_key) == set(records)  # every row in exactly one split
    conversations: dict[tuple, set[str]] = {}
    for key, name in split_by_key.items():
        conversations.setdefault((records[key].id, records[key].sample), set()).add(name)
    assert all(len(names) == 1 for names in conversations.values())
    shares = {
        name: sum(1 for names in conversations.values() if name in names) / len(conversations)
        for name in ("train", "test", "val")
    }
    assert 0.55 < shares["train"] < 0.9 and 0.05 < shares["test"] < 0.4 and 0 < shares["val"] < 0.25, shares
    # Stable: the same conversation goes to the same split in another export, whatever else changes.
    again = export_records(
        folder, tmp_path / "again.jsonl", filters=ExportFilters(splits=filters.splits, max_length=15)
    )
    for name in ("train", "test", "val"):
        assert {row["key"] for row in jsonl_rows(tmp_path / f"again-{name}.jsonl")} <= {
            k for k, n in split_by_key.items() if n == name
        }
    assert again.split_rows["test"] > 0


def test_conversation_key_prefers_a_conversation_field():
    turn = {"key": "k1", "id": "row1", "sample": 1}
    assert conversation_key(turn) == conversation_key({**turn, "key": "k2", "turn": 3})
    assert conversation_key(turn) != conversation_key({**turn, "sample": 0})
    assert conversation_key({**turn, "conversation": "c9"}) == conversation_key(
        {"key": "x", "id": "other", "conversation": "c9"}
    )
    assert conversation_key({"key": "k1", "id": ""}) != conversation_key({"key": "k2", "id": ""})
    splits = (("test", 0.5),)
    assert {split_of({"key": str(n), "id": "same", "sample": 0}, splits) for n in range(50)} in ({"test"}, {"train"})


def test_parse_split_refuses_bad_specs_with_the_flag_named():
    assert parse_split("test=0.01, val=0.02") == (("test", 0.01), ("val", 0.02))
    for bad in ("test", "test=0", "test=1.5", "a b=0.1", "test=0.6,val=0.5", "test=0.1,test=0.2", "train=0.9"):
        with pytest.raises(ValueError, match="--split"):
            parse_split(bad)


def test_sample_is_exact_deterministic_and_independent_of_file_order(campaign, tmp_path):
    folder, records = campaign
    filters = ExportFilters(sample=25, seed=3, drop_truncated=True)
    first = export_records(folder, tmp_path / "a.jsonl", filters=filters)
    keys = sorted(row["key"] for row in jsonl_rows(tmp_path / "a.jsonl"))
    assert first.rows == 25 and len(set(keys)) == 25
    assert all(records[k].finish_reason == "stop" for k in keys)  # drawn among the rows the filters keep
    assert first.stats.dropped["not_sampled"] == sum(r.finish_reason == "stop" for r in records.values()) - 25
    # The same records in other files (another order): the same rows.
    moved = write_campaign(tmp_path / "moved", list(reversed(list(records.values()))), per_file=5)
    export_records(moved, tmp_path / "b.jsonl", filters=filters)
    assert sorted(row["key"] for row in jsonl_rows(tmp_path / "b.jsonl")) == keys
    export_records(folder, tmp_path / "c.jsonl", filters=ExportFilters(sample=25, seed=4, drop_truncated=True))
    assert sorted(row["key"] for row in jsonl_rows(tmp_path / "c.jsonl")) != keys
    everything = export_records(folder, tmp_path / "d.jsonl", filters=ExportFilters(sample=10_000))
    assert everything.rows == len(records) and "not_sampled" not in everything.stats.dropped
    shutil.rmtree(moved)


def test_progress_hears_each_phase_and_the_records_read(campaign, tmp_path):
    folder, records = campaign
    heard: list = []

    class Listener:
        def phase(self, description: str) -> None:
            heard.append(description)

        def update(self, records_read: int) -> None:
            heard.append(records_read)

    export_records(folder, tmp_path / "p.jsonl", filters=ExportFilters(sample=5), progress=Listener())
    assert heard[0] == "sampling" and "exporting" in heard and heard[-1] == len(records)
    assert list(reported(iter([]), None, "x")) == []


def test_rows_written_equal_raw_records_shaped_by_the_filters(campaign):
    folder, _ = campaign
    from eagle_synth.records import iter_raw_records

    filters = ExportFilters(max_length=12)
    for raw in iter_raw_records(folder):
        row, reason = filters.shape(raw)
        if row is None:
            assert reason == "few_loss_tokens" and raw.prompt_len >= 12
            continue
        assert isinstance(row, RawRecord) and row.prompt_len + row.output_len == min(
            12, raw.prompt_len + raw.output_len
        )
        assert row.prompt_u32 + row.output_u32 == (raw.prompt_u32 + raw.output_u32)[: 4 * 12]
