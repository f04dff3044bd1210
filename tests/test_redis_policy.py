"""A Redis that may evict keys is refused by enqueue and worker (unless overridden); a Redis
that forbids CONFIG gives a warning or an answer from INFO; a full Redis (noeviction at
maxmemory) is a one-line error, and a rerun after it loses and doubles nothing."""

from __future__ import annotations

import os
import random

import pytest

from eagle_synth.errors import EvictingRedisError
from eagle_synth.settings import broker_settings
from eagle_synth.state.redis_client import connect
from eagle_synth.state.redis_policy import check_eviction_policy, read_eviction_policy
from eagle_synth.testing.harness import RedisServer, wait_for
from tests.conftest import chat_rows, write_jsonl
from tests.helpers import campaign, cli, queued_items

LIMITED = (
    "--user",
    "noconfig",
    "on",
    ">pw",
    "~*",
    "&*",
    "+@all",
    "-config",
    "--user",
    "noinfo",
    "on",
    ">pw",
    "~*",
    "&*",
    "+@all",
    "-config",
    "-info",
)


@pytest.fixture
def evicting(tmp_path):
    server = RedisServer(
        workdir=tmp_path / "lru", maxmemory_policy="allkeys-lru", maxmemory="64mb", extra_args=LIMITED
    ).start()
    yield server
    server.stop()


def one_line_error(result) -> str:
    err = result.stderr.decode()
    assert result.returncode == 2, (result.returncode, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_enqueue_refuses_an_evicting_redis_unless_told(tmp_path, evicting, tokenizer_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", chat_rows(4))
    args = ["enqueue", str(rows), "--campaign", "lru", "--tokenizer", str(tokenizer_path), "--redis", evicting.url]
    err = one_line_error(cli(*args, check=False))
    assert "maxmemory-policy allkeys-lru" in err and "--allow-evicting-redis" in err
    assert not campaign(evicting.url, "lru").exists() and not connect(broker_settings(redis_url=evicting.url)).keys("*")

    accepted = cli(*args, "--allow-evicting-redis")
    assert "going on at your own risk" in accepted.stderr.decode()
    assert campaign(evicting.url, "lru").progress().enqueued == 4


def test_worker_refuses_an_evicting_redis_before_starting(tmp_path, evicting, stack):
    err = one_line_error(
        cli(
            "worker",
            "--server",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "out"),
            "--redis",
            evicting.url,
            check=False,
            timeout=60,
        )
    )
    assert "maxmemory-policy allkeys-lru" in err
    worker = stack.worker(
        servers=["http://127.0.0.1:9"], out=tmp_path / "out", redis_url=evicting.url, args=["--allow-evicting-redis"]
    )
    wait_for(lambda: " ready." in worker.log() or not worker.alive(), timeout=120, what="the overridden worker")
    assert worker.alive() and "going on at your own risk" in worker.log()


def test_policy_read_from_info_when_config_is_forbidden_or_renamed(tmp_path, evicting):
    user = evicting.url.replace("redis://", "redis://noconfig:pw@")
    assert read_eviction_policy(connect(broker_settings(redis_url=user))) == ("allkeys-lru", None)
    with pytest.raises(EvictingRedisError):
        check_eviction_policy(connect(broker_settings(redis_url=user)))

    renamed = RedisServer(workdir=tmp_path / "renamed", extra_args=("--rename-command", "CONFIG", "")).start()
    try:
        assert read_eviction_policy(connect(broker_settings(redis_url=renamed.url))) == ("noeviction", None)
    finally:
        renamed.stop()


def test_policy_unreadable_is_a_warning(tmp_path, evicting, tokenizer_path):
    user = evicting.url.replace("redis://", "redis://noinfo:pw@")
    policy, why = read_eviction_policy(connect(broker_settings(redis_url=user)))
    assert policy is None and "no permissions" in why
    rows = write_jsonl(tmp_path / "rows.jsonl", chat_rows(2))
    result = cli("enqueue", str(rows), "--campaign", "blind", "--tokenizer", str(tokenizer_path), "--redis", user)
    assert "could not read Redis's maxmemory-policy" in result.stderr.decode()
    assert campaign(evicting.url, "blind").progress().enqueued == 2


def test_full_redis_is_one_line_and_a_rerun_loses_nothing(tmp_path, redis_server, tokenizer_path):
    client = connect(broker_settings(redis_url=redis_server.url))
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 300_000)  # noeviction: writes fail once it is full
    words = [f"w{random.Random(i).randrange(10**6)}" for i in range(4000)]
    rows = [
        {"id": f"r{i}", "messages": [{"role": "user", "content": " ".join(random.Random(i).sample(words, 300))}]}
        for i in range(400)
    ]
    path = write_jsonl(tmp_path / "big.jsonl", rows)
    args = [
        "enqueue",
        str(path),
        "--campaign",
        "full",
        "--tokenizer",
        str(tokenizer_path),
        "--redis",
        redis_server.url,
        "--max-new-tokens",
        "16",
    ]
    err = one_line_error(cli(*args, check=False))
    assert "Redis is full" in err

    client.config_set("maxmemory", 0)
    cli(*args)
    c = campaign(redis_server.url, "full")
    queued = [item.key for item in queued_items(redis_server.url)]
    assert c.progress().enqueued == 400
    assert sorted(queued) == sorted(k.decode() for k in c.client.smembers(c.keys.enqueued)), (
        "every claimed prompt is queued exactly once after the rerun"
    )


def test_the_volatile_redis_advice_holds_on_a_redis_started_from_flags(tmp_path):
    """What the refusal advises, tried on a real redis-server started from flags (as the tests'
    and most hand-started ones are): CONFIG REWRITE fails there, and CONFIG SET appendonly yes
    writes the append-only file into the working directory CONFIG GET dir names. The message
    says both."""
    import redis as redis_errors

    from eagle_synth.errors import VolatileRedisError
    from eagle_synth.state.redis_policy import check_persistence

    server = RedisServer(workdir=tmp_path / "redis", save="").start()
    try:
        client = connect(broker_settings(redis_url=server.url))
        with pytest.raises(VolatileRedisError) as refused:
            check_persistence(client)
        advice = str(refused.value)
        assert "CONFIG SET appendonly yes" in advice and "CONFIG GET dir" in advice
        assert "CONFIG REWRITE" in advice and "config file" in advice

        with pytest.raises(redis_errors.ResponseError, match="without a config file"):
            client.config_rewrite()
        client.config_set("appendonly", "yes")
        folder = client.config_get("dir")["dir"]
        folder = folder.decode() if isinstance(folder, bytes) else folder
        assert folder == str(tmp_path / "redis")
        wait_for(
            lambda: any(name.startswith("appendonly") for name in os.listdir(folder)),
            timeout=30,
            what="the append-only file in CONFIG GET dir",
        )
        assert check_persistence(client) is None
    finally:
        server.stop()
