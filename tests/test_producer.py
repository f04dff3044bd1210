"""The producer: exact templating, identity and resume, campaigns, bad input, backpressure."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from eagle_synth.testing.harness import wait_for
from tests.conftest import chat_rows, write_jsonl
from tests.helpers import campaign, cli, enqueue_rows, queued, queued_items, queued_payloads

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _expected(tokenizer, messages, **kwargs):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)["input_ids"]


@pytest.mark.parametrize("thinking", [None, False, True])
def test_enqueued_ids_equal_apply_chat_template(tmp_path, redis_server, tokenizer, tokenizer_path, thinking):
    rows = [
        {"id": "tools", "tools": [WEATHER_TOOL], "messages": [{"role": "user", "content": "Weather in Oslo?"}]},
        {
            "id": "sharegpt",
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello"},
                {"from": "human", "value": "Bye?"},
            ],
        },
        {
            "id": "parts",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}]}
            ],
        },
        {"id": "plain", "prompt": "Just a prompt."},
        {
            "id": "toolcall",
            "tools": [WEATHER_TOOL],
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
                    ],
                },
                {"role": "tool", "content": '{"temp": 3}'},
                {"role": "user", "content": "And tomorrow?"},
            ],
        },
    ]
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    enqueue_rows(tmp_path, redis_server.url, "exact", rows, tokenizer=tokenizer_path, chat_template_kwargs=kwargs)
    got = {item.row_id: item.ids for item in queued_items(redis_server.url)}
    expected = {
        "tools": _expected(tokenizer, rows[0]["messages"], tools=[WEATHER_TOOL], **kwargs),
        "sharegpt": _expected(
            tokenizer,
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Bye?"},
            ],
            **kwargs,
        ),
        "parts": _expected(tokenizer, [{"role": "user", "content": "two parts"}], **kwargs),
        "plain": _expected(tokenizer, [{"role": "user", "content": "Just a prompt."}], **kwargs),
        "toolcall": _expected(tokenizer, rows[4]["messages"], tools=[WEATHER_TOOL], **kwargs),
    }
    assert got == expected
    think_open = tokenizer.convert_tokens_to_ids("<think>")
    think_close = tokenizer.convert_tokens_to_ids("</think>")
    for ids in got.values():
        if thinking is False:
            assert think_close in ids[-4:]
        else:
            assert ids[-2] == think_open


def test_turns_all_makes_one_prompt_per_user_turn(tmp_path, redis_server, tokenizer, tokenizer_path):
    messages = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "three"},
    ]
    summary = enqueue_rows(
        tmp_path, redis_server.url, "turns", [{"id": "t", "messages": messages}], tokenizer=tokenizer_path, turns="all"
    )
    assert summary.rows_enqueued == 1 and summary.prompts_enqueued == 3
    items = sorted(queued_items(redis_server.url), key=lambda i: i.turn)
    assert [i.turn for i in items] == [0, 1, 2]
    for item, end in zip(items, (1, 3, 5)):
        assert item.ids == _expected(tokenizer, messages[:end])


def test_rerun_and_added_rows_enqueue_only_what_is_new(tmp_path, redis_server, tokenizer_path):
    rows = chat_rows(20)
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    args = [
        "enqueue",
        str(path),
        "--campaign",
        "resume",
        "--tokenizer",
        str(tokenizer_path),
        "--redis",
        redis_server.url,
        "--json",
        "--processes",
        "1",
    ]
    first = json.loads(cli(*args).stdout)
    second = json.loads(cli(*args).stdout)
    assert (first["rows_enqueued"], first["rows_duplicate"]) == (20, 0)
    assert (second["rows_enqueued"], second["rows_duplicate"]) == (0, 20)
    write_jsonl(path, rows + chat_rows(25)[20:])
    third = json.loads(cli(*args).stdout)
    assert (third["rows_read"], third["rows_enqueued"], third["rows_duplicate"]) == (25, 5, 20)
    items = queued_items(redis_server.url)
    assert len(items) == 25 == len({i.key for i in items})


def test_enqueue_killed_half_way_then_rerun_loses_and_doubles_nothing(tmp_path, redis_server, tokenizer_path):
    rows = [{"id": f"k{i}", "messages": [{"role": "user", "content": f"question number {i}"}]} for i in range(3000)]
    path = write_jsonl(tmp_path / "big.jsonl", rows)
    args = [
        sys.executable,
        "-m",
        "eagle_synth",
        "enqueue",
        str(path),
        "--campaign",
        "killed",
        "--tokenizer",
        str(tokenizer_path),
        "--redis",
        redis_server.url,
        "--batch-size",
        "4",
        "--processes",
        "1",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = campaign(redis_server.url, "killed")
    wait_for(lambda: queued(c.client) >= 40, timeout=120, what="the first tasks")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert c.client.scard(c.keys.enqueued) < 3000
    rerun = json.loads(cli(*args[3:], "--json").stdout)
    assert rerun["rows_read"] == 3000
    items = queued_items(redis_server.url)
    keys = [i.key for i in items]
    # Every row is on the queue; at most the one batch being sent when killed is there twice.
    assert {i.row_id for i in items} == {r["id"] for r in rows}
    assert len(keys) - len(set(keys)) <= 4
    assert c.client.scard(c.keys.enqueued) == 3000
    assert c.client.hlen(c.keys.outbox) == 0


def test_different_settings_are_refused_with_what_differs(tmp_path, redis_server, tokenizer_path):
    path = write_jsonl(tmp_path / "p.jsonl", chat_rows(3))
    base = [
        "enqueue",
        str(path),
        "--campaign",
        "fixed",
        "--tokenizer",
        str(tokenizer_path),
        "--redis",
        redis_server.url,
    ]
    cli(*base, "--max-new-tokens", "100")
    refused = cli(*base, "--max-new-tokens", "200", check=False)
    assert refused.returncode == 2
    message = refused.stderr.decode()
    assert "max_new_tokens" in message and "100" in message and "200" in message


def test_bad_input_every_row_accounted_for(tmp_path, redis_server, tokenizer_path):
    good = json.dumps({"id": "ok", "messages": [{"role": "user", "content": "fine"}]}).encode()
    lines = [
        good,
        b"{not json",
        json.dumps({"messages": [{"role": "user", "content": 42}]}).encode(),
        json.dumps({"messages": []}).encode(),
        json.dumps({"messages": [{"role": "assistant", "content": "only me"}]}).encode(),
        b'{"prompt": "caf\xe9"}',
        json.dumps({"id": "long", "prompt": "word " * 300}).encode(),
        json.dumps({"id": "ok2", "prompt": "also fine"}).encode(),
        b'{"prompt": "cut off',
    ]
    path = tmp_path / "messy.jsonl"
    path.write_bytes(b"\n".join(lines))
    result = cli(
        "enqueue",
        str(path),
        "--campaign",
        "messy",
        "--tokenizer",
        str(tokenizer_path),
        "--redis",
        redis_server.url,
        "--max-prompt-tokens",
        "100",
        "--allow-truncated",
        "--json",
    )
    summary = json.loads(result.stdout)
    assert summary["rows_read"] == 9
    assert (summary["rows_enqueued"], summary["rows_duplicate"], summary["rows_skipped"]) == (2, 0, 7)
    assert summary["skipped_by_reason"] == {
        "bad-json": 1,
        "wrong-type": 1,
        "empty-conversation": 1,
        "no-user-turn": 1,
        "non-utf8": 1,
        "prompt-too-long": 1,
        "truncated-file": 1,
    }
    assert any(e.startswith(f"{path}:2:") for e in summary["examples"]["bad-json"])
    assert "messages[0].content" in summary["examples"]["wrong-type"][0]
    strict = cli(
        "enqueue",
        str(path),
        "--campaign",
        "messy-strict",
        "--tokenizer",
        str(tokenizer_path),
        "--redis",
        redis_server.url,
        "--strict",
        check=False,
    )
    assert strict.returncode == 2
    assert f"{path}:2" in strict.stderr.decode()


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_truncated_input_stops_the_run_unless_allowed(tmp_path, redis_server, tokenizer_path, kind):
    """A file cut mid-row or half copied is an error naming the file, the line and the rows read
    before it; --allow-truncated makes it one skipped row and enqueues the rows before."""
    rows = chat_rows(40)
    whole = tmp_path / f"whole.{kind}"
    if kind == "jsonl":
        write_jsonl(whole, rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), whole)
    data = whole.read_bytes()
    cut = tmp_path / f"cut.{kind}"
    cut_at = data.index(b"\n", len(data) // 2) + 10 if kind == "jsonl" else len(data) // 2
    cut.write_bytes(data[:cut_at])
    base = ["enqueue", str(cut), "--campaign", f"cut-{kind}", "--tokenizer", str(tokenizer_path)]
    base += ["--redis", redis_server.url, "--batch-size", "4"]
    refused = cli(*base, check=False)
    message = refused.stderr.decode().strip()
    assert refused.returncode == 2
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    read_before = data[:cut_at].count(b"\n") if kind == "jsonl" else 0
    where = f"{cut}:{read_before + 1}" if kind == "jsonl" else f"{cut}:"
    assert where in message and f"{read_before} rows were read" in message and "--allow-truncated" in message

    allowed = json.loads(cli(*base, "--allow-truncated", "--json").stdout)
    skipped = allowed["skipped_by_reason"]
    assert skipped == ({"truncated-file": 1} if kind == "jsonl" else {"unreadable-file": 1})
    assert allowed["rows_enqueued"] == read_before
    if read_before:
        assert campaign(redis_server.url, f"cut-{kind}").progress().enqueued == read_before


def test_template_rejection_skips_the_row_not_the_batch(tmp_path, redis_server, tokenizer_path):
    template = tmp_path / "picky.jinja"
    template.write_text(
        "{%- for m in messages -%}{%- if 'forbidden' in m['content'] -%}"
        "{{ raise_exception('this template refuses forbidden words') }}{%- endif -%}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n<think>\n{%- endif -%}"
    )
    rows = [{"prompt": "fine"}, {"prompt": "a forbidden word"}, {"prompt": "also fine"}]
    summary = enqueue_rows(
        tmp_path, redis_server.url, "picky", rows, tokenizer=tokenizer_path, chat_template=str(template)
    )
    assert (summary.rows_enqueued, summary.rows_skipped) == (2, 1)
    assert "refuses forbidden words" in summary.examples["template-error"][0]


def test_n_samples_are_separate_prompts_with_their_own_seeds(tmp_path, redis_server, tokenizer_path):
    path = write_jsonl(tmp_path / "p.jsonl", chat_rows(2))
    cli(
        "enqueue",
        str(path),
        "--campaign",
        "samples",
        "--tokenizer",
        str(tokenizer_path),
        "--redis",
        redis_server.url,
        "--n",
        "3",
        "--seed",
        "7",
        "--temperature",
        "1.0",
    )
    items = queued_items(redis_server.url)
    assert len(items) == 6 and len({i.key for i in items}) == 6
    assert sorted(i.sample for i in items) == [0, 0, 1, 1, 2, 2]
    assert len({i.seed for i in items}) == 6
    payload = queued_payloads(redis_server.url)[0]
    assert "seed" not in payload.sampling and payload.sampling["temperature"] == 1.0


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--top-p", "1.5", "--top-p"),
        ("--temperature", "-1", "--temperature"),
        ("--n", "0", "--n"),
    ],
)
def test_sampling_ranges_are_checked_at_enqueue(tmp_path, tokenizer_path, flag, value, message):
    path = write_jsonl(tmp_path / "p.jsonl", chat_rows(1))
    result = cli(
        "enqueue",
        str(path),
        "--campaign",
        "x",
        "--tokenizer",
        str(tokenizer_path),
        "--dry-run",
        flag,
        value,
        check=False,
    )
    assert result.returncode == 2 and message in result.stderr.decode()


def test_stdin_and_dry_run(tmp_path, redis_server, tokenizer_path):
    data = "".join(json.dumps(r) + "\n" for r in chat_rows(10)).encode()
    result = cli("enqueue", "-", "--campaign", "dry", "--tokenizer", str(tokenizer_path), "--dry-run", input=data)
    out = result.stdout.decode()
    assert "rows read 10 / would enqueue 10" in out and "prompt length histogram" in out
    assert queued(campaign(redis_server.url, "dry").client) == 0


def test_backpressure_waits_for_the_backlog_to_drain(tmp_path, redis_server, stack, tokenizer_path):
    path = write_jsonl(tmp_path / "p.jsonl", chat_rows(64))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eagle_synth",
            "enqueue",
            str(path),
            "--campaign",
            "bp",
            "--tokenizer",
            str(tokenizer_path),
            "--redis",
            redis_server.url,
            "--batch-size",
            "8",
            "--max-backlog",
            "16",
            "--processes",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    c = campaign(redis_server.url, "bp")
    try:
        wait_for(lambda: c.client.scard(c.keys.enqueued) >= 16, timeout=120, what="the first prompts")
        wait_for(lambda: queued(c.client) >= 3, timeout=30, what="three batches")
        # With no worker the backlog cannot drain: the producer holds back.
        assert proc.poll() is None
        assert queued(c.client) <= 3
        _, url = stack.devserver()
        stack.worker(servers=[url], out=tmp_path / "out", redis_url=redis_server.url)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr.decode()
    assert "max-backlog" in stderr.decode()
    assert "enqueued 64" in stdout.decode()
