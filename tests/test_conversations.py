"""Multi-turn regeneration on the model's own answers (`--history own`) through the whole path:
CLI enqueue -> Redis -> real Celery workers -> devserver over HTTP -> records -> verify / export.

Every turn's prompt ids are checked against the contract computed here, independently, with
plain transformers; every output id against what the server answers for those ids."""

from __future__ import annotations

import json

import pytest
import requests

from eagle_synth.settings import broker_settings
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import wait_for
from eagle_synth.tools.status import campaign_status
from tests.conftest import write_jsonl
from tests.helpers import assert_exactly_once, cli, status_json

VARIANTS = [
    {"name": "think", "weight": 0.5},
    {"name": "hot", "weight": 0.2, "sampling": {"temperature": 1.0}},
    {"name": "no-think", "weight": 0.3, "chat_template_kwargs": {"enable_thinking": False}},
]
MAX_TURNS = 3


def own_rows(count: int) -> list[dict]:
    """ShareGPT rows of 1 to 4 user turns (old answers between them), some with a system
    message (rows with tools: tests/test_tool_conversations.py)."""
    rows = []
    for i in range(count):
        conversation = []
        if i % 3 == 0:
            conversation.append({"from": "system", "value": "You answer briefly."})
        for turn in range(1 + i % 4):
            conversation.append(
                {"from": "human", "value": f"Question {turn} of conversation {i}: tell me about {i * 7 + turn}."}
            )
            conversation.append({"from": "gpt", "value": f"An old answer {turn}, written by another model."})
        rows.append({"id": f"conv-{i}", "conversations": conversation})
    return rows


def row_turns(row: dict) -> tuple[list[dict], list[dict], list | None]:
    """(leading system messages, user messages, tools) of a row, read independently of the producer."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    if "conversations" in row:
        messages = [{"role": roles[m["from"]], "content": m["value"]} for m in row["conversations"]]
    else:
        messages = row["messages"]
    return (
        [m for m in messages if m["role"] == "system"],
        [m for m in messages if m["role"] == "user"],
        row.get("tools"),
    )


def expected_answer(tokenizer, output_ids: list[int], *, matched) -> dict:
    """The contract: final stop removed, split at </think>, decoded without special tokens, stripped."""
    ids = list(output_ids)
    if ids and (ids[-1] == tokenizer.eos_token_id or ids[-1] == matched):
        ids = ids[:-1]
    think_close = tokenizer.convert_tokens_to_ids("</think>")
    if think_close in ids:
        cut = ids.index(think_close)
        return {
            "role": "assistant",
            "content": tokenizer.decode(ids[cut + 1 :], skip_special_tokens=True).strip(),
            "reasoning_content": tokenizer.decode(ids[:cut], skip_special_tokens=True).strip(),
        }
    return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True).strip()}


def check_conversation(tokenizer, row: dict, turns: list, *, template_kwargs: dict) -> str:
    """Check every turn's prompt ids against the contract; returns how the conversation ended."""
    system, users, tools = row_turns(row)
    messages = [*system, users[0]]
    for index, record in enumerate(turns):
        expected = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, **template_kwargs)[
            "input_ids"
        ]
        assert record.prompt_ids == list(expected), f"{row['id']} turn {index}: prompt ids differ from the contract"
        if index + 1 < len(turns):
            assert record.finish_reason == "stop", "a conversation goes on only after a turn that stopped"
            messages = [
                *messages,
                expected_answer(tokenizer, record.output_ids, matched=record.finish_matched),
                users[index + 1],
            ]
    last = turns[-1]
    if last.finish_reason == "length":
        return "truncated"
    assert len(turns) == min(len(users), MAX_TURNS), f"{row['id']} stopped early without a reason"
    return "max-turns" if len(users) > MAX_TURNS else "complete"


