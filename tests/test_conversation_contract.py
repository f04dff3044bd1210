"""The `--history own` contract and its pieces, on the real Qwen3.5 tokenizer: answers from
output ids, next-turn rendering, keys, row splitting, payload version 2, variants, the stored
tokenizer and its renderer, verify's gap check, export's conversation order, CLI errors."""

from __future__ import annotations

import json

import pytest

from eagle_synth.conversation import (
    END_COMPLETE,
    END_MAX_TURNS,
    END_PROMPT_TOO_LONG,
    END_TEMPLATE_ERROR,
    END_TRUNCATED,
    ConversationState,
    answer_message,
    conversation_key,
    next_turn,
    split_turns,
    turn_key,
)
from eagle_synth.errors import RowError, VariantsError
from eagle_synth.payload import PromptItem, TaskPayload, pack_item, unpack_item
from eagle_synth.records import Record, write_record_file
from eagle_synth.sampling import SamplingParams
from eagle_synth.variants import Variant, load_variants, pick_variant
from producer.rows import own_history_from_row
from tests.helpers import cli


@pytest.fixture(scope="module")
def ids(tokenizer):
    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return {
        "encode": encode,
        "close": tokenizer.convert_tokens_to_ids("</think>"),
        "open": tokenizer.convert_tokens_to_ids("<think>"),
        "eos": tokenizer.eos_token_id,
    }


def template(tokenizer, messages, **kwargs) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)["input_ids"])


# ---- answers ---------------------------------------------------------------------------------


def test_answer_splits_reasoning_at_think_end_and_drops_the_final_stop(tokenizer, ids):
    output = ids["encode"]("\n  Two and two.  \n") + [ids["close"]] + ids["encode"]("\n\nFour.\n") + [ids["eos"]]
    answer = answer_message(
        tokenizer, output, eos_token_ids=[ids["eos"]], matched=ids["eos"], think_close_id=ids["close"]
    )
    assert answer == {"role": "assistant", "content": "Four.", "reasoning_content": "Two and two."}


def test_answer_without_think_end_has_no_reasoning_and_keeps_no_special_token(tokenizer, ids):
    stop = ids["encode"]("STOP")[0]
    special = tokenizer.convert_tokens_to_ids("<|im_start|>")
    output = [special] + ids["encode"](" Just this. ") + [stop]
    answer = answer_message(tokenizer, output, eos_token_ids=[ids["eos"]], matched=stop, think_close_id=ids["close"])
    assert answer == {"role": "assistant", "content": "Just this."}
    # A final id that is neither EOS nor the matched stop stays (a stop string, a cut-off answer).
    kept = answer_message(
        tokenizer, ids["encode"]("Cut off mid"), eos_token_ids=[ids["eos"]], matched="xyz", think_close_id=ids["close"]
    )
    assert kept["content"] == "Cut off mid"


# ---- the next turn -------------------------------------------------------------------------


def test_next_turn_is_the_template_over_the_new_history(tokenizer, ids):
    system = {"role": "system", "content": "Be brief."}
    first, second = {"role": "user", "content": "Hi there."}, {"role": "user", "content": "And now?"}
    state = ConversationState(
        key="c" * 32, messages=[system, first], upcoming=[[second]], template_kwargs={"enable_thinking": True}
    )
    output = ids["encode"]("thinking") + [ids["close"]] + ids["encode"]("\n\nHello!") + [ids["eos"]]
    turn = next_turn(
        tokenizer,
        state,
        output,
        finish_reason="stop",
        matched=ids["eos"],
        eos_token_ids=[ids["eos"]],
        think_close_id=ids["close"],
    )
    history = [system, first, {"role": "assistant", "content": "Hello!", "reasoning_content": "thinking"}, second]
    assert turn.ids == template(tokenizer, history, enable_thinking=True)
    assert turn.state.messages == history and turn.state.upcoming == [] and turn.state.key == state.key
    # Qwen3.5's template drops reasoning of turns before the last user message.
    assert "thinking" not in tokenizer.decode(turn.ids)


