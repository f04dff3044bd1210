"""verify and inspect on records made of real Qwen3.5 ids: hard errors, warnings, the
stripped-reasoning signature, settings from the manifest, and the inspector's view."""

from __future__ import annotations

import dataclasses
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from eagle_synth.cli.commands import app
from eagle_synth.errors import InspectError
from eagle_synth.records import Record, write_manifest, write_record_file
from eagle_synth.tools.inspect import SPECIAL_STYLE, find_records, render_ids, render_record
from eagle_synth.tools.verify import CHECKS, verify_campaign


@pytest.fixture(scope="module")
def ids(tokenizer):
    """Real ids: a templated prompt ending in `<think>\\n`, reasoning, `</think>`, an answer, EOS."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    think_open, think_close = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    assert prompt[-2:] == [think_open] + encode("\n")  # the Qwen3.5 template opens the think block
    reasoning, answer = encode("Two plus two makes four."), encode("\n\n2 + 2 = 4.")
    return {
        "prompt": list(prompt),
        "reasoning": reasoning,
        "answer": answer,
        "close": think_close,
        "eos": tokenizer.eos_token_id,
        "vocab": len(tokenizer),
    }


def rec(ids, key: str, *, output=None, **extra) -> Record:
    output = output if output is not None else ids["reasoning"] + [ids["close"]] + ids["answer"] + [ids["eos"]]
    values = dict(
        key=key,
        id=key,
        sample=0,
        turn=0,
        prompt_ids=ids["prompt"],
        output_ids=output,
        finish_reason="stop",
        finish_matched=ids["eos"],
        prompt_tokens=len(ids["prompt"]),
        completion_tokens=len(output),
    )
    values.update(extra)
    return Record(**values)


def clean_campaign(tmp_path, ids, n: int = 6):
    folder = tmp_path / "camp"
    write_record_file(folder, campaign="camp", batch="aa", records=[rec(ids, f"{i:02d}aa") for i in range(n)])
    return folder


def test_a_clean_campaign_passes_with_its_figures(tmp_path, ids, tokenizer):
    folder = clean_campaign(tmp_path, ids)
    write_record_file(
        folder,
        campaign="camp",
        batch="bb",
        records=[
            rec(ids, "99bb", output=ids["reasoning"][:3], finish_reason="length", finish_matched=None, backend="vllm")
        ],
    )
    report = verify_campaign(folder, tokenizer=tokenizer)
    assert report["ok"] and report["errors"] == 0 and report["warnings"] == 0
    assert report["records"] == 7 and report["finish_reasons"] == {"length": 1, "stop": 6}
    assert report["backends"] == {"sglang": 6, "vllm": 1}
    assert report["truncated_share"] == pytest.approx(1 / 7, abs=1e-5)
    assert report["reasoning"]["prompts_open_think"] == 7 and report["reasoning"]["closed_in_output"] == 6
    assert report["settings"]["vocab_size"] == ids["vocab"] and report["settings"]["eos_token_ids"] == [ids["eos"]]
    assert set(report) == {
        "campaign",
        "ok",
        "errors",
        "warnings",
        "format_version",
        "files",
        "records",
        "tokens",
        "finish_reasons",
        "backends",
        "truncated_share",
        "reasoning",
        "conversations",
        "settings",
        "checks",
        "damaged",
    }
    assert list(report["checks"]) == list(CHECKS)


def test_hard_errors_are_counted_with_examples(tmp_path, ids, tokenizer):
    folder = clean_campaign(tmp_path, ids, n=2)
    write_record_file(
        folder,
        campaign="camp",
        batch="bb",
        records=[
            rec(ids, "00aa"),  # the key of batch aa again
            # A prompt id beyond the tokenizer (an output id there may be a padded vocabulary's:
            # with no model vocab_size known it is legal, as for the worker; test_real_vllm.py).
            rec(ids, "oov", prompt_ids=[*ids["prompt"], ids["vocab"] + 5], prompt_tokens=len(ids["prompt"]) + 1),
            rec(ids, "count", completion_tokens=99),  # disagrees with the output
        ],
    )
    bad = write_record_file(folder, campaign="camp", batch="cc", records=[rec(ids, "lost")])
    bad.write_bytes(bad.read_bytes()[:-12])
    report = verify_campaign(folder, tokenizer=tokenizer)
    checks = report["checks"]
    assert not report["ok"] and report["errors"] == 4
    assert checks["duplicate_key"]["count"] == 1 and checks["duplicate_key"]["examples"][0].startswith("00aa (")
    assert checks["id_out_of_vocab"]["examples"] == ["oov"]
    assert checks["completion_tokens_mismatch"]["examples"] == ["count"]
    assert checks["damaged_file"]["examples"] == [bad.name] and report["damaged"][0]["file"] == bad.name


def test_a_file_compacted_away_between_the_two_passes_is_skipped(tmp_path, ids, tokenizer, monkeypatch):
    """The duplicate pass rereads files; one that compact removed since the first pass is skipped."""
    import eagle_synth.tools.verify as verify

    folder = clean_campaign(tmp_path, ids, n=2)
    again = write_record_file(folder, campaign="camp", batch="bb", records=[rec(ids, "00aa")])
    reads: dict = {}
    real_read = verify.read_raw_file

    def read_then_vanish(path):
        reads[path] = reads.get(path, 0) + 1
        if path == again and reads[path] == 2:
            path.unlink()  # compact published a shard and removed this batch file
        return real_read(path)

    monkeypatch.setattr(verify, "read_raw_file", read_then_vanish)
    report = verify_campaign(folder, tokenizer=tokenizer)
    assert reads[again] == 2 and not again.exists()
    assert report["checks"]["duplicate_key"]["count"] == 0  # one copy is left


def test_warnings_stop_without_eos_empty_output_and_a_stop_string(tmp_path, ids, tokenizer):
    folder = tmp_path / "camp"
    write_record_file(
        folder,
        campaign="camp",
        batch="aa",
        records=[
            rec(ids, "noeos", output=ids["reasoning"] + [ids["close"]] + ids["answer"]),
            rec(ids, "empty", output=[], finish_reason="length", finish_matched=None),
            rec(ids, "string", output=ids["reasoning"] + [ids["close"]] + ids["answer"], finish_matched="\n\n"),
            rec(ids, "custom", output=ids["reasoning"] + [ids["close"], 1234], sampling={"stop_token_ids": [1234]}),
        ],
    )
    report = verify_campaign(folder, tokenizer=tokenizer)
    assert report["ok"] and report["warnings"] == 2
    assert report["checks"]["stop_without_eos"]["examples"] == ["noeos"]
    assert report["checks"]["empty_output"]["examples"] == ["empty"]


def test_stripped_reasoning_is_flagged_and_strict_fails_on_it(tmp_path, ids, tokenizer_path):
    folder = tmp_path / "camp"
    stripped = ids["answer"] + [ids["eos"]]  # what text rebuilt from a reasoning parser's content gives
    write_record_file(
        folder, campaign="camp", batch="aa", records=[rec(ids, f"s{i}", output=stripped) for i in range(4)]
    )
    runner = CliRunner()
    result = runner.invoke(app, ["verify", str(folder), "--tokenizer", str(tokenizer_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["checks"]["stripped_reasoning"]["count"] == 4
    assert report["reasoning"]["prompts_open_think"] == 4 and report["reasoning"]["closed_share"] == 0
    strict = runner.invoke(app, ["verify", str(folder), "--tokenizer", str(tokenizer_path), "--strict"])
    assert strict.exit_code == 1 and "stripped_reasoning" in strict.output


def test_manifest_settings_suffice_and_a_foreign_tokenizer_is_noticed(tmp_path, ids, tokenizer):
    folder = clean_campaign(tmp_path, ids, n=2)
    write_record_file(folder, campaign="camp", batch="bb", records=[rec(ids, "big", output=[5000, ids["eos"]])])
    runner = CliRunner()
    missing = runner.invoke(app, ["verify", str(folder)])
    assert missing.exit_code == 2 and "--tokenizer" in missing.output
    write_manifest(
        folder,
        {
            "format_version": 2,
            "settings": {
                "vocab_size": 4000,
                "eos_token_ids": [ids["eos"]],
                "think_open_id": None,
                "think_close_id": None,
                "tokenizer_fingerprint": "0000000000000000",
                "tokenizer_path": "/elsewhere",
                "sampling": {"stop_token_ids": []},
            },
        },
    )
    from_manifest = runner.invoke(app, ["verify", str(folder), "--json"])
    report = json.loads(from_manifest.stdout)
    assert from_manifest.exit_code == 1 and report["settings"]["from"] == "manifest"
    assert report["checks"]["id_out_of_vocab"]["count"] == 3  # every record has ids >= 4000
    report = verify_campaign(folder, tokenizer=tokenizer)
    assert report["ok"] and report["checks"]["tokenizer_mismatch"]["count"] == 1


def test_render_highlights_specials_and_marks_the_boundary(ids, tokenizer):
    text = render_ids(tokenizer, ids["prompt"])
    highlighted = {text.plain[span.start : span.end] for span in text.spans if span.style == SPECIAL_STYLE}
    assert {"<|im_start|>", "<|im_end|>", "<think>"} <= highlighted
    assert "What is 2 + 2?" in text.plain
    console = Console(record=True, width=100, force_terminal=False)
    render_record(
        dataclasses.replace(rec(ids, "abc123"), e2e_latency=0.19233732499998268), tokenizer=tokenizer, console=console
    )
    shown = console.export_text()
    assert "latency 0.192 s" in shown  # not 0.19233732499998268
    prompt_at, boundary_at, output_at = shown.index("[prompt]"), shown.index("output begins"), shown.index("[output]")
    assert prompt_at < boundary_at < output_at
    assert "Two plus two makes four.</think>" in shown[output_at:]
    assert f"{ids['prompt'][-1]}  ┃ output starts ┃  {ids['reasoning'][0]}" in shown
    assert "finish stop" in shown and f"output {len(rec(ids, 'x').output_ids)}" in shown


def test_find_by_prefix_or_at_random(tmp_path, ids):
    folder = tmp_path / "camp"
    write_record_file(folder, campaign="camp", batch="aa", records=[rec(ids, k) for k in ("abc1", "abd2", "xyz3")])
    assert [r.key for r in find_records(folder, key="abc")] == ["abc1"]
    with pytest.raises(InspectError, match="2 record keys start with 'ab'"):
        find_records(folder, key="ab")
    with pytest.raises(InspectError, match="no record key starts with 'q'"):
        find_records(folder, key="q")
    drawn = find_records(folder, random_n=2, seed=1)
    assert len({r.key for r in drawn}) == 2
    assert [r.key for r in find_records(folder, random_n=2, seed=1)] == [r.key for r in drawn]


def test_cli_inspect_shows_a_record(tmp_path, ids, tokenizer_path):
    folder = clean_campaign(tmp_path, ids, n=2)
    result = CliRunner().invoke(app, ["inspect", str(folder), "01", "--tokenizer", str(tokenizer_path)])
    assert result.exit_code == 0, result.output
    assert "record 01aa" in result.output and "[output]" in result.output and "<think>" in result.output
    ambiguous = CliRunner().invoke(app, ["inspect", str(folder), "0", "--tokenizer", str(tokenizer_path)])
    assert ambiguous.exit_code == 2 and "give more characters" in ambiguous.output


@pytest.mark.parametrize("command", ["export", "vocab"])
def test_export_and_vocab_stop_on_a_damaged_file_saying_what_to_do(tmp_path, ids, command):
    folder = clean_campaign(tmp_path, ids, n=2)
    bad = write_record_file(folder, campaign="camp", batch="cc", records=[rec(ids, "lost")])
    bad.write_bytes(bad.read_bytes()[:-12])
    flags = {
        "export": ["--out", str(tmp_path / "rows.jsonl")],
        "vocab": ["--out", str(tmp_path / "v"), "--draft-vocab-size", "8", "--target-vocab-size", str(ids["vocab"])],
    }[command]
    result = CliRunner().invoke(app, [command, str(folder), *flags])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert bad.name in said and "to list damaged files" in said
