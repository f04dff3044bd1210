"""CLI edges: one line naming the problem (flag, file, credentials), never a traceback, and
no campaign registered by an input that holds nothing to enqueue."""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from eagle_synth.settings import broker_settings
from eagle_synth.state.campaign import CampaignSettings
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import RedisServer, free_port
from producer.enqueue import DEFAULT_MAX_PROMPT_TOKENS, resolve_max_prompt_tokens
from tests.conftest import chat_rows, write_jsonl
from tests.helpers import campaign, cli, queued_items


def one_line_error(result) -> str:
    err = result.stderr.decode()
    assert result.returncode == 2, (result.returncode, err, result.stdout.decode())
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_worker_with_wrong_credentials_or_no_redis_exits_at_once(tmp_path):
    server = RedisServer(workdir=tmp_path / "redis", password="right").start()
    try:
        wrong = server.url.replace(":right@", ":wrong@")
        for url, expected in (
            (wrong, "Redis refused the credentials"),
            (server.url.replace(":right@", ""), "Redis refused the credentials"),
            (f"redis://127.0.0.1:{free_port()}/0", "cannot reach Redis"),
        ):
            started = time.monotonic()
            err = one_line_error(
                cli(
                    "worker",
                    "--server",
                    "http://127.0.0.1:9",
                    "--out",
                    str(tmp_path / "out"),
                    "--redis",
                    url,
                    check=False,
                    timeout=90,
                )
            )
            assert expected in err and "right" not in err
            assert time.monotonic() - started < 60
    finally:
        server.stop()


def test_empty_or_missing_input_registers_no_campaign(tmp_path, redis_server, tokenizer_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    common = ["--tokenizer", str(tokenizer_path), "--redis", redis_server.url]
    result = cli("enqueue", str(empty), "--campaign", "empty", *common)
    assert "rows read 0" in result.stdout.decode()
    err = one_line_error(cli("enqueue", str(tmp_path / "nope.jsonl"), "--campaign", "missing", *common, check=False))
    assert "nope.jsonl" in err
    # A missing file among good ones stops the run before anything is registered or queued.
    good = write_jsonl(tmp_path / "good.jsonl", chat_rows(2))
    one_line_error(cli("enqueue", str(good), str(tmp_path / "nope.jsonl"), "--campaign", "mixed", *common, check=False))
    assert connect(broker_settings(redis_url=redis_server.url)).keys("*") == []


def test_huge_rows_are_skipped_before_templating(tmp_path, redis_server, tokenizer_path):
    rows = chat_rows(3) + [
        {"id": "huge", "messages": [{"role": "user", "content": "x" * 2_000_000}]},
        {"id": "long", "messages": [{"role": "user", "content": "word " * 300}]},
    ]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    started = time.monotonic()
    result = cli(
        "enqueue",
        str(path),
        "--campaign",
        "caps",
        "--tokenizer",
        str(tokenizer_path),
        "--max-prompt-tokens",
        "200",
        "--redis",
        redis_server.url,
        "--json",
    )
    summary = json.loads(result.stdout)
    assert summary["skipped_by_reason"] == {"prompt-too-long": 2}
    assert any(
        "characters > --max-prompt-chars 1000000 (checked before templating)" in e
        for e in summary["examples"]["prompt-too-long"]
    )
    assert any("tokens > --max-prompt-tokens 200" in e for e in summary["examples"]["prompt-too-long"])
    assert summary["rows_enqueued"] == 3 and summary["prompts_skipped"] == 2
    assert time.monotonic() - started < 60
    c = campaign(redis_server.url, "caps")
    assert c.skipped() == {"prompt-too-long": 2} and len(queued_items(redis_server.url)) == 3
    assert c.settings().max_prompt_tokens == 200


def test_default_prompt_token_cap_follows_the_campaign(tmp_path, redis_server, tokenizer_path):
    stored = CampaignSettings(name="old", tokenizer_path="t", tokenizer_fingerprint="f", chat_template_hash="h")
    assert resolve_max_prompt_tokens(None, None) == DEFAULT_MAX_PROMPT_TOKENS
    assert resolve_max_prompt_tokens(None, stored) is None  # a campaign made before the default
    assert resolve_max_prompt_tokens(0, None) is None and resolve_max_prompt_tokens(50, stored) == 50
    path = write_jsonl(tmp_path / "rows.jsonl", chat_rows(2))
    cli("enqueue", str(path), "--campaign", "capped", "--tokenizer", str(tokenizer_path), "--redis", redis_server.url)
    assert campaign(redis_server.url, "capped").settings().max_prompt_tokens == DEFAULT_MAX_PROMPT_TOKENS
    # Rerunning the same command is not a settings change, nor for a campaign stored without a
    # cap (as campaigns made before the default were).
    c = campaign(redis_server.url, "capped")
    c.client.set(c.keys.settings, msgspec.structs.replace(c.settings(), max_prompt_tokens=None).to_json())
    rerun = cli(
        "enqueue", str(path), "--campaign", "capped", "--tokenizer", str(tokenizer_path), "--redis", redis_server.url
    )
    assert "duplicate 2" in rerun.stdout.decode()
    assert c.settings().max_prompt_tokens is None


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--campaign", "bad/name"], "--campaign"),
        (["--campaign", "ok", "--stop-token-ids", "abc"], "--stop-token-ids: 'abc' is not a token id"),
        (["--campaign", "ok", "--max-prompt-chars", "-1"], "--max-prompt-chars"),
    ],
)
def test_bad_flags_name_themselves(tmp_path, tokenizer_path, flags, expected):
    path = write_jsonl(tmp_path / "rows.jsonl", chat_rows(1))
    err = one_line_error(
        cli("enqueue", str(path), "--tokenizer", str(tokenizer_path), "--dry-run", *flags, check=False)
    )
    assert expected in err


