"""A worker process's follow-ups (workers/followups.py) against a real Redis and real
renderer processes, without Celery: a renderer pool killed under it, and the entries of a
dead worker process adopted and carried to the queue, each next turn exactly once."""

from __future__ import annotations

import os
import signal
import time

import msgpack
import msgspec
import pytest

from eagle_synth.conversation import ConversationState, next_turn, turn_key
from eagle_synth.ids import pack_ids
from eagle_synth.payload import PromptItem, TaskPayload, pack_item
from eagle_synth.records import Record
from eagle_synth.sampling import SamplingParams
from eagle_synth.settings import broker_settings
from eagle_synth.state.campaign import Campaign
from eagle_synth.state.conversation_store import FOLLOW, ConversationStore
from eagle_synth.state.redis_client import connect
from eagle_synth.state.tokenizer_store import store_tokenizer
from eagle_synth.templating import tokenizer_facts
from eagle_synth.testing.harness import wait_for
from producer.enqueue import EnqueueOptions, campaign_settings, resolve_tool_format
from workers import followups
from workers.followups import FollowUps

SAMPLING = {"max_new_tokens": 32, "temperature": 0.0}


@pytest.fixture
def setup(tmp_path, redis_server, tokenizer, tokenizer_path, monkeypatch):
    monkeypatch.setenv("EAGLE_SYNTH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(followups, "SWEEP_INTERVAL", 0.2)
    client = connect(broker_settings(redis_url=redis_server.url))
    campaign = Campaign(client, "fu")
    options = EnqueueOptions(
        inputs=[],
        campaign="fu",
        tokenizer=str(tokenizer_path),
        history="own",
        sampling=SamplingParams(max_new_tokens=32, temperature=0.0),
    )
    tool_format, _ = resolve_tool_format(options, tokenizer)
    settings = campaign.register(campaign_settings(options, tokenizer, tool_format=tool_format))
    facts = tokenizer_facts(tokenizer)
    store_tokenizer(client, tokenizer, fingerprint=facts.fingerprint, chat_template_hash=facts.chat_template_hash)
    return client, campaign, settings


def turns(tokenizer, count: int, tag: str) -> tuple[TaskPayload, list[Record]]:
    """Turn 0 of `count` two-turn conversations, and their records (a reasoning answer, EOS)."""
    think_close, eos = tokenizer.convert_tokens_to_ids("</think>"), tokenizer.eos_token_id
    output = (
        tokenizer("Some thought.", add_special_tokens=False)["input_ids"]
        + [think_close]
        + tokenizer("\n\nAn answer.", add_special_tokens=False)["input_ids"]
        + [eos]
    )
    items, records = [], []
    for i in range(count):
        state = ConversationState(
            key=f"{tag}{i:02d}".ljust(32, "0"),
            messages=[{"role": "user", "content": f"Question {tag} {i}?"}],
            upcoming=[[{"role": "user", "content": "Why?"}]],
        )
        ids = tokenizer.apply_chat_template(state.messages, add_generation_prompt=True)["input_ids"]
        item = PromptItem(
            key=turn_key(state.key, 0),
            row_id=f"{tag}{i}",
            sample=0,
            ids=list(ids),
            source="x:1",
            conversation=state.to_dict(),
        )
        items.append(item)
        records.append(
            Record(
                key=item.key,
                id=item.row_id,
                sample=0,
                turn=0,
                prompt_ids=item.ids,
                output_ids=output,
                finish_reason="stop",
                finish_matched=eos,
                prompt_tokens=len(ids),
                completion_tokens=len(output),
                conversation=state.key,
            )
        )
    return TaskPayload(campaign="fu", batch=f"{tag}batch", sampling=SAMPLING, items=items), records


def expected_next(tokenizer, item: PromptItem, record: Record) -> list[int]:
    return next_turn(
        tokenizer,
        ConversationState.from_dict(item.conversation),
        record.output_ids,
        finish_reason="stop",
        matched=record.finish_matched,
        eos_token_ids=[tokenizer.eos_token_id],
        think_close_id=tokenizer.convert_tokens_to_ids("</think>"),
    ).ids


def check_sent(sent: list[dict], tokenizer, payload: TaskPayload, records: list[Record]) -> None:
    """Each conversation's turn 1 was queued once, with the contract's prompt ids."""
    queued = [item for message in sent for item in TaskPayload.decode(message).items]
    by_key = {item.key: item for item in queued}
    assert len(by_key) == len(queued) == len(payload.items), "a next turn was queued twice or not at all"
    for item, record in zip(payload.items, records):
        following = by_key[turn_key(item.conversation["key"], 1)]
        assert following.turn == 1 and following.ids == expected_next(tokenizer, item, record)


def test_a_killed_renderer_pool_is_replaced_and_every_next_turn_queued_once(setup, tokenizer):
    client, campaign, settings = setup
    sent: list[dict] = []
    followups = FollowUps(redis_client=client, send=sent.append, render_processes=1, hungry=lambda: True)
    try:
        followups.prepare(campaign, settings)
        renderer = next(iter(followups._renderers.values()))
        for process in list(renderer._pool._processes.values()):
            os.kill(process.pid, signal.SIGKILL)
        payload, records = turns(tokenizer, 3, "a")
        assert followups.commit(campaign, payload, records) == 3
        wait_for(lambda: len([i for m in sent for i in m["keys"]]) >= 3, timeout=180, what="the next turns queued")
        check_sent(sent, tokenizer, payload, records)
        assert followups._renderers and next(iter(followups._renderers.values())) is not renderer
        store = ConversationStore(campaign)
        wait_for(lambda: store.waiting() == 0, timeout=30, what="the outbox to empty")
        assert campaign.was_enqueued(list(sent[0]["keys"])) == [True] * len(sent[0]["keys"])
        # Committing the same records again (a redelivered batch) queues nothing more.
        assert followups.commit(campaign, payload, records) == 0
        time.sleep(1.0)
        check_sent(sent, tokenizer, payload, records)
    finally:
        followups.close()


def test_entries_of_a_dead_worker_process_are_adopted_and_queued_once(setup, tokenizer):
    client, campaign, _ = setup
    payload, records = turns(tokenizer, 2, "b")
    # A worker process on another host stored its next turns, then died (its liveness key is gone).
    entries = []
    for item, record in zip(payload.items, records):
        data = {
            "s": "render",
            "sampling": SAMPLING,
            "item": pack_item(msgspec.structs.replace(item, ids=[])),
            "out": pack_ids(record.output_ids),
            "finish": "stop",
            "matched": record.finish_matched,
        }
        entries.append(
            (item.key, FOLLOW, turn_key(item.conversation["key"], 1), msgpack.packb(data, use_bin_type=True))
        )
    added, stored = ConversationStore(campaign).commit(entries, owner="elsewhere|1|dead", tokens_in=1, tokens_out=1)
    assert added == 2 and len(stored) == 2

    sent: list[dict] = []
    adopter = FollowUps(redis_client=client, send=sent.append, render_processes=1, hungry=lambda: True)
    other: list[dict] = []
    rival = FollowUps(redis_client=client, send=other.append, render_processes=1, hungry=lambda: True)
    try:
        adopter.start()
        rival.start()  # two live processes sweep at once: each entry goes to one of them
        wait_for(
            lambda: len([i for m in sent + other for i in m["keys"]]) >= 2,
            timeout=180,
            what="the adopted next turns queued",
        )
        time.sleep(1.0)
        check_sent(sent + other, tokenizer, payload, records)
        assert ConversationStore(campaign).waiting() == 0
        assert not client.hlen(campaign.keys.followup_owners)
    finally:
        adopter.close()
        rival.close()
