"""The campaign key sets' layout 2: a done key is in `done` only, pending and failed keys in
`enqueued`; every move keeps each key in exactly one, and a campaign of the old layout (done
keys in both sets) is moved over once, its counts exact before and after."""

from __future__ import annotations

from eagle_synth.payload import PromptItem
from eagle_synth.state.campaign import LAYOUT, Campaign, CampaignSettings, Failure
from tests.helpers import campaign

KEYS = [f"{i:032x}" for i in range(6)]


def _settings(name: str) -> CampaignSettings:
    return CampaignSettings(name=name, tokenizer_path="/tok", tokenizer_fingerprint="f", chat_template_hash="h")


def _members(c: Campaign, key: str) -> set[str]:
    return {k.decode() for k in c.client.smembers(key)}


def test_every_move_keeps_a_key_in_exactly_one_set(redis_server):
    c = campaign(redis_server.url, "layout")
    c.register(_settings("layout"))
    assert c.client.get(c.keys.layout) == LAYOUT.encode()
    items = [PromptItem(key=k, row_id=k, sample=0, ids=[1, 2], seed=None, source="in:1") for k in KEYS]
    assert c.outbox.claim("run:1", items) == [True] * 6
    assert c.mark_done(KEYS[:4], tokens_in=4, tokens_out=4) == 4
    assert _members(c, c.keys.enqueued) == set(KEYS[4:]) and _members(c, c.keys.done) == set(KEYS[:4])
    # A done key is never claimed again, though it left `enqueued`.
    assert c.outbox.claim("run:2", items) == [False] * 6
    assert c.was_enqueued([*KEYS, "f" * 32]) == [True] * 6 + [False]
    assert c.undo_done(KEYS[:1]) == 1
    failure = Failure(reason="record-damaged", message="m", item=items[1].to_replay(), sampling={}, at=0.0)
    assert c.fail_done([(KEYS[1], failure)]) == 1
    assert _members(c, c.keys.enqueued) == {KEYS[0], KEYS[1], *KEYS[4:]}
    assert _members(c, c.keys.done) == set(KEYS[2:4])
    progress = c.progress()
    assert (progress.enqueued, progress.done, progress.failed, progress.pending) == (6, 2, 1, 3)


def test_a_campaign_of_the_old_layout_is_moved_over_once(redis_server):
    c = campaign(redis_server.url, "old-layout")
    c.client.set(c.keys.settings, _settings("old-layout").to_json())
    c.client.sadd(c.keys.enqueued, *KEYS)
    c.client.sadd(c.keys.done, *KEYS[:4])
    progress = c.progress()
    assert (progress.enqueued, progress.done, progress.pending) == (6, 4, 2)
    assert _members(c, c.keys.enqueued) == set(KEYS[4:])
    assert c.client.get(c.keys.layout) == LAYOUT.encode()
    assert c.progress().enqueued == 6  # once moved, counted the same
    assert c.was_enqueued(KEYS) == [True] * 6
