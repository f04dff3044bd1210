"""workers/replies.py: every malformed /generate reply item is refused before it can be a record."""

from __future__ import annotations

import copy

import pytest

from eagle_synth.devserver.faults import MALFORMED_SHAPES, malform
from eagle_synth.errors import BadResponse, PromptMismatch, ReplyAborted, TransientError
from eagle_synth.payload import PromptItem
from eagle_synth.records import Record
from eagle_synth.sampling import ServerSampling
from workers.replies import Sent, parse_generate_item

VOCAB = 1000
PROMPT_LEN = 12


def good_item(**meta) -> dict:
    """A reply item as SGLang 0.5.x sends it (with fields we ignore)."""
    return {
        "text": "hello",
        "output_ids": [5, 6, 7, 2],
        "meta_info": {
            "id": "abc",
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": PROMPT_LEN,
            "completion_tokens": 4,
            "cached_tokens": 3,
            "e2e_latency": 0.25,
            "weight_version": "default",
            **meta,
        },
    }


# The ids sent: a prompt ending in 9, 9, 9 (what the old-SGLang prefix repair checks against).
PROMPT_IDS = [1] * (PROMPT_LEN - 3) + [9, 9, 9]


# The prompt sent, and where: what a record takes from outside the reply.
SENT = Sent(
    PromptItem(key="k" * 32, row_id="row-1", sample=1, ids=PROMPT_IDS, seed=7, source="in.jsonl:3", turn=0),
    campaign="c",
    sampling=ServerSampling({"max_new_tokens": 4, "sampling_seed": 7}),
    server="http://s",
    worker="w@h",
    backend="sglang",
)


def parse(item, *, vocab_size=VOCAB) -> Record:
    return parse_generate_item(item, vocab_size=vocab_size, sent=SENT)


def test_a_good_item_becomes_every_record_field():
    got = parse(good_item())
    reply_fields = (got.output_ids, got.finish_reason, got.finish_matched, got.prompt_tokens, got.completion_tokens)
    assert reply_fields == ([5, 6, 7, 2], "stop", 2, PROMPT_LEN, 4)
    assert (got.cached_tokens, got.e2e_latency, got.repaired_prefix) == (3, 0.25, 0)
    sent_fields = (got.key, got.id, got.sample, got.turn, got.prompt_ids, got.source, got.campaign, got.sampling)
    assert sent_fields == ("k" * 32, "row-1", 1, 0, PROMPT_IDS, "in.jsonl:3", "c", SENT.sampling.as_map())
    assert (got.server, got.worker, got.backend, got.conversation, got.variant) == (
        "http://s",
        "w@h",
        "sglang",
        None,
        None,
    )


@pytest.mark.parametrize(
    ("finish", "kind", "matched"),
    [
        ({"type": "length", "length": 4}, "length", None),
        ({"type": "stop", "matched": "</answer>"}, "stop", "</answer>"),
        ({"type": "stop", "matched": None}, "stop", None),
        ({"type": "stop"}, "stop", None),
        ("length", "length", None),  # very old SGLang: the bare type
    ],
)
def test_finish_reason_shapes_sglang_sends(finish, kind, matched):
    got = parse(good_item(finish_reason=finish))
    assert (got.finish_reason, got.finish_matched) == (kind, matched)


def test_optional_meta_fields_may_be_missing():
    item = good_item()
    for key in ("prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency", "id"):
        del item["meta_info"][key]
    got = parse(item)
    assert (got.prompt_tokens, got.completion_tokens, got.cached_tokens, got.e2e_latency) == (PROMPT_LEN, 4, 0, None)


def test_informational_fields_of_odd_type_do_not_cost_the_record():
    got = parse(good_item(cached_tokens="3", e2e_latency="slow"))
    assert (got.cached_tokens, got.e2e_latency) == (0, None)


def test_old_sglang_prompt_tail_prefix_is_repaired():
    item = good_item(completion_tokens=2)
    item["output_ids"] = [9, 9, 9, 7, 2]
    got = parse(item)
    assert got.output_ids == [7, 2]
    assert (got.completion_tokens, got.repaired_prefix) == (2, 3)


def test_empty_generation_is_allowed_when_the_counts_agree():
    item = good_item(completion_tokens=0, finish_reason={"type": "length", "length": 0})
    item["output_ids"] = []
    assert parse(item).output_ids == []


def test_ids_at_the_vocabulary_edges():
    # A `length` ending: a `stop` on token 2 would have to end with 2.
    item = good_item(completion_tokens=2, finish_reason={"type": "length", "length": 2})
    item["output_ids"] = [0, VOCAB - 1]
    assert parse(item).output_ids == [0, VOCAB - 1]


def test_abort_is_reported_without_looking_at_the_ids():
    item = good_item(finish_reason={"type": "abort", "message": "Abort in waiting queue"})
    item["output_ids"] = ["whatever"]
    with pytest.raises(ReplyAborted):
        parse(item)


