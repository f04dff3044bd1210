"""Our exports read the way the trainers' own loading code reads them (issue #24).

Each test re-implements, minimally, the lines of the trainer it names (cited by file:line at
the commit read: SpecForge a6b6b02, speculators c05b95b, ModelOpt a2fbac7); none of their
code is copied or imported (they need torch and a GPU stack).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import stat
import sys
import tracemalloc
import types
from pathlib import Path

import datasets
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from eagle_synth.cli.commands import app
from eagle_synth.errors import VocabError
from eagle_synth.records import write_manifest, write_record_file
from eagle_synth.tools import conversation_order
from eagle_synth.tools.compact import compact
from eagle_synth.tools.export import SPECFORGE_BYTES_PER_TOKEN, export_records
from eagle_synth.tools.filters import ExportFilters
from eagle_synth.tools.vocab import build_vocab, target_vocab_size_of, torch_module
from tests.export_helpers import by_key, conversation_records, plain_record, torch_format_stand_in, write_campaign

DOCS = Path(__file__).resolve().parents[1] / "docs" / "records.md"
TARGET_VOCAB = 248_320


@pytest.fixture
def campaign(tmp_path):
    folder = write_campaign(tmp_path / "camp", conversation_records(20))
    return folder, by_key(folder)


# ----------------------------------------------------------------------------- speculators


def speculators_split(path: Path, *, train_ratio: float, split: str):
    """speculators' ArrowDataset (train/data.py:163-181 at c05b95b): load_from_disk, then the
    first int(len * train_ratio) rows are train and the rest val."""
    data = datasets.load_from_disk(str(path))
    split_idx = int(len(data) * train_ratio)
    start, stop = (0, split_idx) if split == "train" else (split_idx, len(data))
    return data.select(range(start, stop)), start


def test_speculators_rows_load_as_tensors_though_exported_without_torch(campaign, tmp_path, monkeypatch):
    """state.json names the torch format (datasets' load_from_disk applies `_format_type`), so
    speculators' `dataset_item["input_ids"].tolist()` (train/data.py:83) and the hidden-state
    check `torch.equal(..., self.data[index]["input_ids"])` (train/data.py:286) get tensors;
    `_compute_approx_lengths` reads `with_format(None)["seq_len"]` (train/data.py:218)."""
    folder, records = campaign
    out = tmp_path / "spec"
    export_records(folder, out, format="speculators")
    state = json.loads((out / "state.json").read_text())
    assert (state["_format_type"], state["_format_columns"], state["_format_kwargs"]) == ("torch", None, {})
    if torch_module() is None:  # what a training machine without torch in *this* process would see
        with pytest.raises(ValueError, match="PyTorch needs to be installed"):
            datasets.load_from_disk(str(out))
    torch_format_stand_in(monkeypatch)
    data, start = speculators_split(out, train_ratio=0.9, split="val")
    assert start > 0 and data.format["type"] == "torch"
    for index in range(len(data)):
        item = data[index]
        record = records[item["key"]]
        assert item["input_ids"].tolist() == record.input_ids
        assert item["loss_mask"].tolist() == record.loss_mask
    lengths = list(datasets.load_from_disk(str(out)).with_format(None)["seq_len"])
    assert sorted(lengths) == sorted(len(r.input_ids) for r in records.values())


def test_reexport_refuses_a_folder_holding_trainer_files_unless_replace(campaign, tmp_path, monkeypatch):
    """speculators caches hidden states as hidden_states/hs_{index}.safetensors (hs_connectors
    transfer.py:143 at c05b95b) and picks d2t.npy/t2d.npy up from --data-path
    (scripts/train.py:334-339): a re-export must not delete them silently."""
    torch_format_stand_in(monkeypatch)
    folder, _ = campaign
    out = tmp_path / "spec"
    export_records(folder, out, format="speculators", filters=ExportFilters(sample=30))
    export_records(folder, out, format="speculators", filters=ExportFilters(sample=25))  # only ours: replaced
    assert datasets.load_from_disk(str(out)).num_rows == 25
    build_vocab(folder, out, draft_vocab_size=16, target_vocab_size=TARGET_VOCAB)
    (out / "hidden_states").mkdir()
    (out / "hidden_states" / "hs_0.safetensors").write_bytes(b"cached")
    with pytest.raises(ValueError, match="row index") as refused:
        export_records(folder, out, format="speculators")
    assert "hidden_states/" in str(refused.value) and "d2t.npy" in str(refused.value)
    assert (out / "hidden_states" / "hs_0.safetensors").read_bytes() == b"cached"
    assert (out / "d2t.npy").exists() and (out / "vocab_mapping.json").exists()
    runner = CliRunner()
    bad = runner.invoke(app, ["export", str(folder), "--format", "speculators", "--out", str(out)])
    assert bad.exit_code == 2 and "--replace" in bad.output and "Traceback" not in bad.output
    ok = runner.invoke(app, ["export", str(folder), "--format", "speculators", "--out", str(out), "--replace"])
    assert ok.exit_code == 0, ok.output
    # What the ratio does and what to do with it, in words: pass it to speculators.
    assert "train with --train-data-ratio 0." in ok.output and "no row's samples" in ok.output
    assert not (out / "hidden_states").exists() and not (out / "d2t.npy").exists()
    assert datasets.load_from_disk(str(out)).num_rows == 120  # every record: 20 rows x 2 samples x 3 turns
    # An export with splits (train/, test/) is ours too, and replaced by the next one.
    split = ExportFilters(splits=(("test", 0.2),))
    export_records(folder, tmp_path / "splits", format="speculators", filters=split)
    again = export_records(folder, tmp_path / "splits", format="speculators", filters=split)
    assert sum(datasets.load_from_disk(str(p)).num_rows for p in again.paths) == 120
    (tmp_path / "splits" / "train" / "hidden_states").mkdir()
    with pytest.raises(ValueError, match="train/hidden_states/"):
        export_records(folder, tmp_path / "splits", format="speculators", filters=split)


def test_tail_split_keeps_each_input_row_on_one_side(campaign, tmp_path, monkeypatch):
    """speculators' validation split is the last (1 - train_data_ratio) of rows by index
    (train/data.py:171-181, train/dataloader.py:116-147 at c05b95b; default 0.9,
    train/config/schema.py:213). Rows come grouped by input row (every sample and turn of a
    conversation together), so any cut splits at most one row group and the reported ratio none."""
    torch_format_stand_in(monkeypatch)
    folder, records = campaign
    out = tmp_path / "spec"
    result = export_records(folder, out, format="speculators")
    rows = datasets.load_from_disk(str(out)).with_format(None)
    ids, samples, turns = rows["id"], rows["sample"], rows["turn"]
    assert len(_runs(ids)) == len(set(ids)) == 20  # each input row is one run of rows
    for index in range(1, len(ids)):  # inside a row: conversation by conversation, turns in order
        if ids[index] == ids[index - 1] and samples[index] == samples[index - 1]:
            assert turns[index] == turns[index - 1] + 1
    conversations = [(i, s) for i, s in zip(ids, samples, strict=True)]
    assert len(_runs(conversations)) == len(set(conversations)) == 40
    for cut in range(1, len(ids)):
        assert len(set(ids[:cut]) & set(ids[cut:])) <= 1
    ratio = result.train_data_ratio["all"]
    assert ratio is not None and abs(ratio - 0.9) < 0.05
    train, _ = speculators_split(out, train_ratio=ratio, split="train")
    val, _ = speculators_split(out, train_ratio=ratio, split="val")
    train_ids, val_ids = set(train.with_format(None)["id"]), set(val.with_format(None)["id"])
    assert train_ids and val_ids and not train_ids & val_ids
    assert len(train) + len(val) == len(records)
    summary = json.loads((out / "eagle-synth-export.json").read_text())
    assert summary["train_data_ratio"] == ratio and "row index" in summary["hidden_states"]
    # The held-out rows are not simply the last input rows read.
    assert sorted(val_ids) != sorted({r.id for r in list(records.values())[-len(val) :]})
    # The order does not depend on how many spill buckets the export used.
    monkeypatch.setattr(conversation_order, "BUCKET_BYTES", 2_000)
    assert conversation_order._bucket_count(folder) > 3
    spilled = [raw.key for raw in conversation_order.grouped_records(folder)]
    assert spilled == rows["key"] and len(spilled) == len(records)


def _runs(values: list) -> list:
    """The values in row order, one per run of equal consecutive values."""
    return [value for index, value in enumerate(values) if index == 0 or values[index - 1] != value]


# ----------------------------------------------------------------------------- SpecForge


def specforge_prompts(path: Path, *, max_length: int, min_loss_tokens: int = 1) -> list[dict]:
    """SpecForge's pre-tokenized reader (data/prompt_builder.py:56-83, 191-252, 294-333 at
    a6b6b02): pre-tokenized when the first record has both keys; each row clipped to max_length,
    dropped with fewer than min_loss_tokens mask-1 entries; kept as Python lists."""
    with open(path, encoding="utf-8") as stream:
        records = [json.loads(line) for line in stream if line.strip()]
    assert records and {"input_ids", "loss_mask"} <= set(records[0])
    prompts = []
    for record in records:
        input_ids, loss_mask = list(record["input_ids"])[:max_length], list(record["loss_mask"])[:max_length]
        assert len(input_ids) == len(loss_mask) and all(m in (0, 1) for m in loss_mask)
        if sum(loss_mask) >= min_loss_tokens:
            prompts.append({"payload": {"input_ids": input_ids, "loss_mask": loss_mask}})
    return prompts


def positions_trained_on_padding(input_ids: list[int], loss_mask: list[int]) -> list[int]:
    """SpecForge's EAGLE-3 TargetHead.preprocess (modeling/target/target_head.py:103-108 at
    a6b6b02): target and input_ids are shifted left and padded at the end, loss_mask is not
    shifted; a mask-1 position whose shifted target is the padding learns from zeros."""
    n = len(input_ids)
    shifted_real = [True] * (n - 1) + [False]  # padding(target, left=False): the last slot is padding
    return [p for p in range(n) if loss_mask[p] and not shifted_real[p]]


def test_zero_last_loss_keeps_specforge_off_its_zero_padded_target(campaign, tmp_path):
    """Upstream SpecForge #885 (fix open in #895): online EAGLE-3 rows stream with
    target_representation "hidden_state" and loss_mask passed through
    (algorithms/eagle3/providers.py:214-228 at a6b6b02), so the strategy runs
    TargetHead.preprocess on them (training/strategies/base.py:95-121), with no normalizer
    zeroing the last position (only the offline one does, algorithms/eagle3/data.py:10-20).
    Every row of ours ends on a generated, mask-1 token: without the option every row trains
    its last position on padding."""
    folder, records = campaign
    plain = tmp_path / "plain.jsonl"
    zeroed = tmp_path / "zeroed.jsonl"
    clip = ExportFilters(max_length=13)  # turn 1's prompts are 12 ids: one generated id left
    export_records(folder, plain, format="specforge", filters=clip)
    result = export_records(folder, zeroed, format="specforge", zero_last_loss=True, filters=clip)
    before = specforge_prompts(plain, max_length=4096)
    after = specforge_prompts(zeroed, max_length=4096)
    assert all(positions_trained_on_padding(**p["payload"]) for p in before)
    assert not any(positions_trained_on_padding(**p["payload"]) for p in after)
    # Rows left with a single generated id would have nothing to learn: left out, and counted.
    kept = [min(len(r.output_ids), 13 - len(r.prompt_ids)) for r in records.values()]
    single, empty = kept.count(1), sum(1 for k in kept if k <= 0)
    assert single and len(after) == result.rows == len(records) - single - empty == len(before) - single
    assert result.stats.dropped == {"few_loss_tokens": single + empty}
    assert result.loss_tokens == sum(sum(p["payload"]["loss_mask"]) for p in after)
    for p in after:
        mask = p["payload"]["loss_mask"]
        assert mask[-1] == 0 and mask[-2] == 1
    with pytest.raises(ValueError, match="--format specforge"):
        export_records(folder, tmp_path / "x.parquet", format="parquet", zero_last_loss=True)


def _documented_specforge_config() -> dict:
    text = DOCS.read_text()
    section = text[text.index("### Training with SpecForge") :]
    block = section[section.index("```yaml") + len("```yaml") : section.index("```", section.index("```yaml") + 7)]
    return yaml.safe_load(block)


# SpecForge's run-config schema as of a6b6b02 (config/schema.py), pinned: the fields each
# section accepts (every section is extra="forbid", :33-34) and the ones without a default.
SPECFORGE_SCHEMA = {
    "model": ({"target_model_path"}, None),  # :37-113; only target_model_path lacks a default
    "data": (
        set(),
        {
            "train_data_path",
            "prompts_path",
            "hidden_states_path",
            "eval_data_path",
            "eval_hidden_states_path",
            "max_length",
            "chat_template",
            "is_preformatted",
            "train_only_last_turn",
            "build_dataset_num_proc",
            "dataloader_num_workers",
            "cache_dir",
            "cache_key",
            "max_prompts",
        },
    ),  # :129-150
    "deployment": (set(), {"mode", "trainer", "disaggregated"}),  # :486-491
    "deployment.disaggregated": (
        {"control_dir", "backend"},
        {
            "control_dir",
            "consumer_state_dir",
            "inbox_server_url",
            "backend",
            "store_root",
            "store_id",
            "server_urls",
            "mooncake_metadata_server",
            "mooncake_master_server_addr",
            "mooncake_local_hostname",
            "mooncake_protocol",
            "mooncake_rdma_devices",
            "producer_segment_size",
            "client_buffer_size",
            "idle_timeout_s",
            "peer_wait_timeout_s",
            "producer_hold_s",
            "shutdown_grace_s",
            "managed_local",
        },
    ),  # :384-420
    "deployment.trainer": (set(), {"nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port"}),  # :242-251
}
SPECFORGE_TOP_LEVEL = {
    "model",
    "data",
    "training",
    "tracking",
    "profiling",
    "runtime",
    "deployment",
    "run_id",
    "output_dir",
}  # :674-683
SPECFORGE_REQUIRED_TOP_LEVEL = {"model", "data"}  # :675-676


def _section(config: dict, dotted: str) -> dict | None:
    node: object = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    assert isinstance(node, dict), dotted
    return node


def test_documented_specforge_config_validates_against_its_schema():
    """The example in docs/records.md meets SpecForge's schema at a6b6b02: required keys,
    no unknown keys, exactly one data source (:152-165), online runs disaggregated (:706-710)
    over mooncake (:764-773) with a capture server (SGLang, :51-54 and :711-715), and an
    EAGLE-3 disaggregated run names model.vocab_mapping_path (application/planning.py:172-186)."""
    config = _documented_specforge_config()
    assert SPECFORGE_REQUIRED_TOP_LEVEL <= set(config) <= SPECFORGE_TOP_LEVEL
    for dotted, (required, allowed) in SPECFORGE_SCHEMA.items():
        section = _section(config, dotted)
        if section is None:
            assert not required, dotted
            continue
        assert required <= set(section), (dotted, required - set(section))
        if allowed is not None:
            assert set(section) <= allowed, (dotted, set(section) - allowed)
    data = config["data"]
    assert sum(bool(data.get(k)) for k in ("train_data_path", "prompts_path", "hidden_states_path")) == 1
    assert data["prompts_path"]  # online, pre-tokenized: our export
    assert config["deployment"]["mode"] == "disaggregated"
    disaggregated = config["deployment"]["disaggregated"]
    assert disaggregated["backend"] == "mooncake" and disaggregated["control_dir"]
    assert disaggregated.get("server_urls") or disaggregated.get("managed_local")
    assert config["model"].get("target_backend", "sglang") == "sglang"
    assert config.get("training", {}).get("role", "auto") != "all"
    assert config.get("training", {}).get("strategy", "eagle3") == "eagle3" and config["model"]["vocab_mapping_path"]
    section = DOCS.read_text()[DOCS.read_text().index("### Training with SpecForge") :]
    assert "must be SGLang" in section[: section.index("### Training with speculators")]


def test_specforge_holds_about_44_bytes_per_token(tmp_path):
    """SpecForge keeps every pre-tokenized row as Python lists (data/prompt_builder.py:199-216,
    247-252 at a6b6b02). Measured here on ids spread over a 248k vocabulary, as in real rows;
    --shard-tokens bounds the ids, so the memory, of one run over each file."""
    rng = random.Random(3)
    records = []
    for n in range(200):
        prompt = [rng.randrange(1000, 248_000) for _ in range(rng.randrange(50, 400))]
        output = [rng.randrange(1000, 248_000) for _ in range(rng.randrange(20, 300))]
        records.append(plain_record(f"{n:032x}", f"r{n}", prompt, output))
    folder = tmp_path / "camp"
    write_record_file(folder, campaign="c", batch="aa", records=records)
    out = tmp_path / "p.jsonl"
    result = export_records(folder, out, format="specforge")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    prompts = specforge_prompts(out, max_length=1 << 20)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_token = held / result.tokens
    assert 40 <= per_token <= 48 and SPECFORGE_BYTES_PER_TOKEN == 44, per_token
    assert len(prompts) == 200
    budget = 20_000
    sharded = export_records(folder, tmp_path / "s.jsonl", format="specforge", shard_tokens=budget)
    sizes = [sum(len(json.loads(line)["input_ids"]) for line in p.read_text().splitlines()) for p in sharded.paths]
    assert len(sizes) > 3 and max(sizes) <= budget and sum(sizes) == result.tokens
    assert sharded.largest_file_tokens == max(sizes)
    assert sharded.to_dict()["specforge_memory_bytes"] == max(sizes) * SPECFORGE_BYTES_PER_TOKEN


# ----------------------------------------------------------------------------- vocabulary


def specforge_vocab_size(config: dict) -> int:
    """modeling/target/target_utils.py:66-74 at a6b6b02 (a raw-JSON config, as its shim, :59-61)."""
    text = config.get("text_config", config)
    return int(text.get("padded_vocab_size") or text["vocab_size"])


def speculators_vocab_size(config: dict) -> int:
    """train/vocab_mapping.py:116-125 and models/utils.py:24-30 at c05b95b."""
    return config.get("text_config", config)["vocab_size"]


@pytest.mark.parametrize(
    "config",
    [
        {"vocab_size": TARGET_VOCAB},
        {"vocab_size": 248_077, "text_config": {"vocab_size": TARGET_VOCAB}},  # top-level was read first before #24
        {"text_config": {"vocab_size": TARGET_VOCAB, "padded_vocab_size": TARGET_VOCAB}},
        {"vocab_size": TARGET_VOCAB, "padded_vocab_size": 248_384},  # the trainers disagree: refused
    ],
)
def test_target_vocab_size_is_read_as_the_trainers_read_it(campaign, tmp_path, config):
    folder, _ = campaign
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    write_manifest(folder, {"settings": {"tokenizer_path": str(model)}})
    expected = {specforge_vocab_size(config), speculators_vocab_size(config)}
    if len(expected) > 1:
        with pytest.raises(
            VocabError, match="SpecForge reads padded_vocab_size = 248384; speculators reads vocab_size = 248320"
        ):
            target_vocab_size_of(folder)
        result = build_vocab(folder, tmp_path / "v", draft_vocab_size=8, target_vocab_size=248_384)
        assert result.target_vocab_size_source == "--target-vocab-size"
        return
    read = target_vocab_size_of(folder)
    assert {read.size} == expected and "config.json" in read.source
    assert ("text_config.vocab_size" if "text_config" in config else " vocab_size") in read.source
    result = build_vocab(folder, tmp_path / "v", draft_vocab_size=8)
    assert result.mapping.t2d.shape == (read.size,) and result.target_vocab_size_source == read.source


def test_cli_vocab_names_the_size_it_read_and_refuses_when_the_trainers_disagree(campaign, tmp_path):
    folder, _ = campaign
    model = tmp_path / "model"
    model.mkdir()
    write_manifest(folder, {"settings": {"tokenizer_path": str(model)}})
    runner = CliRunner()
    args = ["vocab", str(folder), "--draft-vocab-size", "8", "--out", str(tmp_path / "v")]
    (model / "config.json").write_text(json.dumps({"text_config": {"vocab_size": TARGET_VOCAB}}))
    ok = runner.invoke(app, [*args, "--json"])
    assert ok.exit_code == 0, ok.output
    summary = json.loads(ok.stdout)
    assert summary["target_vocab_size"] == TARGET_VOCAB
    assert summary["target_vocab_size_source"].endswith("config.json text_config.vocab_size")
    (model / "config.json").write_text(json.dumps({"vocab_size": TARGET_VOCAB, "padded_vocab_size": 248_384}))
    bad = runner.invoke(app, args)
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert bad.output.startswith("error: ") and "--target-vocab-size" in bad.output


class _TorchStandIn(types.ModuleType):
    """Records what torch.save is given; from_numpy passes arrays through."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.saved: dict[str, object] = {}

    def from_numpy(self, array):
        return array

    def save(self, obj, path):
        self.saved[path] = obj


