"""Every sampling value is sent explicitly; every sample gets its own stable seed; prompt keys
do not change."""

from __future__ import annotations

import time

from eagle_synth.ids import pack_ids
from eagle_synth.payload import prompt_key
from eagle_synth.sampling import (
    MAX_SEED,
    SENT_SAMPLING_KEYS,
    SGLANG_SAMPLING_KEYS,
    SamplingParams,
)
from eagle_synth.settings import broker_settings
from tests.conftest import chat_rows, write_jsonl
from tests.helpers import assert_exactly_once, queued_items, wait_finished

IDS = pack_ids([11, 22, 33, 44])


def key_of(sampling: SamplingParams, sample: int) -> str:
    """The prompt key as producer/enqueue.py computes it."""
    key_sampling = {k: v for k, v in sampling.to_dict().items() if k != "n"}
    return prompt_key(prompt_ids=IDS, sampling=key_sampling, sample=sample)


def test_every_value_sglang_would_fill_in_is_sent():
    params = SamplingParams(stop_token_ids=(5, 6)).for_server()
    assert set(params) | {"sampling_seed"} == SENT_SAMPLING_KEYS
    assert set(params) <= SGLANG_SAMPLING_KEYS  # nothing SGLang would refuse
    assert params["stop_token_ids"] == [5, 6] and params["stop"] == []
    assert (params["frequency_penalty"], params["presence_penalty"], params["min_new_tokens"]) == (0.0, 0.0, 0)
    assert (params["ignore_eos"], params["no_stop_trim"], params["n"]) == (False, False, 1)
    assert params["skip_special_tokens"] is False and params["spaces_between_special_tokens"] is True
    # What is left out is only what has no neutral value worth sending (grammars, biases...).
    assert {
        "stop_regex",
        "json_schema",
        "regex",
        "ebnf",
        "logit_bias",
        "custom_params",
    } == SGLANG_SAMPLING_KEYS - SENT_SAMPLING_KEYS
    params["stop"].append("x")  # each call builds its own lists
    assert SamplingParams().for_server()["stop"] == []


def test_prompt_keys_are_those_of_earlier_versions():
    # Pinned from the code before every value was sent: keys come from to_dict(), unchanged.
    assert [key_of(SamplingParams(), s) for s in range(2)] == [
        "0af83ff93b5bc8312c8a69b23dbc6d86",
        "e590bfbfd3f878286549075116ba7f25",
    ]
    seeded = SamplingParams(n=3, seed=7, temperature=0.8, stop_token_ids=(5,))
    assert [key_of(seeded, s) for s in range(2)] == [
        "28c37211a48dc7ae3a03f919094eaa6d",
        "646faeeb00b07da921176910e4abcbf2",
    ]


def test_with_seed_the_sample_seeds_are_those_of_earlier_versions():
    seeded = SamplingParams(n=3, seed=7, temperature=0.8, stop_token_ids=(5,))
    seeds = [seeded.sample_seed(prompt_key_material=IDS, sample=s, prompt_key=key_of(seeded, s)) for s in range(2)]
    assert seeds == [926204012, 234330804]


def test_without_seed_each_sample_still_gets_a_distinct_stable_seed():
    sampling = SamplingParams(n=8, temperature=0.8)
    seeds = [sampling.sample_seed(prompt_key_material=IDS, sample=s, prompt_key=key_of(sampling, s)) for s in range(8)]
    assert len(set(seeds)) == 8 and all(0 <= s <= MAX_SEED for s in seeds)
    again = [sampling.sample_seed(prompt_key_material=IDS, sample=s, prompt_key=key_of(sampling, s)) for s in range(8)]
    assert again == seeds
    other_prompt = prompt_key(prompt_ids=pack_ids([11, 22, 33]), sampling={}, sample=0)
    assert sampling.sample_seed(prompt_key_material=b"", sample=0, prompt_key=other_prompt) not in seeds


def test_enqueue_gives_every_sample_its_own_seed(tmp_path, redis_server, tokenizer_path):
    from producer.enqueue import EnqueueOptions, enqueue

    path = write_jsonl(tmp_path / "rows.jsonl", chat_rows(3))
    enqueue(
        EnqueueOptions(
            inputs=[str(path)],
            campaign="seeds",
            tokenizer=str(tokenizer_path),
            processes=1,
            sampling=SamplingParams(max_new_tokens=16, temperature=0.8, n=3),
        ),
        broker=broker_settings(redis_url=redis_server.url),
    )
    items = queued_items(redis_server.url)
    assert len(items) == 9
    assert all(item.seed is not None for item in items)
    assert len({item.seed for item in items}) == 9


def test_n_samples_without_seed_differ_end_to_end(tmp_path, redis_server, stack, tokenizer_path):
    """K samples of one prompt without --seed: before every sample had its own seed, a server
    giving unseeded requests one default seed (SGLang's deterministic mode; the devserver)
    returned K identical samples."""
    from producer.enqueue import EnqueueOptions, enqueue

    path = write_jsonl(tmp_path / "rows.jsonl", chat_rows(2))
    enqueue(
        EnqueueOptions(
            inputs=[str(path)],
            campaign="nsamples",
            tokenizer=str(tokenizer_path),
            processes=1,
            sampling=SamplingParams(max_new_tokens=24, temperature=0.8, n=3),
        ),
        broker=broker_settings(redis_url=redis_server.url),
    )
    _, url = stack.devserver("--enable-deterministic-inference")
    stack.worker(servers=[url], out=tmp_path / "out", redis_url=redis_server.url)
    started = time.monotonic()
    wait_finished(redis_server.url, "nsamples", expected=6, stack=stack)
    records = assert_exactly_once(redis_server.url, "nsamples", tmp_path / "out" / "nsamples", expected=6)
    by_row: dict = {}
    for record in records.values():
        assert record.sampling["sampling_seed"] is not None
        assert record.sampling["frequency_penalty"] == 0.0  # every value sent, and recorded
        by_row.setdefault(record.id, []).append(tuple(record.output_ids))
    assert all(len(set(samples)) == 3 for samples in by_row.values()), "samples of one prompt are identical"
    assert time.monotonic() - started < 120