def test_conversation_ends_for_its_reasons(tokenizer, ids):
    user = {"role": "user", "content": "Hi."}
    output = ids["encode"]("Hello") + [ids["eos"]]
    common = {"matched": ids["eos"], "eos_token_ids": [ids["eos"]], "think_close_id": ids["close"]}
    state = ConversationState(key="k", messages=[user], upcoming=[[user]])
    assert next_turn(tokenizer, state, output, finish_reason="length", **common).end == END_TRUNCATED
    assert (
        next_turn(tokenizer, ConversationState(key="k", messages=[user]), output, finish_reason="stop", **common).end
        == END_COMPLETE
    )
    assert (
        next_turn(
            tokenizer, ConversationState(key="k", messages=[user], cut=True), output, finish_reason="stop", **common
        ).end
        == END_MAX_TURNS
    )
    too_long = next_turn(tokenizer, state, output, finish_reason="stop", max_prompt_tokens=10, **common)
    assert too_long.end == END_PROMPT_TOO_LONG and "--max-prompt-tokens 10" in too_long.message
    late_system = ConversationState(key="k", messages=[user], upcoming=[[{"role": "system", "content": "x"}, user]])
    rejected = next_turn(tokenizer, late_system, output, finish_reason="stop", **common)
    assert rejected.end == END_TEMPLATE_ERROR and "System message must be at the beginning" in rejected.message


# ---- rows and keys -------------------------------------------------------------------------