def wait_conversations_finished(redis_url: str, name: str, *, stack, timeout: float = 240) -> dict:
    client = connect(broker_settings(redis_url=redis_url))

    def finished():
        data = campaign_status(client, name)
        conversations = data["conversations"]
        return (
            data
            if (
                conversations["total"]
                and not conversations["in_progress"]
                and not conversations["followups_waiting"]
                and data["queued"] == data["inflight"] == 0
            )
            else None
        )

    try:
        return wait_for(finished, timeout=timeout, interval=0.5, what=f"the conversations of {name}")
    except TimeoutError:
        raise AssertionError(f"status {campaign_status(client, name)}; logs:\n{stack.logs()}") from None


def test_own_history_regenerates_multi_turn_rows_id_for_id(tmp_path, redis_server, stack, tokenizer, tokenizer_path):
    rows = own_rows(18)
    prompts = write_jsonl(tmp_path / "rows.jsonl", rows)
    variants = tmp_path / "variants.json"
    variants.write_text(json.dumps(VARIANTS))
    _, url = stack.devserver("--token-latency", "0.001", "--mean-output-tokens", "24")
    out = tmp_path / "out"

    enqueued = cli(
        "enqueue",
        str(prompts),
        "--campaign",
        "own",
        "--tokenizer",
        str(tokenizer_path),
        "--history",
        "own",
        "--max-turns",
        str(MAX_TURNS),
        "--variants",
        str(variants),
        "--max-new-tokens",
        "48",
        "--temperature",
        "0.7",
        "--seed",
        "7",
        "--batch-size",
        "4",
        "--redis",
        redis_server.url,
    )
    assert f"rows read {len(rows)} / enqueued {len(rows)} / duplicate 0 / skipped 0" in enqueued.stdout.decode()
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, args=["--render-processes", "1"])
    status = wait_conversations_finished(redis_server.url, "own", stack=stack)

    records = assert_exactly_once(redis_server.url, "own", out / "own", expected=status["enqueued"])
    by_conversation: dict[str, list] = {}
    for record in records.values():
        by_conversation.setdefault(record.conversation, []).append(record)
    assert len(by_conversation) == len(rows)
    by_id = {row["id"]: row for row in rows}
    ends: dict[str, int] = {}
    used_variants = set()
    for turns in by_conversation.values():
        turns.sort(key=lambda r: r.turn)
        assert [r.turn for r in turns] == list(range(len(turns)))
        assert len({(r.id, r.variant) for r in turns}) == 1, "a conversation keeps its row and variant"
        variant = next(v for v in VARIANTS if v["name"] == turns[0].variant)
        used_variants.add(variant["name"])
        end = check_conversation(
            tokenizer, by_id[turns[0].id], turns, template_kwargs=variant.get("chat_template_kwargs", {})
        )
        ends[end] = ends.get(end, 0) + 1
        for record in turns:
            assert record.sampling["temperature"] == variant.get("sampling", {}).get("temperature", 0.7)
            # The output is exactly what the server answers for these ids and sampling parameters.
            reply = requests.post(
                f"{url}/generate", json={"input_ids": record.prompt_ids, "sampling_params": record.sampling}, timeout=30
            ).json()
            assert record.output_ids == reply["output_ids"]
            assert record.finish_reason == reply["meta_info"]["finish_reason"]["type"]
    assert used_variants == {v["name"] for v in VARIANTS}
    assert max(len(t) for t in by_conversation.values()) == MAX_TURNS
    assert ends.get("complete") and ends.get("max-turns") and ends.get("truncated"), ends

    conversations = status_json(redis_server.url, "own")["conversations"]
    assert conversations["total"] == len(rows) and conversations["done"] == ends["complete"]
    assert conversations["stopped_by_reason"] == {k: v for k, v in ends.items() if k != "complete"}
    assert conversations["in_progress"] == 0
    stopped = json.loads(cli("failed", "own", "--json", "--redis", redis_server.url).stdout)["conversations_stopped"]
    assert {reason: info["count"] for reason, info in stopped.items()} == conversations["stopped_by_reason"]
    truncated = stopped["truncated"]["examples"][0]
    assert by_conversation[truncated["conversation"]][-1].finish_reason == "length"
    assert truncated["turns"] == len(by_conversation[truncated["conversation"]])

    report = json.loads(cli("verify", str(out / "own"), "--json").stdout)
    assert report["ok"] and report["checks"]["conversation_gap"]["count"] == 0
    assert report["conversations"] == {"count": len(rows), "turns": len(records), "longest": MAX_TURNS}

    exported = tmp_path / "last.jsonl"
    cli("export", str(out / "own"), "--out", str(exported), "--turns", "last")
    last_rows = [json.loads(line) for line in exported.read_text().splitlines()]
    assert sorted(r["key"] for r in last_rows) == sorted(
        max(t, key=lambda r: r.turn).key for t in by_conversation.values()
    )
    everything = tmp_path / "all.jsonl"
    cli("export", str(out / "own"), "--out", str(everything))
    order = [records[json.loads(line)["key"]] for line in everything.read_text().splitlines()]
    conversation_order = [r.conversation for r in order]
    # Rows come conversation by conversation, each one's turns in order.
    assert len(order) == len(records)
    assert [c for i, c in enumerate(conversation_order) if i == 0 or conversation_order[i - 1] != c] == sorted(
        by_conversation
    )
    assert all(
        order[i].turn + 1 == order[i + 1].turn
        for i in range(len(order) - 1)
        if order[i].conversation == order[i + 1].conversation
    )


