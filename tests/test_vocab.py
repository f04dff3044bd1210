"""`eagle-synth vocab`: token frequencies over loss-masked tokens and the EAGLE-3 draft vocabulary
(d2t offsets, t2d mask), checked against a plain recount with collections.Counter."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from typer.testing import CliRunner

from eagle_synth.cli.commands import app
from eagle_synth.errors import VocabError
from eagle_synth.records import RawRecord, write_manifest
from eagle_synth.tools.filters import ExportFilters
from eagle_synth.tools.vocab import TORCH_MISSING, TokenCounts, build_vocab, build_vocab_mapping, torch_module
from tests.export_helpers import by_key, conversation_records, write_campaign

TARGET_VOCAB = 248_320  # a padded lm_head, larger than the tokenizer


def recount(records, *, max_length=None, drop_truncated=False) -> Counter:
    counts: Counter[int] = Counter()
    for record in records:
        if drop_truncated and record.finish_reason == "length":
            continue
        ids, mask = record.input_ids, record.loss_mask
        if max_length is not None:
            ids, mask = ids[:max_length], mask[:max_length]
        counts.update(i for i, m in zip(ids, mask, strict=True) if m)
    return counts


def plain_choice(counts: Counter, n: int) -> list[int]:
    """The documented rule, written the obvious way: count descending, then id ascending; fill with the lowest unused ids."""
    chosen = sorted(counts, key=lambda i: (-counts[i], i))[:n]
    filler = (i for i in range(n + len(chosen)) if i not in set(chosen))
    while len(chosen) < n:
        chosen.append(next(filler))
    return sorted(chosen)


@pytest.fixture
def campaign(tmp_path):
    folder = write_campaign(tmp_path / "camp", conversation_records(30))
    return folder, by_key(folder)


def test_vocab_equals_a_counter_recount_and_writes_every_file(campaign, tmp_path):
    folder, records = campaign
    filters = ExportFilters(max_length=14, drop_truncated=True)
    result = build_vocab(
        folder, tmp_path / "vocab", draft_vocab_size=20, target_vocab_size=TARGET_VOCAB, filters=filters
    )
    counts = recount(records.values(), max_length=14, drop_truncated=True)
    assert len(counts) > 20  # a real choice: more distinct ids than draft slots
    freq = json.loads((tmp_path / "vocab" / "token_freq.json").read_text())
    assert {int(k): v for k, v in freq.items()} == dict(counts)
    d2t = np.load(tmp_path / "vocab" / "d2t.npy")
    t2d = np.load(tmp_path / "vocab" / "t2d.npy")
    assert d2t.dtype == np.int64 and d2t.shape == (20,)
    assert t2d.dtype == np.bool_ and t2d.shape == (TARGET_VOCAB,)
    chosen = plain_choice(counts, 20)
    assert (d2t + np.arange(20)).tolist() == chosen == np.flatnonzero(t2d).tolist()
    mapping = json.loads((tmp_path / "vocab" / "vocab_mapping.json").read_text())
    assert mapping["d2t"] == d2t.tolist() and mapping["t2d"] == t2d.tolist()
    assert mapping["loss_tokens"] == sum(counts.values()) == result.mapping.total
    assert mapping["covered_tokens"] == sum(counts[i] for i in chosen)
    torch = torch_module()
    names = {p.name for p in result.paths}
    if torch is None:
        assert names == {"token_freq.json", "d2t.npy", "t2d.npy", "vocab_mapping.json"}
        assert result.warnings == [TORCH_MISSING] and not result.torch_files
    else:
        saved = torch.load(tmp_path / "vocab" / "vocab_mapping.pt")
        assert saved["d2t"].tolist() == d2t.tolist() and saved["t2d"].dtype == torch.bool


def test_ties_at_the_cut_go_to_the_lower_id_and_missing_slots_fill_from_zero():
    counts = TokenCounts()
    ids = np.array([9, 9, 9, 7, 7, 5, 5, 3, 12, 12], dtype="<u4").tobytes()
    counts.add_rows([RawRecord(meta={}, prompt_u32=b"", output_u32=ids)])
    # 9:3, 12:2, 7:2, 5:2, 3:1 -> three slots: 9, then the tie 5/7/12 breaks by id: 5, 7.
    assert _kept(build_vocab_mapping(counts.counts, draft_vocab_size=3, target_vocab_size=16)) == [5, 7, 9]
    filled = build_vocab_mapping(counts.counts, draft_vocab_size=8, target_vocab_size=16)
    assert _kept(filled) == [0, 1, 2, 3, 5, 7, 9, 12]
    assert filled.covered == filled.total == 10
    assert plain_choice(Counter({9: 3, 12: 2, 7: 2, 5: 2, 3: 1}), 8) == _kept(filled)


def _kept(mapping) -> list[int]:
    """The target ids the draft vocabulary keeps, ascending, read from t2d as a trainer would."""
    return np.flatnonzero(mapping.t2d).tolist()


def test_vocab_refuses_sizes_that_cannot_work(campaign, tmp_path):
    folder, _ = campaign
    with pytest.raises(VocabError, match="--draft-vocab-size"):
        build_vocab(folder, tmp_path / "v", draft_vocab_size=300_000, target_vocab_size=TARGET_VOCAB)
    with pytest.raises(VocabError, match="--target-vocab-size"):
        build_vocab(folder, tmp_path / "v", draft_vocab_size=8, target_vocab_size=1000)  # ids reach 248046
    with pytest.raises(VocabError, match="--target-vocab-size"):
        build_vocab(folder, tmp_path / "v", draft_vocab_size=8)  # no manifest to find the model's config


def test_target_vocab_size_comes_from_the_model_config_next_to_the_tokenizer(campaign, tmp_path):
    folder, _ = campaign
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"text_config": {"vocab_size": TARGET_VOCAB}}))
    write_manifest(folder, {"settings": {"tokenizer_path": str(model), "vocab_size": 248_077}})
    result = build_vocab(folder, tmp_path / "v", draft_vocab_size=8)
    assert result.mapping.t2d.shape == (TARGET_VOCAB,)


def test_cli_vocab_prints_a_summary_and_fails_cleanly(campaign, tmp_path):
    folder, records = campaign
    runner = CliRunner()
    ok = runner.invoke(
        app,
        [
            "vocab",
            str(folder),
            "--draft-vocab-size",
            "16",
            "--target-vocab-size",
            str(TARGET_VOCAB),
            "--out",
            str(tmp_path / "v"),
            "--split",
            "test=0.25",
            "--json",
        ],
    )
    assert ok.exit_code == 0, ok.output
    summary = json.loads(ok.stdout)
    assert summary["draft_vocab_size"] == 16 and 0 < summary["rows"] < len(records)  # only 'train' counted
    assert summary["loss_tokens"] == json.loads((tmp_path / "v" / "vocab_mapping.json").read_text())["loss_tokens"]
    bad = runner.invoke(app, ["vocab", str(folder), "--draft-vocab-size", "16", "--out", str(tmp_path / "w")])
    assert bad.exit_code == 2 and "--target-vocab-size" in bad.output and "Traceback" not in bad.output
