"""The check both remote-code model tests (DeepSeek-V4, the Kimi-K2.5-shaped fixture) make of a
tool conversation campaign: every turn's prompt ids are what the model's own code gives for the
history rebuilt here from the model's own answers and the dataset's results."""

from __future__ import annotations

from collections.abc import Callable

from tests.test_tool_conversations import EXPECTED, ROWS, dataset_steps


def check_replayed_conversations(
    records: dict,
    *,
    own_prompt_ids: Callable[[list[dict], list[dict] | None, str], list[int]],
    read_answer: Callable[[list[int], str], dict],
    give_results: Callable[[dict, list[dict], list[dict]], list[dict]],
) -> int:
    """Check every conversation of tests/test_tool_conversations.py's ROWS; returns how many
    tool calls of the model's were replayed.

    Parameters:
        own_prompt_ids: (messages, tools, variant name) -> the model's own prompt ids.
        read_answer: (output ids, variant name) -> the assistant message, read by the test's own parser.
        give_results: (that message, the dataset's calls, their results) -> the tool messages
            that answer it (ids as the model's template pairs them).
    """
    turns: dict[str, list] = {}
    for record in records.values():
        turns.setdefault(record.id, []).append(record)
    assert {row: len(listed) for row, listed in turns.items()} == {row: n for row, (_, n) in EXPECTED.items()}
    called = 0
    for row in ROWS:
        listed = sorted(turns[row["id"]], key=lambda r: r.turn)
        steps = dataset_steps(row)
        messages = list(steps[0][0])
        for index, record in enumerate(listed):
            expected = own_prompt_ids(messages, row.get("tools"), record.variant)
            assert record.prompt_ids == list(expected), f"{row['id']} turn {index} ({record.variant})"
            answer = read_answer(record.output_ids, record.variant)
            calls = answer.get("tool_calls", [])
            assert record.tool_calls == (len(calls) if row.get("tools") else None), f"{row['id']} turn {index}"
            called += len(calls)
            if index + 1 == len(listed):
                break
            _, dataset_calls, results = steps[index]
            if calls and all(c.get("id") for c in dataset_calls):
                by_id = {r.get("tool_call_id"): r for r in results}
                results = [by_id[c["id"]] for c in dataset_calls]
            if calls:
                results = give_results(answer, dataset_calls, results)
            messages = [*messages, answer, *results, *steps[index + 1][0]]
    return called


def check_record_tools(campaign_dir, tokenizer_folder, *, shown: str) -> None:
    """`verify` and `inspect` read a remote-code campaign's records through the folder's own
    tokenizer code (the one the campaign recorded): no fingerprint mismatch, `shown` decoded."""
    import json

    from tests.helpers import cli

    report = json.loads(cli("verify", str(campaign_dir), "--tokenizer", str(tokenizer_folder), "--json").stdout)
    assert report["ok"] and report["warnings"] == 0 and report["checks"]["tokenizer_mismatch"]["count"] == 0
    # Without --tokenizer, inspect takes the manifest's tokenizer_path.
    decoded = cli("inspect", str(campaign_dir), "--random", "1", "--seed", "1").stdout.decode()
    assert shown in decoded and "differs" not in decoded, decoded[-2000:]


def start_hosts(stack, *hosts) -> str:
    """Redis, a devserver running the folder's code (--trust-remote-code) and one worker per host
    folder (`worker --tokenizer HOST`; None: a worker without one); returns Redis's URL."""
    redis_url = stack.redis().url
    _, url = stack.devserver("--trust-remote-code", "--token-latency", "0.001", "--mean-output-tokens", "12")
    # Host queues off: a conversation's next turns go to the campaign's queue, where every host
    # takes them, so each host renders some with its own folder (with host queues on, the host
    # that took a conversation's first turn keeps the rest: tests/test_handoff.py).
    env = {"EAGLE_SYNTH_HOST_QUEUES": "0"}
    for index, local in enumerate(hosts):
        args = ["--render-processes", "1", *(["--tokenizer", str(local)] if local else [])]
        stack.worker(
            servers=[url], out=stack.dir / "out", redis_url=redis_url, args=args, env=env, name=f"host{index}@test"
        )
    return redis_url
