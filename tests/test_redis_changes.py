"""Exactly once when Redis itself changes under a running campaign (issue 35, items 2 and 3): a
Sentinel failover with a lagging replica, and an evicting policy set mid-run. Real redis-server
and redis-sentinel processes, real `eagle-synth worker` processes and devservers; each test ends
in the exact accounting check across every host's folder, before any reader's dedupe.
docs/reliability.md lists them."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest
import redis

from eagle_synth.queue import campaign_queue, queue_lists
from eagle_synth.settings import DEFAULT_QUEUE, broker_settings
from eagle_synth.state.campaign import Campaign
from eagle_synth.state.keys import CAMPAIGNS
from eagle_synth.state.redis_client import connect
from eagle_synth.state.stranded import UNACKED_KEY
from eagle_synth.testing.harness import ManagedProcess, RedisServer, free_port, stop_all, wait_for
from tests.helpers import (
    assert_exactly_once,
    campaign,
    enqueue_rows,
    queued,
    records_by_key,
    status_json,
    status_now,
    wait_finished,
)
from tests.tcp_forward import TcpForward
from tests.test_exactly_once import FAST, single_rows

# The master's name in the sentinels' configuration (EAGLE_SYNTH_SENTINEL_MASTER).
MASTER_NAME = "campaign"
# Seconds the replica link lags: the window whose acknowledged writes a failover would forget.
REPLICA_LAG = 3.0
# Sentinel timings for a test: the master counts as down after two seconds without answers
# (one was seen to fail over a live master on a loaded 2-core machine).
SENTINEL_DOWN_AFTER_MS = 2000
SENTINEL_FAILOVER_TIMEOUT_MS = 10000


def assert_exactly_once_across(client: redis.Redis, name: str, folders: list[Path], *, expected: int) -> None:
    """One record or one recorded failure per prompt, over every host's folder, no reader dedupe."""
    c = Campaign(client, name)
    done = {k.decode() for k in client.smembers(c.keys.done)}
    pending_or_failed = {k.decode() for k in client.smembers(c.keys.enqueued)}
    failed = set(dict(c.iter_failures()))
    keys_by_folder = [set(records_by_key(folder)) if (folder / "records").exists() else set() for folder in folders]
    for i, first in enumerate(keys_by_folder):
        for second in keys_by_folder[i + 1 :]:
            assert not first & second, f"records written on two hosts: {sorted(first & second)[:5]}"
    records = set().union(*keys_by_folder)
    assert len(done | pending_or_failed) == expected
    assert not done & failed and not done & pending_or_failed
    assert done | failed == done | pending_or_failed, "a prompt neither done nor failed"
    assert records == done, f"done without record: {sorted(done - records)[:5]}; not done: {sorted(records - done)[:5]}"


class Sentinels:
    """Three redis-sentinel processes watching `master_port` as MASTER_NAME, in `workdir`."""

    def __init__(self, workdir: Path, master_port: int) -> None:
        self.processes: list[ManagedProcess] = []
        self.ports: list[int] = []
        binary = shutil.which("redis-sentinel")
        assert binary, "redis-sentinel is not installed (`make redis-server` installs it)"
        for index in range(3):
            folder = workdir / f"sentinel-{index}"
            folder.mkdir(parents=True)
            port = free_port()
            config = folder / "sentinel.conf"  # a sentinel rewrites its own file: one each
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {SENTINEL_DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} {SENTINEL_FAILOVER_TIMEOUT_MS}\n"
            )
            process = ManagedProcess([binary, str(config)], {}, folder / "sentinel.log").start()
            assert process.listening_on(port, f"redis-sentinel {index}") is None, process.log()
            self.processes.append(process)
            self.ports.append(port)

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.ports)

    def master_port(self) -> int:
        client = redis.Redis(port=self.ports[0])
        return int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1])

    def stop(self) -> None:
        stop_all(self.processes)