def _run_commands(commands: list[str], monkeypatch) -> dict[str, object]:
    stand_in = _TorchStandIn()
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "torch", stand_in)
        for command in commands:
            argv = shlex.split(command)
            assert argv[:2] == ["python", "-c"] and len(argv) == 3
            exec(compile(argv[2], "<command>", "exec"), {})  # noqa: S102 - the command we print, on a stand-in torch
    return stand_in.saved


@pytest.mark.skipif(torch_module() is not None, reason="the commands are printed only where torch is missing")
def test_without_torch_the_commands_that_make_the_pt_files_are_printed(campaign, tmp_path, monkeypatch):
    """SpecForge loads model.vocab_mapping_path with torch.load and copies ["t2d"], ["d2t"]
    into its buffers (modeling/draft/base.py:193-206 at a6b6b02); speculators loads
    token_freq.pt as {id: count} (scripts/train.py:341-345 at c05b95b). Run on a stand-in torch,
    the printed commands save exactly those objects, from the files written, to absolute paths."""
    folder, records = campaign
    out = tmp_path / "vocab"
    runner = CliRunner()
    ran = runner.invoke(
        app,
        ["vocab", str(folder), "--draft-vocab-size", "16", "--target-vocab-size", str(TARGET_VOCAB), "--out", str(out)],
    )
    assert ran.exit_code == 0, ran.output
    result = build_vocab(folder, out, draft_vocab_size=16, target_vocab_size=TARGET_VOCAB)
    assert all(command in ran.stderr for command in result.commands)
    saved = _run_commands(result.commands, monkeypatch)
    d2t, t2d = np.load(out / "d2t.npy"), np.load(out / "t2d.npy")
    mapping = saved[str((out / "vocab_mapping.pt").resolve())]
    assert isinstance(mapping, dict) and set(mapping) == {"d2t", "t2d"}
    assert np.array_equal(mapping["d2t"], d2t) and np.array_equal(mapping["t2d"], t2d)
    freq = saved[str((out / "token_freq.pt").resolve())]
    assert freq == {int(k): v for k, v in json.loads((out / "token_freq.json").read_text()).items()}
    assert all(isinstance(k, int) for k in freq)  # type: ignore[union-attr]
    spec_out = tmp_path / "spec"
    exported = export_records(folder, spec_out, format="speculators")
    assert exported.commands and str(spec_out.resolve()) in exported.commands[0]
    saved = _run_commands(exported.commands, monkeypatch)
    assert list(saved) == [str((spec_out / "token_freq.pt").resolve())]


