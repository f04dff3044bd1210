"""What a new user trips on (issue 25), tried as a user would: `eagle-synth ...` in a process,
on a real redis-server, devserver and worker where the command needs them.

Every problem a user can fix ends in one `error: ...` line and exit 2; a figure means one thing;
a hint is runnable as printed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle_synth.payload import PromptItem
from eagle_synth.records import MANIFEST_NAME, write_manifest
from eagle_synth.settings import broker_settings
from eagle_synth.state.campaign import Campaign, CampaignSettings
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import free_port, wait_for
from producer.enqueue import ROWS_PER_CHUNK
from tests.conftest import chat_rows, write_jsonl
from tests.export_helpers import conversation_records, write_campaign
from tests.helpers import assert_exactly_once, campaign, cli, queued, queued_items, wait_finished

REPO = Path(__file__).resolve().parent.parent


def one_line_error(result: subprocess.CompletedProcess, code: int = 2) -> str:
    err = result.stderr.decode()
    assert result.returncode == code, (result.returncode, err, result.stdout.decode())
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: "), err
    return err


def fresh_shell_env() -> dict[str, str]:
    """A new shell's environment: the venv neither activated nor on PATH."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return env


# ---------------------------------------------------------------------------------------- 1. PATH


@pytest.mark.integration
def test_readme_quick_start_puts_eagle_synth_on_path_in_a_fresh_shell() -> None:
    """The README's lines after `make demo` / `make test`, run in a new shell exactly as printed."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"To use the command in this shell:\n\n((?:    .+\n)+)", readme)
    assert block, "README: the activate block after make test"
    lines = [line[4:] for line in block[1].splitlines()]
    assert lines[0] == ". .venv/bin/activate" and lines[1].startswith("eagle-synth ")
    env = fresh_shell_env()
    missing = subprocess.run(["bash", "-c", "command -v eagle-synth"], cwd=REPO, env=env, capture_output=True)
    assert missing.returncode != 0, "eagle-synth is on this PATH already: the test would prove nothing"
    result = subprocess.run(["bash", "-c", "\n".join(lines)], cwd=REPO, env=env, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert "Usage: eagle-synth" in result.stdout.decode()


# ------------------------------------------------------------------------------ 2. export formats


@pytest.fixture
def records_folder(tmp_path: Path) -> Path:
    return write_campaign(tmp_path / "camp", conversation_records(3, turns=2, samples=1))


def test_export_infers_the_format_from_the_extension_and_refuses_a_contradiction(tmp_path, records_folder):
    import pyarrow.parquet as pq

    out = tmp_path / "train.parquet"
    summary = json.loads(cli("export", str(records_folder), "--out", str(out), "--json").stdout)
    assert summary["format"] == "parquet" and pq.read_table(out).num_rows == summary["rows"] == 6
    jsonl = tmp_path / "train.jsonl"
    assert json.loads(cli("export", str(records_folder), "--out", str(jsonl), "--json").stdout)["format"] == "jsonl"
    assert len(jsonl.read_text().splitlines()) == 6
    for args, expected in (
        (["--format", "parquet", "--out", str(tmp_path / "y.jsonl")], "--format parquet contradicts --out"),
        (["--format", "jsonl", "--out", str(tmp_path / "y.parquet")], "--format jsonl contradicts --out"),
        (["--format", "specforge", "--out", str(tmp_path / "y.parquet")], "--format specforge contradicts --out"),
        (["--format", "hf", "--out", str(tmp_path / "y.parquet")], "--format hf writes a folder"),
    ):
        assert expected in one_line_error(cli("export", str(records_folder), *args, check=False)), args
    assert not (tmp_path / "y.jsonl").exists() and not (tmp_path / "y.parquet").exists()


# ------------------------------------------------------------------------------- 3. the figures


def test_status_rows_do_not_add_up_over_reruns_and_dry_run_reads_redis(tmp_path, redis_server, tokenizer_path):
    redis = ["--redis", redis_server.url]
    common = ["--campaign", "rerun", "--tokenizer", str(tokenizer_path), "--processes", "1", *redis]
    rows = chat_rows(5) + [{"id": "bad", "messages": []}]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    cli("enqueue", str(path), *common)
    (tmp_path / "sub").mkdir()
    cli("enqueue", str(tmp_path / "sub" / ".." / "rows.jsonl"), *common)  # the same file, named otherwise
    status = json.loads(cli("status", "rerun", "--json", *redis).stdout)
    assert (status["rows_read"], status["rows_skipped"]) == (6, 1), status  # not 12 and 2
    assert sum(status["skipped_by_reason"].values()) == 1
    other = write_jsonl(tmp_path / "more.jsonl", chat_rows(8)[5:])
    cli("enqueue", str(other), *common)
    status = json.loads(cli("status", "rerun", "--json", *redis).stdout)
    assert (status["rows_read"], status["enqueued"]) == (9, 8)  # two files add up
    # A dry run on the existing campaign counts what the real run would: nothing new.
    dry = json.loads(cli("enqueue", str(path), *common, "--dry-run", "--json").stdout)
    assert (dry["prompts_enqueued"], dry["prompts_duplicate"], dry["consulted_redis"]) == (0, 5, True)
    shown = cli("enqueue", str(path), *common, "--dry-run").stdout.decode()
    assert "would enqueue 0" in shown and "as it stands in Redis" in shown
    # ... and refuses the settings conflict the real run refuses, writing nothing.
    keys_before = sorted(campaign(redis_server.url, "rerun").client.keys("*"))
    refused = cli("enqueue", str(path), *common, "--temperature", "0.1", "--dry-run", check=False)
    assert refused.returncode == 2 and "was created with other settings" in refused.stderr.decode()
    assert "Traceback" not in refused.stderr.decode()
    assert sorted(campaign(redis_server.url, "rerun").client.keys("*")) == keys_before
    # Without a campaign of that name, the dry run says it counted as for a new one.
    new = cli("enqueue", str(path), *common[:1], "fresh", *common[2:], "--dry-run").stdout.decode()
    assert "would enqueue 5" in new and "counted as a new campaign" in new


def test_status_shows_when_the_campaign_should_end_not_the_clock(redis_server) -> None:
    client = campaign(redis_server.url, "eta").client
    target = Campaign(client, "eta")
    target.register(
        CampaignSettings(name="eta", tokenizer_path="/t", tokenizer_fingerprint="f", chat_template_hash="h")
    )
    keys = [f"k{i:03d}" for i in range(40)]
    target.outbox.claim("run:1", [PromptItem(key=k, row_id="r", sample=0, ids=[1]) for k in keys])
    target.outbox.clear("run:1")
    target.mark_done(keys[:5], tokens_in=10, tokens_out=10)
    time.sleep(0.05)
    target.mark_done(keys[5:10], tokens_in=10, tokens_out=10)
    data = json.loads(cli("status", "eta", "--json", "--redis", redis_server.url).stdout)
    shown = cli("status", "eta", "--redis", redis_server.url, env={"COLUMNS": "100"}).stdout.decode()
    header = shown.splitlines()[0]
    assert "finished at" not in header and "as of " in header, header
    ends = re.search(r"25\.0% finished, ends ~(\d\d:\d\d:\d\d)", header)
    assert ends, header
    expected = time.localtime(data["at"] + data["eta_seconds"])
    shown_end = time.strptime(ends[1], "%H:%M:%S")
    # Two processes a moment apart: the same finish time within a few seconds.
    seconds = lambda t: t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec  # noqa: E731
    assert abs(seconds(shown_end) - seconds(expected)) % 86400 < 30, (header, data["eta_seconds"])


def test_manifest_counts_are_final_after_the_last_batch(tmp_path, redis_server, stack, tokenizer_path) -> None:
    from tests.helpers import enqueue_rows

    _, url = stack.devserver("--token-latency", "0")
    out = tmp_path / "out"
    enqueue_rows(tmp_path, redis_server.url, "final", chat_rows(20), tokenizer=tokenizer_path, batch_size=4)
    stack.worker(servers=[url], out=out, redis_url=redis_server.url)
    wait_finished(redis_server.url, "final", expected=20, stack=stack)
    # Batches after the first land within MANIFEST_REFRESH (60 s): only the last one's refresh
    # makes the counts final.
    manifest = out / "final" / MANIFEST_NAME

    def final() -> bool:
        return json.loads(manifest.read_text())["counts"] == {"enqueued": 20, "done": 20, "failed": 0}

    wait_for(final, timeout=20, what="manifest.json to say 20 done of 20")
    assert_exactly_once(redis_server.url, "final", out / "final", expected=20)


# ------------------------------------------------------------------------------- 4. silent exits


def _campaign_with_failures(redis_url: str, name: str) -> None:
    target = campaign(redis_url, name)
    target.register(CampaignSettings(name=name, tokenizer_path="/t", tokenizer_fingerprint="f", chat_template_hash="h"))
    items = [PromptItem(key=f"f{i}", row_id="r", sample=0, ids=[1, 2], source="in.jsonl:1") for i in range(3)]
    target.outbox.claim("run:1", items)
    target.outbox.clear("run:1")
    for item, reason in zip(items, ("timeout", "timeout", "bad-response")):
        target.record_failure(item, reason=reason, message="boom", sampling={}, worker="w")


def test_missing_campaign_and_unknown_reason_are_errors(redis_server) -> None:
    redis = ["--redis", redis_server.url]
    for command in ("failed", "retry-failed"):
        err = one_line_error(cli(command, "nope", *redis, check=False))
        assert "no campaign named 'nope'" in err, command
    _campaign_with_failures(redis_server.url, "flaky")
    err = one_line_error(cli("retry-failed", "flaky", "--reason", "nonsense", *redis, check=False))
    assert "--reason 'nonsense'" in err and "bad-response, timeout" in err
    assert len(queued_items(redis_server.url)) == 0
    retried = cli("retry-failed", "flaky", "--reason", "timeout", *redis).stdout.decode()
    assert "re-enqueued 2 failed prompts" in retried and len(queued_items(redis_server.url)) == 2


def test_enqueue_flags_that_do_not_go_together(tmp_path, tokenizer_path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", chat_rows(1))
    common = ["enqueue", str(path), "--campaign", "c", "--tokenizer", str(tokenizer_path), "--dry-run"]
    err = one_line_error(cli(*common, "--max-turns", "3", check=False))
    assert "--max-turns needs --history own" in err
    err = one_line_error(cli(*common, "--history", "own", "--turns", "all", check=False))
    assert "--turns all applies with --history dataset" in err
    assert "at least 1" in one_line_error(cli(*common, "--history", "own", "--max-turns", "0", check=False))


def test_an_empty_input_says_so(tmp_path, redis_server, tokenizer_path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = cli(
        "enqueue", str(empty), "--campaign", "e", "--tokenizer", str(tokenizer_path), "--redis", redis_server.url
    )
    assert "the input holds no rows: nothing enqueued, no campaign created" in result.stderr.decode()
    assert campaign(redis_server.url, "e").client.keys("*") == []


def test_ctrl_c_during_enqueue_says_what_was_kept_and_a_rerun_resumes(tmp_path, redis_server, tokenizer_path):
    rows = ROWS_PER_CHUNK + 20  # the first chunk is claimed whole, then the backlog cap holds the run
    path = write_jsonl(tmp_path / "rows.jsonl", chat_rows(rows))
    args = [sys.executable, "-m", "eagle_synth", "enqueue", str(path), "--campaign", "stop", "--tokenizer"]
    args += [str(tokenizer_path), "--batch-size", "4", "--processes", "2", "--redis", redis_server.url]
    # No worker runs: with a backlog cap of 8 the run waits after its first batches, mid-input.
    proc = subprocess.Popen(
        [*args, "--max-backlog", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # Ctrl-C signals the whole foreground group: parent and pool
    )
    target = campaign(redis_server.url, "stop")
    try:
        # A state, not a time: 8 prompts queued (two batches of 4) means the run has published (so
        # it is past every import) and now waits on its backlog cap, mid-input. The queue's length
        # is read, not its messages: a list read while enqueue still pushes can lag its length.
        queue = connect(broker_settings(redis_url=redis_server.url))
        wait_for(
            lambda: proc.poll() is None and queued(queue) >= 2,
            timeout=120,
            what="enqueue to wait on its backlog",
        )
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    kept = target.progress().enqueued
    assert f"interrupted: campaign 'stop' holds {kept} enqueued prompts, kept in Redis" in err, err
    assert "Rerun the same command to resume" in err and kept < rows
    rerun = cli(*args[3:], "--max-backlog", "0", "--json")
    summary = json.loads(rerun.stdout)
    assert summary["prompts_enqueued"] + summary["prompts_duplicate"] == rows
    keys = [item.key for item in queued_items(redis_server.url)]
    assert len(keys) == len(set(keys)) == rows  # every prompt queued once: none lost, none doubled


def test_empty_or_foreign_folders_say_there_is_nothing(tmp_path, tokenizer_path) -> None:
    empty = tmp_path / "empty"
    (empty / "records").mkdir(parents=True)
    for command in (
        ["export", str(empty), "--out", str(tmp_path / "x.jsonl")],
        ["verify", str(empty), "--tokenizer", str(tokenizer_path)],
        ["inspect", str(empty), "--tokenizer", str(tokenizer_path)],
    ):
        err = one_line_error(cli(*command, check=False))
        assert "holds no record files yet: nothing to" in err, command
    assert not (tmp_path / "x.jsonl").exists()
    foreign = tmp_path / "photos"
    foreign.mkdir()
    for command in (["verify", str(foreign)], ["inspect", str(foreign), "--tokenizer", str(tokenizer_path)]):
        err = one_line_error(cli(*command, check=False))
        assert "a campaign folder (OUT/<campaign>)" in err and "vocabulary" not in err, command


def test_inspect_warns_when_the_tokenizer_is_another_models(tmp_path, records_folder, tokenizer_path) -> None:
    write_manifest(
        records_folder,
        {"settings": {"tokenizer_fingerprint": "0123456789abcdef", "tokenizer_path": "/models/other"}},
    )
    result = cli("inspect", str(records_folder), "--random", "1", "--tokenizer", str(tokenizer_path))
    err = result.stderr.decode()
    assert "warning: tokenizer fingerprint" in err and "differs from the campaign's 0123456789abcdef" in err
    assert "another model's vocabulary" in err and "[output]" in result.stdout.decode()


# ---------------------------------------------------------------------------------- 5. messages


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "localhost:30000",
            "--server 'localhost:30000': not an http:// or https:// URL; e.g. --server http://localhost:30000",
        ),
        (
            "http://127.0.0.1:30000/generate",
            "without the /generate path (the worker adds it): --server http://127.0.0.1:30000",
        ),
        (
            "http://h:8000/v1/completions",
            "without the /v1/completions path (the worker adds it): --server http://h:8000",
        ),
    ],
)
def test_worker_says_what_is_wrong_with_a_server_url(tmp_path, url, expected) -> None:
    # No Redis at all: the URL is checked first, at once.
    dead = f"redis://127.0.0.1:{free_port()}/0"
    err = one_line_error(cli("worker", "--server", url, "--out", str(tmp_path / "out"), "--redis", dead, check=False))
    assert expected in err


def test_flower_with_no_redis_says_so_in_one_line() -> None:
    env = {"FLOWER_BASIC_AUTH": "ops:s3cret-for-tests"}
    dead = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    err = one_line_error(cli("flower", "--port", str(free_port()), "--redis", dead, env=env, check=False, timeout=60))
    assert "cannot reach Redis" in err and ".." not in err
    assert time.monotonic() - started < 30


# --------------------------------------------------------------------------------- 6. tracebacks


def test_devserver_bad_tokenizer_and_taken_port_are_one_line(tmp_path, tokenizer_path) -> None:
    err = one_line_error(cli("devserver", "--tokenizer", str(tmp_path / "nope"), check=False))
    assert f"--tokenizer {tmp_path / 'nope'}: no such folder" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = one_line_error(
            cli("devserver", "--tokenizer", str(tokenizer_path), "--port", str(port), check=False, timeout=120)
        )
        assert f"--port {port}: address 127.0.0.1:{port} is already in use" in err


def test_flower_on_a_taken_port_is_one_line(redis_server) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = one_line_error(
            cli(
                "flower",
                "--port",
                str(port),
                "--redis",
                redis_server.url,
                env={"FLOWER_BASIC_AUTH": "ops:s3cret-for-tests"},
                check=False,
                timeout=60,
            )
        )
        assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in err


# ------------------------------------------------------------------------------- 7. terminal fit


def test_watch_view_at_80x24_keeps_the_failures_and_the_workers() -> None:
    """The --watch view of a campaign with failures of five reasons and three servers, at 80x24."""
    from rich.console import Console

    from eagle_synth.tools.status_view import StatusView

    now = time.time()
    data = {
        "campaign": "qwen-sft-v1",
        "enqueued": 290,
        "queued": 120,
        "inflight": 64,
        "done": 90,
        "failed": 16,
        "finished_share": 0.3655,
        "failed_by_reason": {"timeout": 6, "bad-response": 4, "aborted": 3, "prompt-too-long": 2, "worker-error": 1},
        "failures_recorded_by_reason": {
            "timeout": 9,
            "bad-response": 4,
            "aborted": 3,
            "prompt-too-long": 2,
            "worker-error": 1,
        },
        "rows_read": 300,
        "rows_skipped": 10,
        "skipped_by_reason": {"empty-prompt": 7, "template-error": 3},
        "tokens_in": 123_456,
        "tokens_out": 654_321,
        "repaired_prefix": 0,
        "records_per_s": 3.2,
        "tokens_per_s": 2100.0,
        "rate_window_s": 60.0,
        "eta_seconds": 58.0,
        "at": now,
        "stranded": 0,
        "conversations": None,
        "workers": [
            {
                "node": node,
                "host": host,
                "server": server,
                "state": state,
                "since": now - 600,
                "detail": detail,
                "consuming": True,
                "inflight": 32,
                "heartbeat_at": now - 2,
                "disk": None,
                "backend": "sglang",
            }
            for node, host, server, state, detail in (
                ("w1@gpu-a", "gpu-a", "http://gpu-a:30000", "healthy", "ok"),
                ("w2@gpu-b", "gpu-b", "http://gpu-b:30000", "healthy", "ok"),
                ("w2@gpu-b", "gpu-b", "http://gpu-b:30001", "loading", "connection refused"),
            )
        ],
    }
    console = Console(record=True, width=80, height=24, color_system=None)
    console.print(StatusView(data, footer="every 2s; Ctrl-C to stop", height=console.size.height))
    text = console.export_text()
    lines = text.rstrip("\n").splitlines()
    assert len(lines) <= 24, text
    assert max(len(line.rstrip()) for line in lines) <= 80, text
    for shown in ("failed by reason", "timeout", "workers", "w1@gpu-a", "http://gpu-b:30001", "Ctrl-C to stop"):
        assert shown in text, (shown, text)
    # The rarest reasons summed on one line: their prompts still counted.
    more = re.search(r"(\d+) more reasons\s+(\d+)\s+(\d+)", text)
    assert more and (int(more[1]), int(more[2])) == (2, 3), text
