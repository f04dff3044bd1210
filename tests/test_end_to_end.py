"""The whole path for real: producer -> Redis -> Celery worker -> server -> records -> export,
against each kind of server (SGLang's /generate, vLLM's /v1/completions)."""

from __future__ import annotations

import json

import requests

from tests.conftest import chat_rows, write_jsonl
from tests.helpers import cli, records_by_key, status_json, wait_finished
from workers.backends.vllm import VllmBackend


def _replay(url: str, api: str, prompt: list[int], sampling: dict) -> tuple[list[int], str]:
    """(output ids, finish reason) the server gives for these ids and this sampling, asked
    directly in its own API (vLLM's with the worker's translation of the sampling)."""
    if api == "vllm":
        path, body = VllmBackend(model=requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]).request(
            prompt, sampling
        )
        choice = requests.post(f"{url}{path}", json=body, timeout=30).json()["choices"][0]
        assert choice["prompt_token_ids"] == prompt
        return choice["token_ids"], choice["finish_reason"]
    response = requests.post(
        f"{url}/generate", json={"input_ids": prompt, "sampling_params": sampling}, timeout=30
    ).json()
    return response["output_ids"], response["meta_info"]["finish_reason"]["type"]


def test_fifty_prompts_end_to_end(tmp_path, redis_server, stack, tokenizer, tokenizer_path, server_api):
    rows = chat_rows(50)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", rows)
    _, url = stack.devserver("--token-latency", "0.001", "--mean-output-tokens", "60", api=server_api)
    out = tmp_path / "out"

    enqueued = cli(
        "enqueue",
        str(prompts),
        "--campaign",
        "e2e",
        "--tokenizer",
        str(tokenizer_path),
        "--max-new-tokens",
        "128",
        "--temperature",
        "0.7",
        "--top-p",
        "0.9",
        "--batch-size",
        "8",
        "--redis",
        redis_server.url,
    )
    assert "rows read 50 / enqueued 50 / duplicate 0 / skipped 0" in enqueued.stdout.decode()

    worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, concurrency=2)
    wait_finished(redis_server.url, "e2e", expected=50, stack=stack)
    assert f"is {server_api} " in worker.log(), "the worker says which kind of server it detected"

    status = status_json(redis_server.url, "e2e")
    assert {k: status[k] for k in ("enqueued", "queued", "done", "failed")} == {
        "enqueued": 50,
        "queued": 0,
        "done": 50,
        "failed": 0,
    }

    exported = tmp_path / "train.jsonl"
    cli("export", str(out / "e2e"), "--out", str(exported))
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(records) == 50
    assert len({r["key"] for r in records}) == 50
    assert {r["backend"] for r in records} == {server_api}

    by_id = {row["id"]: row for row in rows}
    # Each record carries the sampling_params sent: every value explicit, its own sampling_seed.
    sampling_by_key = {key: r.sampling for key, r in records_by_key(out / "e2e").items()}
    for record in records:
        row = by_id[record["id"]]
        messages = row["messages"]
        while messages[-1]["role"] != "user":
            messages = messages[:-1]
        expected_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        prompt_len = record["prompt_tokens"]
        assert record["input_ids"][:prompt_len] == expected_prompt
        # The template's trailing "<think>\n" is part of the prompt, not of the output.
        assert tokenizer.convert_ids_to_tokens(expected_prompt[-2]) == "<think>"
        assert record["loss_mask"] == [0] * prompt_len + [1] * record["completion_tokens"]
        assert len(record["input_ids"]) == prompt_len + record["completion_tokens"]

        # The output is exactly what the server returns for these ids and sampling parameters.
        sampling = sampling_by_key[record["key"]]
        assert {
            k: sampling[k]
            for k in (
                "max_new_tokens",
                "temperature",
                "top_p",
                "top_k",
                "min_p",
                "repetition_penalty",
                "skip_special_tokens",
            )
        } == {
            "max_new_tokens": 128,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "skip_special_tokens": False,
        }
        assert isinstance(sampling["sampling_seed"], int)
        output_ids, finish = _replay(url, server_api, expected_prompt, sampling)
        assert record["input_ids"][prompt_len:] == output_ids
        assert record["finish_reason"] == finish
        if finish == "stop":  # the EOS (vLLM's stop_reason null) is recorded as the matched id, as SGLang does
            assert json.loads(record["finish_matched"]) == output_ids[-1]