def test_own_history_rows_keep_system_and_user_turns_only():
    row = {
        "id": "r",
        "system": "Sys.",
        "conversations": [
            {"from": "human", "value": "one"},
            {"from": "gpt", "value": "old"},
            {"from": "human", "value": "two"},
            {"from": "gpt", "value": "old"},
            {"from": "human", "value": "three"},
        ],
    }
    own = own_history_from_row(row, source="f.jsonl", line=1)
    assert own.turns == [
        [{"role": "system", "content": "Sys."}, {"role": "user", "content": "one"}],
        [{"role": "user", "content": "two"}],
        [{"role": "user", "content": "three"}],
    ]
    assert own.tools is None and own.steps is None and not own.cut
    # A tool result answering no call cannot be replayed on the model's own calls.
    orphan = {**row, "conversations": [*row["conversations"][:2], {"from": "function_response", "value": "x"}]}
    orphan["conversations"].append({"from": "human", "value": "two"})
    with pytest.raises(RowError) as refused:
        own_history_from_row(orphan, source="f.jsonl", line=1)
    assert refused.value.reason == "unpaired-tool-results" and refused.value.field == "conversations[2].value"
    capped = own_history_from_row(row, source="f.jsonl", line=1, max_turns=2)
    assert len(capped.turns) == 2 and capped.cut
    with pytest.raises(RowError) as error:
        own_history_from_row(
            {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": " "}]}, source="f.jsonl", line=2
        )
    assert error.value.field == "messages[1].content"
    turns, steps, points = split_turns([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    assert turns == [[{"role": "user", "content": "a"}]] and points == [0]
    assert steps == [{"calls": [], "results": []}]  # the dataset answered in words


def test_keys_are_stable_and_tell_samples_and_turns_apart():
    turns = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    key = conversation_key(turns=turns, tools=None, sample=0)
    assert key == conversation_key(turns=json.loads(json.dumps(turns)), tools=None, sample=0) and len(key) == 32
    assert key != conversation_key(turns=turns, tools=None, sample=1)
    assert key != conversation_key(turns=turns[:1], tools=None, sample=0)
    assert (
        len({turn_key(key, 0), turn_key(key, 1), turn_key(conversation_key(turns=turns, tools=None, sample=1), 0)}) == 3
    )


# ---- payload version 2 ---------------------------------------------------------------------


def test_payload_is_version_1_unless_an_item_needs_version_2():
    plain = PromptItem(key="a" * 32, row_id="r", sample=0, ids=[1, 2, 3], seed=5, source="f:1")
    assert TaskPayload(campaign="c", batch="b", sampling={"temperature": 0.6}, items=[plain]).encode()["v"] == 1
    state = ConversationState(
        key="k", messages=[{"role": "user", "content": "é"}], upcoming=[[{"role": "user", "content": "x"}]]
    )
    rich = PromptItem(
        key="b" * 32,
        row_id="r",
        sample=1,
        ids=[4, 5],
        turn=2,
        conversation=state.to_dict(),
        sampling_overrides={"temperature": 1.0},
        variant="hot",
    )
    encoded = TaskPayload(campaign="c", batch="b", sampling={"temperature": 0.6}, items=[plain, rich]).encode()
    assert encoded["v"] == 2
    decoded = TaskPayload.decode(encoded)
    assert decoded.items == [plain, rich]
    assert unpack_item(pack_item(rich)) == rich and unpack_item(pack_item(plain)[:7]) == plain
    assert PromptItem(**json.loads(json.dumps(rich.to_replay()))) == rich


# ---- variants ------------------------------------------------------------------------------


def test_variants_file_errors_name_the_entry_and_field(tmp_path):
    base = SamplingParams()
    path = tmp_path / "v.json"
    cases = [
        ("[]", "expected a non-empty JSON list"),
        ('[{"weight": 0}]', "entry 0.weight: expected a number > 0"),
        ('[{"weight": 1}, {"weight": 1, "sampling": {"n": 2}}]', "entry 1.sampling: cannot override ['n']"),
        ('[{"weight": 1, "sampling": {"temperature": -1}}]', "entry 0.sampling: --temperature -1"),
        ('[{"weight": 1, "colour": "red"}]', "entry 0: unknown field(s) ['colour']"),
        ('[{"weight": 1, "name": "a"}, {"weight": 1, "name": "a"}]', "names must differ"),
        ("{", "not valid JSON"),
    ]
    for text, message in cases:
        path.write_text(text)
        with pytest.raises(VariantsError) as error:
            load_variants(path, base=base)
        assert message in str(error.value) and str(path) in str(error.value), (text, str(error.value))


def test_variants_are_picked_stably_by_weight():
    variants = [Variant(name="a", weight=3.0), Variant(name="b", weight=1.0, sampling={"temperature": 1.0})]
    picks = [pick_variant(variants, f"conversation-{i}").name for i in range(4000)]
    assert picks == [pick_variant(variants, f"conversation-{i}").name for i in range(4000)]
    assert 0.70 < picks.count("a") / len(picks) < 0.80
    assert variants[1].server_overrides(SamplingParams(temperature=0.6)) == {"temperature": 1.0}
    assert pick_variant([], "x") is None


def test_dataset_history_variants_set_template_kwargs_sampling_and_keys(tokenizer, tokenizer_path):
    from dataclasses import replace

    from producer.options import EnqueueOptions
    from producer.planner import PromptPlanner
    from producer.tokenize import TemplateJob, TemplatingPool

    base = SamplingParams(temperature=0.6)
    cold = Variant(
        name="cold", weight=1.0, sampling={"temperature": 0.2}, chat_template_kwargs={"enable_thinking": False}
    )
    options = EnqueueOptions(inputs=[], campaign="c", tokenizer=str(tokenizer_path), sampling=base, turns="all")
    planner = PromptPlanner(replace(options, variants=(cold,)))
    plain = PromptPlanner(options)
    row = {
        "id": "r",
        "messages": [
            {"role": "user", "content": "a?"},
            {"role": "assistant", "content": "b."},
            {"role": "user", "content": "c?"},
        ],
    }
    prompts = planner.plan(row, source="f.jsonl", line=1)
    assert [p.turn for p in prompts] == [0, 1] and all(p.template_kwargs == {"enable_thinking": False} for p in prompts)
    pool = TemplatingPool(TemplateJob(tokenizer=str(tokenizer_path)), processes=1, tokenizer=tokenizer)
    [(_, rendered)] = list(pool.map([(None, [p.template_input() for p in prompts])]))
    assert rendered == [template(tokenizer, p.messages, enable_thinking=False) for p in prompts]
    [item] = planner.items(prompts[1], rendered[1], where="f.jsonl:1")
    assert item.variant == "cold" and item.sampling_overrides == {"temperature": 0.2} and item.conversation is None
    [plain_item] = plain.items(plain.plan(row, source="f.jsonl", line=1)[1], rendered[1], where="f.jsonl:1")
    assert plain_item.variant is None and plain_item.sampling_overrides is None
    assert plain_item.key != item.key, "the variant's sampling is part of the key"


# ---- stored tokenizer and renderer ---------------------------------------------------------


def test_stored_tokenizer_renders_as_the_original_and_a_wrong_one_is_refused(
    tmp_path, monkeypatch, redis_server, tokenizer, ids
):
    from eagle_synth.errors import RendererMismatch, TokenizerUnavailable
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.redis_client import connect
    from eagle_synth.state.tokenizer_store import fetch_tokenizer, store_tokenizer
    from eagle_synth.templating import tokenizer_facts
    from workers.renderer import Renderer

    monkeypatch.setenv("EAGLE_SYNTH_CACHE_DIR", str(tmp_path))
    client = connect(broker_settings(redis_url=redis_server.url))
    facts = tokenizer_facts(tokenizer)
    with pytest.raises(TokenizerUnavailable, match="run the same `eagle-synth enqueue"):
        fetch_tokenizer(client, fingerprint=facts.fingerprint, chat_template_hash=facts.chat_template_hash)
    store_tokenizer(client, tokenizer, fingerprint=facts.fingerprint, chat_template_hash=facts.chat_template_hash)
    folder = fetch_tokenizer(client, fingerprint=facts.fingerprint, chat_template_hash=facts.chat_template_hash)
    renderer = Renderer(
        folder=folder, processes=1, fingerprint=facts.fingerprint, chat_template_hash=facts.chat_template_hash
    )
    try:
        state = ConversationState(
            key="k", messages=[{"role": "user", "content": "Hi."}], upcoming=[[{"role": "user", "content": "More."}]]
        )
        output = ids["encode"]("hmm") + [ids["close"]] + ids["encode"]("Hello.") + [ids["eos"]]
        job = {
            "state": state.to_dict(),
            "output_ids": output,
            "finish_reason": "stop",
            "matched": ids["eos"],
            "eos_token_ids": [ids["eos"]],
            "think_close_id": ids["close"],
            "max_prompt_tokens": None,
        }
        [turn] = renderer.submit([job]).result(timeout=120)
        expected = next_turn(
            tokenizer,
            state,
            output,
            finish_reason="stop",
            matched=ids["eos"],
            eos_token_ids=[ids["eos"]],
            think_close_id=ids["close"],
        )
        assert expected.state is not None and turn.state is not None
        assert turn.end is None and turn.ids == expected.ids and turn.state.to_dict() == expected.state.to_dict()
    finally:
        renderer.close()
    with pytest.raises(RendererMismatch, match="refusing to render"):
        Renderer(folder=folder, processes=1, fingerprint="0" * 16, chat_template_hash=facts.chat_template_hash)


# ---- verify and export ---------------------------------------------------------------------


def _record(key: str, conversation: str, turn: int) -> Record:
    return Record(
        key=key,
        id="r",
        sample=0,
        turn=turn,
        prompt_ids=[1, 2, turn],
        output_ids=[3, 4],
        finish_reason="stop",
        finish_matched=4,
        prompt_tokens=3,
        completion_tokens=2,
        conversation=conversation,
    )


def test_verify_reports_a_conversation_with_a_missing_turn(tmp_path):
    from eagle_synth.records import write_manifest
    from eagle_synth.tools.verify import verify_campaign

    folder = tmp_path / "camp"
    write_record_file(
        folder,
        campaign="camp",
        batch="aa",
        records=[
            _record("a0", "a" * 32, 0),
            _record("a1", "a" * 32, 1),
            _record("b0", "b" * 32, 0),
            _record("b2", "b" * 32, 2),
        ],
    )
    write_record_file(folder, campaign="camp", batch="bb", records=[_record("plain", None, 3)])
    write_manifest(folder, {"settings": {"vocab_size": 100, "eos_token_ids": [4]}})
    report = verify_campaign(folder)
    gap = report["checks"]["conversation_gap"]
    assert not report["ok"] and gap["count"] == 1 and gap["examples"] == [f"{'b' * 32}: turns [0, 2]"]
    assert report["conversations"] == {"count": 2, "turns": 4, "longest": 3}


def test_export_orders_conversations_across_buckets_and_keeps_last_turns(tmp_path, monkeypatch):
    from eagle_synth.records import write_manifest
    from eagle_synth.tools import conversation_order
    from eagle_synth.tools.export import export_records

    folder = tmp_path / "camp"
    write_manifest(folder, {"settings": {"history": "own"}})
    conversations = [f"{i:x}" * 32 for i in range(1, 7)]
    # Turns land in files far apart and out of order, as they do in a campaign.
    for turn in (2, 0, 1):
        write_record_file(
            folder,
            campaign="camp",
            batch=f"b{turn}",
            records=[
                _record(f"{c[:4]}-{turn}", c[:32], turn) for c in conversations if turn < 2 or c.startswith(("1", "4"))
            ],
        )
    write_record_file(folder, campaign="camp", batch="plain", records=[_record("plain", None, 0)])
    monkeypatch.setattr(conversation_order, "BUCKET_BYTES", 1)  # one bucket per stored byte: many buckets
    out = tmp_path / "all.jsonl"
    export_records(folder, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["key"] == "plain"
    ordered = [(row["key"].split("-")[0], row["turn"]) for row in rows[1:]]
    assert len(ordered) == 14
    for name in {k for k, _ in ordered}:  # each conversation's turns together and in order
        positions = [i for i, (k, _) in enumerate(ordered) if k == name]
        assert positions == list(range(positions[0], positions[-1] + 1))
        assert [ordered[i][1] for i in positions] == list(range(len(positions)))
    last = tmp_path / "last.jsonl"
    result = export_records(folder, last, turns="last")
    kept = {json.loads(line)["key"] for line in last.read_text().splitlines()}
    assert kept == {"plain"} | {f"{c[:4]}-{2 if c.startswith(('1', '4')) else 1}" for c in conversations}
    assert result.stats.dropped == {"earlier_turn": 8}


# ---- CLI -----------------------------------------------------------------------------------


def test_enqueue_flags_for_conversations_fail_in_one_line(tmp_path, tokenizer_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    variants = tmp_path / "variants.json"
    variants.write_text('[{"weight": 1, "sampling": {"top_p": 0}}]')
    base = ["enqueue", str(rows), "--campaign", "c", "--tokenizer", str(tokenizer_path), "--dry-run"]
    for extra, message in [
        (["--max-turns", "2"], "--max-turns needs --history own"),
        (["--history", "mine"], "--history must be 'dataset' or 'own'"),
        (
            ["--history", "own", "--trust-remote-code", "--chat-template", str(rows)],
            "put the template in that folder as chat_template.jinja",
        ),
        (["--variants", str(variants)], f"--variants {variants}: entry 0.sampling: --top-p 0"),
    ]:
        result = cli(*base, *extra, check=False)
        stderr = result.stderr.decode()
        assert result.returncode == 2 and message in stderr and "Traceback" not in stderr, stderr
    dry = cli(*base, "--history", "own", "--variants", str(tmp_path / "missing.json"), check=False)
    assert dry.returncode == 2 and "cannot read it" in dry.stderr.decode()


# ---- rows with tools -----------------------------------------------------------------------

LOOKUP = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}},
}


def tool_row(results: int = 1) -> dict:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": {"word": "w"}}} for i in (0, 1)
    ]
    return {
        "id": "t",
        "tools": [LOOKUP],
        "messages": [
            {"role": "user", "content": "Look up two words."},
            {"role": "assistant", "content": "", "tool_calls": calls},
            *[{"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i}"} for i in range(results)],
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Thanks."},
        ],
    }


def test_tool_rows_become_a_turn_per_point_with_the_datasets_steps():
    own = own_history_from_row(tool_row(results=2), source="f.jsonl", line=1)
    assert own.turns == [
        [{"role": "user", "content": "Look up two words."}],
        [],
        [{"role": "user", "content": "Thanks."}],
    ]
    assert [len(step["calls"]) for step in own.steps] == [2, 0, 0]
    assert [r["content"] for r in own.steps[0]["results"]] == ["result 0", "result 1"]
    capped = own_history_from_row(tool_row(results=2), source="f.jsonl", line=1, max_turns=2)
    assert capped.cut and len(capped.turns) == len(capped.steps) == 2
    # The dataset's results are part of what the prompts carry, so of the conversation's key.
    other = tool_row(results=2)
    other["messages"][3]["content"] = "another result"
    other_steps = own_history_from_row(other, source="f.jsonl", line=1).steps
    assert conversation_key(turns=own.turns, tools=own.tools, sample=0, steps=own.steps) != conversation_key(
        turns=own.turns, tools=own.tools, sample=0, steps=other_steps
    )


def test_tool_rows_that_cannot_be_replayed_are_refused_naming_the_field():
    with pytest.raises(RowError) as unpaired:
        own_history_from_row(tool_row(results=1), source="f.jsonl", line=1)
    assert unpaired.value.reason == "unpaired-tool-results" and unpaired.value.field == "messages[1].tool_calls"
    assert "2 tool call(s) answered by 1 tool result(s)" in str(unpaired.value)
    with pytest.raises(RowError) as no_format:
        own_history_from_row(tool_row(results=2), source="f.jsonl", line=1, no_tool_format="pass --tool-format")
    assert no_format.value.reason == "no-tool-format" and no_format.value.field == "tools"


def tool_state(results: list[dict], calls: list[dict]) -> ConversationState:
    user = {"role": "user", "content": "Look it up."}
    return ConversationState(
        key="k",
        messages=[user],
        upcoming=[[], [{"role": "user", "content": "Thanks."}]],
        tools=[LOOKUP],
        steps=[{"calls": calls, "results": results}, {"calls": [], "results": []}, {"calls": [], "results": []}],
    )


def test_next_turn_pairs_the_models_call_with_the_datasets_result_or_ends(tokenizer, ids):
    dataset_call = {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": {"word": "w"}}}
    result = {"role": "tool", "tool_call_id": "c0", "content": "result 0"}
    state = tool_state([result], [dataset_call])
    written = "<tool_call>\n<function=lookup>\n<parameter=word>\nriver\n</parameter>\n</function>\n</tool_call>"
    output = ids["encode"]("hm") + [ids["close"]] + ids["encode"]("\n\nLet me check.\n\n" + written) + [ids["eos"]]
    common = {
        "finish_reason": "stop",
        "matched": ids["eos"],
        "eos_token_ids": [ids["eos"]],
        "think_close_id": ids["close"],
    }
    turn = next_turn(tokenizer, state, output, tool_format="qwen3_coder", **common)
    assistant = {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "hm",
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": {"word": "river"}}}
        ],
    }
    assert turn.state.messages == [state.messages[0], assistant, result]
    assert turn.ids == template(tokenizer, turn.state.messages, tools=[LOOKUP])
    assert turn.state.steps == state.steps[1:] and turn.state.upcoming == state.upcoming[1:]
    # The same answer read as Hermes JSON does not parse; a call where the dataset answered in
    # words, or words where it called, depart from the dataset.
    assert next_turn(tokenizer, state, output, tool_format="hermes", **common).end == "tool-call-unparsed"
    in_words = tool_state([], [])
    departed = next_turn(tokenizer, in_words, output, tool_format="qwen3_coder", **common)
    assert departed.end == "tool-call-mismatch" and "where the dataset answered without tools" in departed.message
    words = ids["encode"]("Just words.") + [ids["eos"]]
    assert next_turn(tokenizer, state, words, tool_format="qwen3_coder", **common).end == "tool-call-mismatch"
    # Words where the dataset answered in words: the plain contract's answer (no reasoning here).
    plain = next_turn(tokenizer, in_words, words, tool_format="qwen3_coder", **common)
    assert plain.state.messages[1] == {"role": "assistant", "content": "Just words."}
