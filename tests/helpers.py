"""Helpers for tests that drive the CLI and inspect campaign state."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

from eagle_synth.settings import DEFAULT_QUEUE, broker_settings
from eagle_synth.state.campaign import Campaign
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import wait_for


def cli(
    *args: str, input: bytes | None = None, check: bool = True, env: dict | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    """Run `eagle-synth ARGS` as a user would (a separate process)."""
    import os

    result = subprocess.run(
        [sys.executable, "-m", "eagle_synth", *args],
        input=input,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"eagle-synth {' '.join(args)} exited {result.returncode}\nstdout:\n{result.stdout.decode()}\n"
            f"stderr:\n{result.stderr.decode()}"
        )
    return result


def campaign(redis_url: str, name: str) -> Campaign:
    return Campaign(connect(broker_settings(redis_url=redis_url)), name)


def wait_finished(redis_url: str, name: str, *, expected: int, timeout: float = 120, stack=None) -> None:
    """Wait until done + failed == expected."""
    c = campaign(redis_url, name)

    def finished():
        p = c.progress()
        return p.done + p.failed >= expected

    try:
        wait_for(finished, timeout=timeout, interval=0.2, what=f"{expected} prompts of {name} to finish")
    except TimeoutError:
        p = c.progress()
        raise AssertionError(f"progress {p}; logs:\n{stack.logs() if stack else ''}") from None


def status_json(redis_url: str, name: str) -> dict:
    """`eagle-synth status NAME --json`, run as a user would (a process: about 0.6 s of CPU)."""
    return json.loads(cli("status", name, "--json", "--redis", redis_url).stdout)


def status_now(redis_url: str, name: str, *, reap_after: float | None = None) -> dict:
    """What `status NAME --json` prints (the same campaign_status), read in this process: for
    polling, where a process per look costs CPU and may miss a state that lasts seconds.
    `reap_after` stands for the EAGLE_SYNTH_REAP_AFTER a CLI process would be given."""
    from eagle_synth.state.stranded import stranded_prompts
    from eagle_synth.tools.status import campaign_status

    client = connect(broker_settings(redis_url=redis_url))
    stranded = None if reap_after is None else stranded_prompts(client, reap_after=reap_after)
    return campaign_status(client, name, stranded=stranded)


def enqueue_rows(
    tmp_path,
    redis_url: str,
    name: str,
    rows: list[dict],
    *,
    tokenizer,
    batch_size: int = 8,
    max_new_tokens: int = 64,
    **options,
):
    """Enqueue rows with the real producer, in this process (one templating process).

    The tokenizer folder is loaded once per test process and reused (see loaded_tokenizer):
    the producer's own loading is what the CLI enqueue tests exercise."""
    from eagle_synth.sampling import SamplingParams
    from producer.enqueue import EnqueueOptions, enqueue
    from tests.conftest import write_jsonl

    path = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    enqueue_options = EnqueueOptions(
        inputs=[str(path)],
        campaign=name,
        tokenizer=str(tokenizer),
        batch_size=batch_size,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
        processes=1,
        **options,
    )
    summary = enqueue(
        enqueue_options,
        broker=broker_settings(redis_url=redis_url),
        tokenizer=loaded_tokenizer(
            enqueue_options.tokenizer,
            trust_remote_code=enqueue_options.trust_remote_code,
            chat_template=enqueue_options.chat_template,
        ),
    )
    assert summary.accounted
    return summary


@functools.cache
def loaded_tokenizer(path: str, *, trust_remote_code: bool, chat_template: str | None):
    """load_tokenizer(...) once per test process and arguments: a load costs about a second of
    CPU (Qwen3.5's 248k-token vocabulary), and the producer never changes a loaded tokenizer."""
    from eagle_synth.templating import load_tokenizer

    return load_tokenizer(path, trust_remote_code=trust_remote_code, chat_template_file=chat_template)


def records_by_key(campaign_dir) -> dict:
    """Every record on disk, keyed; fails the test if a key appears twice."""
    from eagle_synth.records import iter_records

    seen: dict = {}
    for record in iter_records(campaign_dir, dedupe=False):
        assert record.key not in seen, f"record {record.key} written twice"
        seen[record.key] = record
    return seen


