"""Tokenizer code from the model folder, on explicit trust: which files a campaign records, how a
worker's folder is checked against them (files only, before any code runs), the chat encoder's
arguments, and the one-line refusals."""

from __future__ import annotations

import shutil

import pytest

from eagle_synth.encoders import find_encoder
from eagle_synth.errors import EncoderError, TemplateError, TokenizerFolderError, UserError
from eagle_synth.templating import load_tokenizer, render_prompt_ids
from eagle_synth.tokenizer_files import covered_files, folder_problem, matching_folder
from producer.options import EnqueueOptions
from tests.deepseek_v4 import deepseek_v4_folder
from tests.helpers import cli
from tests.kimi_fixture import write_kimi_fixture


@pytest.fixture(scope="module")
def kimi_path(tmp_path_factory):
    return write_kimi_fixture(tmp_path_factory.mktemp("kimi") / "Kimi-K2.5")


@pytest.fixture(scope="module")
def dsv4(tmp_path_factory):
    return load_tokenizer(deepseek_v4_folder(), trust_remote_code=True)


def test_a_campaign_records_the_folders_code_and_tokenizer_files(kimi_path):
    files = covered_files(kimi_path)
    assert sorted(files) == [
        "chat_template.jinja",
        "tiktoken.model",
        "tokenization_kimi_fixture.py",
        "tokenizer_config.json",
    ]
    assert all(len(digest) == 16 for digest in files.values())


def test_a_workers_folder_must_hold_exactly_the_campaigns_files(kimi_path, tmp_path):
    expected = covered_files(kimi_path)
    assert folder_problem(kimi_path, expected) is None
    missing = shutil.copytree(kimi_path, tmp_path / "missing")
    (missing / "tiktoken.model").unlink()
    assert folder_problem(missing, expected) == f"{missing} has no tiktoken.model"
    extra = shutil.copytree(kimi_path, tmp_path / "extra")
    (extra / "sitecustomize.py").write_text("raise SystemExit\n")
    assert (
        folder_problem(extra, expected)
        == f"{extra} has sitecustomize.py, which the campaign's tokenizer folder had not"
    )
    edited = shutil.copytree(kimi_path, tmp_path / "edited")
    (edited / "chat_template.jinja").write_text("{{ messages }}")
    assert "edited/chat_template.jinja differs from the campaign's" in folder_problem(edited, expected)
    # The first matching folder of several is used; none matching names every folder's problem.
    assert matching_folder([edited, kimi_path], expected, campaign="c") == kimi_path
    with pytest.raises(TokenizerFolderError) as refused:
        matching_folder([missing, edited], expected, campaign="c")
    assert "has no tiktoken.model" in str(refused.value) and "chat_template.jinja differs" in str(refused.value)
    with pytest.raises(TokenizerFolderError, match="start the worker with --tokenizer DIR"):
        matching_folder([], expected, campaign="c")


def test_the_encoder_takes_the_thinking_modes_and_reasoning_effort(dsv4):
    encoder = dsv4.encoder
    messages = [{"role": "user", "content": "Plan a trip."}]
    for kwargs, options in [
        ({}, {"thinking_mode": "chat"}),
        ({"enable_thinking": True}, {"thinking_mode": "thinking"}),
        ({"thinking": True, "reasoning_effort": "max"}, {"thinking_mode": "thinking", "reasoning_effort": "max"}),
    ]:
        text = encoder.encode_messages(messages, drop_thinking=True, **options)
        assert render_prompt_ids(dsv4, messages, template_kwargs=kwargs) == dsv4.encode(text, add_special_tokens=False)
    assert "Reasoning Effort: Absolute maximum" in dsv4.apply_chat_template(
        messages, tokenize=False, thinking=True, reasoning_effort="max"
    )
    batched = dsv4.apply_chat_template([messages, messages], tokenize=True, return_dict=True)
    assert batched["input_ids"][0] == batched["input_ids"][1] == render_prompt_ids(dsv4, messages)
    with pytest.raises(TemplateError, match=r"takes no chat_template_kwargs \['enable_thinkin'\]"):
        render_prompt_ids(dsv4, messages, template_kwargs={"enable_thinkin": True})


def test_a_folder_with_two_encoders_is_refused(tmp_path):
    for name in ("encoding_dsv32.py", "encoding_dsv4.py"):
        (tmp_path / name).write_text("def encode_messages(messages, thinking_mode): return ''\n")
    with pytest.raises(EncoderError, match="several chat encoders"):
        find_encoder(tmp_path)
    assert find_encoder(tmp_path / "nowhere") is None


def test_history_own_with_remote_code_needs_a_local_folder():
    with pytest.raises(UserError, match="needs --tokenizer to be a local folder"):
        EnqueueOptions(
            inputs=["x.jsonl"], campaign="c", tokenizer="moonshotai/Kimi-K2.5", trust_remote_code=True, history="own"
        )


def test_worker_refuses_a_tokenizer_folder_that_does_not_exist(tmp_path, redis_server):
    done = cli(
        *("worker", "--server", "http://127.0.0.1:9", "--out", str(tmp_path / "out")),
        *("--tokenizer", str(tmp_path / "nowhere"), "--redis", redis_server.url),
        check=False,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 2 and "--tokenizer" in stderr and "no such folder" in stderr, stderr
    assert "Traceback" not in stderr