def test_modelopt_d2t_file_is_the_int64_offsets_tensor(campaign, tmp_path, monkeypatch):
    """ModelOpt's load_draft_vocab_cache (modelopt/torch/speculative/plugins/hf_eagle.py:318-338
    at a2fbac7) torch.loads data.draft_vocab_cache and needs one int64 tensor shaped like its d2t
    buffer [draft_vocab_size] (modeling_eagle.py:51); a draft token maps back as
    `draft + d2t[draft]` (hf_eagle.py:938, examples/speculative_decoding/README.md:308)."""
    folder, _ = campaign
    out = tmp_path / "vocab"
    result = build_vocab(folder, out, draft_vocab_size=16, target_vocab_size=TARGET_VOCAB)
    torch = torch_module()
    if torch is None:
        saved = _run_commands(result.commands, monkeypatch)
        d2t = np.asarray(saved[str((out / "d2t.pt").resolve())])
    else:
        loaded = torch.load(out / "d2t.pt", weights_only=True)
        assert loaded.dtype == torch.int64
        d2t = loaded.numpy()
    assert d2t.dtype == np.int64 and d2t.shape == (16,)
    kept = np.flatnonzero(np.load(out / "t2d.npy"))
    assert (np.arange(16) + d2t).tolist() == kept.tolist()