def assert_exactly_once(redis_url: str, name: str, campaign_dir, *, expected: int) -> dict:
    """Every enqueued key has exactly one record or one recorded failure: none lost, none doubled."""
    c = campaign(redis_url, name)
    pending_or_failed = {k.decode() for k in c.client.smembers(c.keys.enqueued)}
    done = {k.decode() for k in c.client.smembers(c.keys.done)}
    assert not (pending_or_failed & done), "a done key is still in the enqueued set"
    enqueued = pending_or_failed | done
    failed = set(dict(c.iter_failures()))
    records = records_by_key(campaign_dir) if (campaign_dir / "records").exists() else {}
    assert len(enqueued) == expected
    assert not (done & failed), "a key is both done and failed"
    assert done | failed == enqueued, f"lost: {sorted(enqueued - done - failed)[:5]}"
    assert not set(records) - done, f"records whose key is not done: {sorted(set(records) - done)[:5]}"
    assert not done - set(records), f"done keys without a record: {sorted(done - set(records))[:5]}"
    return records


def devserver_stats(url: str) -> dict:
    import requests

    return requests.get(f"{url}/dev/stats", timeout=10).json()


def campaign_queues(client, campaign: str | None = None) -> list[str]:
    """The queue of `campaign`, or of every campaign in the Redis (each has its own)."""
    from eagle_synth.queue import campaign_queue
    from eagle_synth.state.campaign import campaign_names

    names = [campaign] if campaign is not None else campaign_names(client)
    return [campaign_queue(DEFAULT_QUEUE, name) for name in names]


def queued(client, campaign: str | None = None) -> int:
    """Messages waiting in the queue of `campaign` (default: of every campaign), all priorities."""
    from eagle_synth.queue import queued_count

    return sum(queued_count(client, queue) for queue in campaign_queues(client, campaign))


def queued_payloads(redis_url: str, campaign: str | None = None) -> list:
    """Decode every task message waiting in the campaigns' queues (as a worker would receive it)."""
    from eagle_synth.payload import TaskPayload
    from eagle_synth.queue import queued_payloads as peek

    client = connect(broker_settings(redis_url=redis_url))
    payloads = [TaskPayload.decode(p) for queue in campaign_queues(client, campaign) for p in peek(client, queue)]
    assert len(payloads) == queued(client, campaign), "a queued message is not ours"
    return payloads


def queued_items(redis_url: str) -> list:
    return [item for payload in queued_payloads(redis_url) for item in payload.items]


# What a server started with `--api-key` answers by path, without the key: vLLM (0.32) guards
# its /v1/... paths only. tests/test_real_vllm.py holds real vLLM to it, tests/test_vllm.py the
# devserver's vLLM API, both through `api_key_statuses`.
VLLM_API_KEY_STATUSES = {
    "GET /health": 200,
    "GET /version": 200,
    "POST /tokenize": 200,
    "GET /v1/models": 401,
    "POST /v1/completions": 401,
    "GET /v1/models with a wrong key": 401,
    "GET /v1/models with the key": 200,
}


def api_key_statuses(url: str, key: str) -> dict[str, int]:
    """The status of each request of VLLM_API_KEY_STATUSES on the server at `url`."""
    import requests

    def status(method: str, path: str, *, token: str | None = None, body: dict | None = None) -> int:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return requests.request(method, url + path, json=body, headers=headers, timeout=60).status_code

    return {
        "GET /health": status("GET", "/health"),
        "GET /version": status("GET", "/version"),
        "POST /tokenize": status("POST", "/tokenize", body={"prompt": "hello", "add_special_tokens": False}),
        "GET /v1/models": status("GET", "/v1/models"),
        "POST /v1/completions": status("POST", "/v1/completions", body={"prompt": [1, 2, 3], "max_tokens": 1}),
        "GET /v1/models with a wrong key": status("GET", "/v1/models", token=key + "-wrong"),
        "GET /v1/models with the key": status("GET", "/v1/models", token=key),
    }


def redis_text(client) -> str:
    """Every key and value of a Redis database as text, for tests that look for a secret in it."""
    parts = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        read = {
            "string": lambda k: [client.get(k)],
            "hash": lambda k: [part for pair in client.hgetall(k).items() for part in pair],
            "set": client.smembers,
            "list": lambda k: client.lrange(k, 0, -1),
            "zset": lambda k: client.zrange(k, 0, -1),
        }.get(kind, lambda k: [])
        parts += [key, *(value for value in read(key) if value is not None)]
    return "\n".join(part.decode(errors="replace") for part in parts)


def folder_text(folder) -> str:
    """Every file under `folder` as text, zstd files decompressed, for tests that look for a secret."""
    import zstandard

    parts = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".zst":
            data = zstandard.ZstdDecompressor().stream_reader(data).read()
        parts.append(f"{path}\n{data.decode(errors='replace')}")
    return "\n".join(parts)