# Short visibility timeout so a SIGKILLed worker's batches come back within the test.
FAST_REDELIVERY = {
    "EAGLE_SYNTH_VISIBILITY_TIMEOUT": "10",
    "EAGLE_SYNTH_RESTORE_INTERVAL": "1",
    "EAGLE_SYNTH_BACKOFF_MAX": "0.5",
    "EAGLE_SYNTH_FOLLOWUP_SWEEP": "1",
}


def long_rows(count: int) -> list[dict]:
    """Conversations of 3 and 4 user turns: long enough to be cut in the middle."""
    return [
        {
            "id": f"long-{i}",
            "messages": [
                message
                for turn in range(3 + i % 2)
                for message in (
                    {"role": "user", "content": f"Step {turn} of task {i}: continue the story about {i * 5 + turn}."},
                    {"role": "assistant", "content": "an old answer"},
                )
            ],
        }
        for i in range(count)
    ]


def assert_conversations_accounted(redis_url: str, name: str, folder, rows: list[dict]) -> dict:
    """Every turn has exactly one record or failure; every conversation's turns are 0..n-1 and
    it ended for its reason (all user turns answered, or truncated); none is lost or in progress."""
    from eagle_synth.state.conversation_store import ConversationStore
    from tests.helpers import campaign

    c = campaign(redis_url, name)
    records = assert_exactly_once(redis_url, name, folder, expected=c.progress().enqueued)
    by_conversation: dict[str, list] = {}
    for record in records.values():
        by_conversation.setdefault(record.conversation, []).append(record)
    users = {row["id"]: len(row_turns(row)[1]) for row in rows}
    ends: dict[str, int] = {}
    for turns in by_conversation.values():
        turns.sort(key=lambda r: r.turn)
        assert [r.turn for r in turns] == list(range(len(turns))), "a turn is missing or doubled"
        assert all(r.finish_reason == "stop" for r in turns[:-1])
        if turns[-1].finish_reason == "length":
            ends["truncated"] = ends.get("truncated", 0) + 1
        else:
            assert len(turns) == users[turns[0].id], f"conversation {turns[0].id} lost its turn {len(turns)}"
            ends["complete"] = ends.get("complete", 0) + 1
    assert len(by_conversation) == len(rows) and c.progress().failed == 0
    counts = ConversationStore(c).counts()
    assert counts == {
        "total": len(rows),
        "done": ends.get("complete", 0),
        "in_progress": 0,
        "stopped": ends.get("truncated", 0),
        "stopped_by_reason": {"truncated": ends["truncated"]} if ends.get("truncated") else {},
        "followups_waiting": 0,
    }
    assert not c.client.hlen(c.keys.followup_owners), "an outbox entry is left behind"
    return records