# ----------------------------------------------------------------------------- file modes


def test_written_files_honour_the_umask(campaign, tmp_path, monkeypatch):
    """A trainer running as another user must be able to read what we write: records,
    manifest, exports and vocab files get 0666 minus the umask, as open() gives, not mkstemp's 0600."""
    torch_format_stand_in(monkeypatch)
    folder, _ = campaign
    for umask, expected in ((0o022, 0o644), (0o027, 0o640)):
        previous = os.umask(umask)
        try:
            root = tmp_path / f"u{umask:o}"
            three = conversation_records(1)
            write_record_file(root / "camp", campaign="c", batch="bb", records=three[:1])
            write_record_file(root / "camp", campaign="c", batch="cc", records=three[1:2])
            shard = compact(root / "camp", min_age=0).shards[0]  # ShardWriter's file
            record = write_record_file(root / "camp", campaign="c", batch="dd", records=three[2:3])
            manifest = write_manifest(root / "camp", {"campaign": "c"})
            files = [record, manifest, shard]
            for fmt, name in (("jsonl", "r.jsonl"), ("parquet", "r.parquet"), ("specforge", "p.jsonl")):
                files += export_records(folder, root / name, format=fmt).paths
            export_records(folder, root / "spec", format="speculators")
            files += [p for p in (root / "spec").iterdir() if p.is_file()]
            files += build_vocab(folder, root / "vocab", draft_vocab_size=8, target_vocab_size=TARGET_VOCAB).paths
        finally:
            os.umask(previous)
        modes = {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in files}
        assert len(modes) >= 14 and set(modes.values()) == {expected}, modes