def test_bad_tokenizer_path_is_said_in_our_words(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", chat_rows(1))
    not_a_tokenizer = tmp_path / "weights"
    not_a_tokenizer.mkdir()
    (not_a_tokenizer / "model.safetensors").write_bytes(b"\0")
    for tokenizer, expected in (
        (tmp_path / "nowhere", "no such folder"),
        (not_a_tokenizer, "this folder holds no tokenizer"),
        (path, "is a file"),
    ):
        err = one_line_error(
            cli("enqueue", str(path), "--campaign", "tok", "--tokenizer", str(tokenizer), "--dry-run", check=False)
        )
        assert f"--tokenizer {tokenizer}: {expected}" in err


def test_library_errors_end_in_one_line_from_the_app(tmp_path, redis_server):
    """UserErrors raised below the CLI are printed once, by the app: no per-command translation."""
    redis = ["--redis", redis_server.url]
    for args, expected in (
        (["status", "nope", *redis], "error: no campaign named 'nope' in this Redis"),
        (["failed", "bad/name", *redis], "error: campaign name 'bad/name' is not usable"),
        (["compact", str(tmp_path / "nowhere")], "is " + str(tmp_path / "nowhere") + " a campaign folder"),
        (
            ["export", str(tmp_path), "--out", str(tmp_path / "x.jsonl"), "--format", "csv"],
            "--format 'csv': use one of",
        ),
        # The worker names its flags where the library names the setting.
        (
            ["worker", "--server", "http://127.0.0.1:9", "--out", str(tmp_path / "out"), "--max-attempts", "0", *redis],
            "error: --max-attempts 0: must be at least 1",
        ),
    ):
        assert expected in one_line_error(cli(*args, check=False, timeout=90)), args
    # A password in a server URL would be copied into records, logs and Redis: refused, and not echoed.
    refused = cli(
        "worker", "--server", "http://ops:hunter2@127.0.0.1:9", "--out", str(tmp_path / "out"), *redis, check=False
    )
    assert "http://ops:***@127.0.0.1:9: a password in a server URL" in one_line_error(refused)
    assert b"hunter2" not in refused.stdout + refused.stderr