def test_worker_killed_mid_conversation_loses_and_doubles_no_turn(tmp_path, redis_server, stack, tokenizer_path):
    from tests.helpers import campaign, enqueue_rows

    rows = long_rows(16)
    enqueue_rows(
        tmp_path,
        redis_server.url,
        "killconv",
        rows,
        tokenizer=tokenizer_path,
        batch_size=4,
        max_new_tokens=96,
        history="own",
    )
    _, url = stack.devserver("--token-latency", "0.01", "--mean-output-tokens", "30", "--slots", "8")
    out = tmp_path / "out"
    first = stack.worker(
        servers=[url],
        out=out,
        redis_url=redis_server.url,
        env=FAST_REDELIVERY,
        name="first@test",
        args=["--render-processes", "1"],
    )
    c = campaign(redis_server.url, "killconv")
    # Killed once later turns are on their way: records of turn 0 written, next turns rendered or queued.
    wait_for(lambda: c.progress().enqueued > len(rows) + 4, timeout=90, interval=0.1, what="next turns in flight")
    first.kill()
    assert c.progress().done < c.progress().enqueued

    stack.worker(
        servers=[url],
        out=out,
        redis_url=redis_server.url,
        env=FAST_REDELIVERY,
        name="second@test",
        args=["--render-processes", "1"],
    )
    wait_conversations_finished(redis_server.url, "killconv", stack=stack, timeout=240)
    records = assert_conversations_accounted(redis_server.url, "killconv", out / "killconv", rows)
    assert {r.worker for r in records.values()} == {"first@test", "second@test"}


def test_redis_restart_and_server_death_mid_conversation(tmp_path, stack, tokenizer_path):
    from eagle_synth.state.node_state import all_nodes
    from eagle_synth.testing.harness import RedisServer, free_port
    from tests.helpers import campaign, enqueue_rows

    redis_server = RedisServer(workdir=tmp_path / "redis", appendonly=True).start()
    try:
        rows = long_rows(8)
        enqueue_rows(
            tmp_path,
            redis_server.url,
            "rrconv",
            rows,
            tokenizer=tokenizer_path,
            batch_size=4,
            max_new_tokens=96,
            history="own",
        )
        port = free_port()
        first, url = stack.devserver(
            "--token-latency", "0.04", "--mean-output-tokens", "20", "--die-after", "14", port=port
        )
        out = tmp_path / "out"
        # One batch at a time, Redis restarted while its prompts generate, so no acknowledgement
        # is in flight: one lost to the restart can trip a Celery/kombu race on reconnection that
        # stops the worker (AttributeError in restore_unacked), conversations or not.
        stack.worker(
            servers=[url],
            out=out,
            redis_url=redis_server.url,
            env=FAST_REDELIVERY,
            concurrency=1,
            args=["--render-processes", "1"],
        )
        c = campaign(redis_server.url, "rrconv")

        def generating_after_first_commits() -> bool:
            return c.progress().done >= 4 and any(
                n.get("inflight_by_campaign", {}).get("rrconv") for n in all_nodes(c.client)
            )

        wait_for(generating_after_first_commits, timeout=90, interval=0.05, what="turns generating after commits")
        redis_server.restart()
        wait_for(lambda: not first.alive(), timeout=90, what="the server to die")
        stack.devserver("--token-latency", "0.005", "--mean-output-tokens", "20", port=port)
        wait_conversations_finished(redis_server.url, "rrconv", stack=stack, timeout=240)
        assert_conversations_accounted(redis_server.url, "rrconv", out / "rrconv", rows)
    finally:
        redis_server.stop()