MALFORMED = [
    ("a list of ints instead of an object", [5, 6, 7], "not an object"),
    ("a string", "oops", "not an object"),
    ("None", None, "not an object"),
    ("no meta_info", {"output_ids": [1]}, "no meta_info"),
    ("meta_info a string", {**good_item(), "meta_info": "{'id': 'x'}"}, "meta_info is a str"),
    ("meta_info a list", {**good_item(), "meta_info": []}, "meta_info is a list"),
    ("no output_ids", {"meta_info": good_item()["meta_info"]}, "no output_ids"),
    ("output_ids null", {**good_item(), "output_ids": None}, "not a list"),
    ("output_ids a string", {**good_item(), "output_ids": "5 6 7 2"}, "not a list"),
    ("output_ids an object", {**good_item(), "output_ids": {"0": 5}}, "not a list"),
    ("ids as strings", {**good_item(), "output_ids": ["5", "6", "7", "2"]}, "output_ids[0] is not an int"),
    ("a float id", {**good_item(), "output_ids": [5, 6.0, 7, 2]}, "output_ids[1] is not an int"),
    ("a bool id", {**good_item(), "output_ids": [5, 6, True, 2]}, "output_ids[2] is not an int"),
    ("a nested list", {**good_item(), "output_ids": [5, [6], 7, 2]}, "output_ids[1] is not an int"),
    ("a negative id", {**good_item(), "output_ids": [5, -1, 7, 2]}, "output_ids[1] = -1 is outside"),
    ("an id = vocab size", {**good_item(), "output_ids": [5, 6, 7, VOCAB]}, f"output_ids[3] = {VOCAB} is outside"),
    ("a huge id", {**good_item(), "output_ids": [10**12, 6, 7, 2]}, "output_ids[0]"),
    ("no finish_reason", good_item(finish_reason=None), "no finish_reason"),
    ("finish_reason a list", good_item(finish_reason=["stop"]), "finish_reason is a list"),
    ("finish_reason an int", good_item(finish_reason=1), "finish_reason is an int"),
    ("unknown finish type", good_item(finish_reason={"type": "exploded"}), "unknown type 'exploded'"),
    ("finish type missing", good_item(finish_reason={"matched": 2}), "unknown type None"),
    ("matched a list", good_item(finish_reason={"type": "stop", "matched": [2]}), "matched is neither"),
    ("matched a bool", good_item(finish_reason={"type": "stop", "matched": True}), "matched is neither"),
    ("completion_tokens a string", good_item(completion_tokens="4"), "completion_tokens is not"),
    ("completion_tokens negative", good_item(completion_tokens=-1), "completion_tokens is not"),
    ("fewer ids than completion_tokens", good_item(completion_tokens=9), "4 ids but completion_tokens says 9"),
    ("prompt_tokens a string", good_item(prompt_tokens="12"), "prompt_tokens is not"),
    ("prompt_tokens a bool", good_item(prompt_tokens=True), "prompt_tokens is not"),
]


@pytest.mark.parametrize(("what", "item", "says"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_every_malformed_shape_is_a_transient_bad_response(what, item, says):
    with pytest.raises(BadResponse) as caught:
        parse(copy.deepcopy(item))
    assert isinstance(caught.value, TransientError)  # retried, then recorded as bad-response
    assert says in str(caught.value)


@pytest.mark.parametrize("shape", MALFORMED_SHAPES)
def test_each_devserver_malformed_shape_is_refused(shape):
    with pytest.raises(BadResponse):
        parse(malform(good_item(), shape))


def test_a_prompt_the_server_cut_is_a_prompt_mismatch_not_a_retry():
    with pytest.raises(PromptMismatch) as caught:
        parse(good_item(prompt_tokens=PROMPT_LEN - 5))
    assert not isinstance(caught.value, TransientError)
    assert f"a prompt of {PROMPT_LEN - 5} tokens for the {PROMPT_LEN} sent" in str(caught.value)
    assert "--allow-auto-truncate" in str(caught.value)


def test_the_item_is_not_modified():
    item = good_item(completion_tokens=2)
    item["output_ids"] = [9, 9, 7, 2]
    before = copy.deepcopy(item)
    parse(item)
    assert item == before


def test_a_surplus_that_is_not_the_prompts_tail_is_a_bad_response_not_a_repair():
    item = good_item(completion_tokens=1)
    item["output_ids"] = [5, 6, 7, 2]  # completion_tokens under-reported: the ids are real output
    with pytest.raises(BadResponse, match="not the prompt's tail"):
        parse(item)
    item = good_item(completion_tokens=0)
    with pytest.raises(BadResponse):
        parse(item)


def test_a_stop_on_a_token_id_must_end_with_that_id():
    item = good_item(completion_tokens=3)
    item["output_ids"] = [5, 6, 7]  # "stopped on 2", yet 2 is not there
    with pytest.raises(BadResponse, match="does not end with it"):
        parse(item)