# item 2 -------------------------------------------------------------------------------------------
def test_a_sentinel_failover_with_a_lagging_replica_loses_and_doubles_nothing(
    tmp_path, stack, tokenizer_path, monkeypatch
):
    master = RedisServer(workdir=tmp_path / "master").start()
    # Everyone reaches the master through this port (the sentinels watch it there, so they leave
    # the replica's link on it); only the replica's stream (after its PSYNC) lags.
    link = TcpForward(free_port(), master.port, delay=REPLICA_LAG, delay_after=b"PSYNC")
    replica_args = ("--replicaof", "127.0.0.1", str(link.port))
    replica = RedisServer(workdir=tmp_path / "replica", extra_args=replica_args).start()
    sentinels = None
    try:
        wait_for(
            lambda: redis.Redis(port=replica.port).info("replication").get("master_link_status") == "up",
            timeout=30,
            what="the replica in sync",
        )
        sentinels = Sentinels(tmp_path / "sentinels", link.port)
        wait_for(
            lambda: all(
                int(redis.Redis(port=p).sentinel_master(MASTER_NAME).get("num-other-sentinels", 0)) == 2
                and int(redis.Redis(port=p).sentinel_master(MASTER_NAME).get("num-slaves", 0)) == 1
                for p in sentinels.ports
            ),
            timeout=60,
            what="the sentinels to know each other and the replica",
        )
        monkeypatch.setenv("EAGLE_SYNTH_SENTINEL_MASTER", MASTER_NAME)
        url = sentinels.url
        enqueue_rows(tmp_path, url, "failover", single_rows(64), tokenizer=tokenizer_path, batch_size=4)
        # The campaign on the replica too, so any failover (ours below) finds its settings.
        enqueued_at = int(redis.Redis(port=master.port).info("replication")["master_repl_offset"])
        wait_for(
            lambda: int(redis.Redis(port=replica.port).info("replication")["master_repl_offset"]) >= enqueued_at,
            timeout=30,
            what="the replica to hold the enqueued campaign",
        )
        _, server = stack.devserver("--token-latency", "0.01", "--mean-output-tokens", "40", "--slots", "16")
        env = {**FAST, "EAGLE_SYNTH_SENTINEL_MASTER": MASTER_NAME}
        folders = [tmp_path / "host-a", tmp_path / "host-b"]
        for index, out in enumerate(folders):
            stack.worker(servers=[server], out=out, redis_url=url, env=env, name=f"host{index}@test", concurrency=4)
        client = connect(broker_settings(redis_url=url))
        c = Campaign(client, "failover")
        wait_for(lambda: c.progress().done >= 16, timeout=120, what="records before the failover")
        assert c.progress().done < 64, "the campaign ended before the master could be killed"
        master.stop(sig=signal.SIGKILL)
        wait_for(lambda: sentinels.master_port() == replica.port, timeout=60, what="the sentinels to fail over")

        def master_answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:  # the sentinels still settling: no master named yet
                return False

        wait_for(master_answers, timeout=60, what="the new master through the sentinels")
        wait_finished(url, "failover", expected=64, stack=stack, timeout=300)
        assert_exactly_once_across(client, "failover", [out / "failover" for out in folders], expected=64)
        assert c.progress().failed == 0
    finally:
        if sentinels is not None:
            sentinels.stop()
        link.close()
        replica.stop()
        master.stop()


# item 3 -------------------------------------------------------------------------------------------
def test_an_evicting_policy_set_mid_run_stops_the_worker_until_it_is_safe_again(
    tmp_path, redis_server, stack, tokenizer_path
):
    enqueue_rows(tmp_path, redis_server.url, "evict", single_rows(96), tokenizer=tokenizer_path, batch_size=4)
    _, server = stack.devserver("--token-latency", "0.02", "--mean-output-tokens", "40", "--slots", "8")
    out = tmp_path / "out"
    worker = stack.worker(servers=[server], out=out, redis_url=redis_server.url, env=FAST, name="ev@test")
    c = campaign(redis_server.url, "evict")
    wait_for(lambda: c.progress().done >= 4, timeout=120, what="the first records")
    c.client.config_set("maxmemory-policy", "allkeys-lru")

    def closed_for_redis() -> bool:
        rows = status_now(redis_server.url, "evict")["workers"]
        return bool(rows) and all(not w["consuming"] and "allkeys-lru" in (w["redis"] or "") for w in rows)

    wait_for(closed_for_redis, timeout=10, what="the gate to close on the evicting policy")
    # The batches it held end; then it takes none: the queue and the done count stand still.
    wait_for(lambda: c.client.hlen(UNACKED_KEY) == 0, timeout=120, what="the held batches to end")
    waiting = queued(c.client, "evict")
    done = c.progress().done
    assert waiting > 0, "the campaign ended before the gate closed"
    quiet_until = time.monotonic() + 6.0  # three policy checks
    while time.monotonic() < quiet_until:
        assert queued(c.client, "evict") == waiting and c.progress().done == done, "a batch was taken"
        assert c.client.hlen(UNACKED_KEY) == 0
    shown = status_json(redis_server.url, "evict")["workers"]
    assert shown and "maxmemory-policy is allkeys-lru" in shown[0]["redis"] and not shown[0]["consuming"]
    assert "maxmemory-policy is allkeys-lru" in worker.log()

    # What eviction takes: the campaigns set, and a queued message. The reconciler must
    # publish that batch again from the stored batches, found without the set.
    c.client.delete(CAMPAIGNS)
    lists = queue_lists(campaign_queue(DEFAULT_QUEUE, "evict"))  # whichever priority list holds one
    assert next(filter(None, (c.client.rpop(name) for name in lists)), None) is not None
    c.client.config_set("maxmemory-policy", "noeviction")
    wait_finished(redis_server.url, "evict", expected=96, stack=stack, timeout=240)
    assert_exactly_once(redis_server.url, "evict", out / "evict", expected=96)
    assert c.progress().failed == 0
    assert c.client.sismember(CAMPAIGNS, "evict"), "the reconciler put the campaign back in its set"
    assert "redis: safe again" in worker.log()


@pytest.fixture(autouse=True)
def _no_shared_redis(monkeypatch):
    """REDIS_URL never points a test here at the shared Redis."""
    monkeypatch.delenv("REDIS_URL", raising=False)