def test_turns_fail_without_the_stored_tokenizer_and_retry_failed_resumes_them(
    tmp_path, redis_server, stack, tokenizer_path
):
    from eagle_synth.state.keys import tokenizer_blob
    from tests.helpers import campaign, enqueue_rows

    rows = long_rows(4)
    enqueue_rows(tmp_path, redis_server.url, "notok", rows, tokenizer=tokenizer_path, batch_size=4, history="own")
    c = campaign(redis_server.url, "notok")
    settings = c.settings()
    assert c.client.delete(tokenizer_blob(settings.tokenizer_fingerprint, settings.chat_template_hash)) == 1
    _, url = stack.devserver("--token-latency", "0.001", "--mean-output-tokens", "20")
    out = tmp_path / "out"
    # A cache of its own: the worker must get the tokenizer from Redis, where it is gone.
    stack.worker(
        servers=[url],
        out=out,
        redis_url=redis_server.url,
        args=["--render-processes", "1"],
        env={"EAGLE_SYNTH_CACHE_DIR": str(tmp_path / "cache")},
    )
    wait_for(lambda: c.progress().failed == len(rows), timeout=90, what="the turns to fail")
    conversations = status_json(redis_server.url, "notok")["conversations"]
    assert conversations["stopped_by_reason"] == {"tokenizer-unavailable": len(rows)}
    assert conversations["in_progress"] == 0 and c.progress().done == 0  # no GPU time spent on them
    failed = json.loads(cli("failed", "notok", "--json", "--redis", redis_server.url).stdout)
    [entry] = failed["by_reason"]["tokenizer-unavailable"]["prompts"][:1]
    assert "run the same `eagle-synth enqueue" in entry["message"]

    again = enqueue_rows(
        tmp_path, redis_server.url, "notok", rows, tokenizer=tokenizer_path, batch_size=4, history="own"
    )
    assert again.prompts_enqueued == 0 and again.prompts_duplicate == len(rows)
    cli("retry-failed", "notok", "--redis", redis_server.url)
    wait_conversations_finished(redis_server.url, "notok", stack=stack)
    assert_conversations_accounted(redis_server.url, "notok", out / "notok", rows)


def affinity_rows(count: int) -> list[dict]:
    """Conversations of 4 user turns with long questions, so the history is most of a prompt."""
    question = "Go on with the report, and keep every detail of the earlier steps in mind: " * 4
    return [
        {
            "id": f"affine-{i}",
            "messages": [
                message
                for turn in range(4)
                for message in (
                    {"role": "user", "content": f"Step {turn} of report {i}. {question}"},
                    {"role": "assistant", "content": "an old answer"},
                )
            ],
        }
        for i in range(count)
    ]


def test_prefix_affinity_keeps_a_conversation_on_its_server(tmp_path, redis_server, stack, tokenizer_path):
    """Two servers, one worker: every later turn goes to the server of the turn before (tickets
    never run out here), which finds the history cached; with EAGLE_SYNTH_PREFIX_AFFINITY=0 the
    turns go by load alone and find less of it."""
    from tests.helpers import enqueue_rows

    servers = [stack.devserver("--token-latency", "0.002", "--mean-output-tokens", "24")[1] for _ in range(2)]
    rows = affinity_rows(8)
    out = tmp_path / "out"
    shares = {}
    for name, env in (("affine", {}), ("spread", {"EAGLE_SYNTH_PREFIX_AFFINITY": "0"})):
        for url in servers:  # each campaign starts on cold caches
            assert requests.post(f"{url}/flush_cache", timeout=10).status_code == 200
        enqueue_rows(tmp_path, redis_server.url, name, rows, tokenizer=tokenizer_path, batch_size=4, history="own")
        # 16 tickets a server: more than the 8 conversations, so affinity is never overruled.
        args = ["--render-processes", "1", "--inflight", "16", "--campaign", name]
        stack.worker(servers=servers, out=out, redis_url=redis_server.url, env=env, name=f"{name}@test", args=args)
        wait_conversations_finished(redis_server.url, name, stack=stack)
        records = assert_conversations_accounted(redis_server.url, name, out / name, rows)
        shares[name] = status_json(redis_server.url, name)["cache_hit_share"]
        turns = sorted(records.values(), key=lambda r: (r.conversation, r.turn))
        pairs = [(a, b) for a, b in zip(turns, turns[1:]) if a.conversation == b.conversation]
        assert len(pairs) >= 2 * len(rows)
        if name == "affine":
            assert all(later.server == earlier.server for earlier, later in pairs)
            assert {r.server for r in turns} == set(servers), "conversations spread over both servers"
            assert all(later.cached_tokens >= len(earlier.prompt_ids) // 2 for earlier, later in pairs)
        assert sum(r.cached_tokens for r in turns) / sum(len(r.prompt_ids) for r in turns) == pytest.approx(
            shares[name], abs=1e-3
        )
    assert shares["affine"] > shares["spread"], shares
