"""A read-only replica at REDIS_URL (issue 35, item 4): `status`, `enqueue` and `worker` read the
role at start and when a write is refused (READONLY), say in one line which replica and whose,
and exit 2; a worker whose master is demoted mid-campaign (a failover) stops with exit 2 instead
of its Celery process crash-looping, and the campaign ends exactly once on the new master."""

from __future__ import annotations

import psutil

from eagle_synth.settings import broker_settings
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import RedisServer, wait_for
from tests.conftest import write_jsonl
from tests.helpers import assert_exactly_once, campaign, cli, enqueue_rows, wait_finished
from tests.test_exactly_once import FAST, busy_on, single_rows


def replica_of(master: RedisServer, workdir) -> RedisServer:
    """A redis-server started as `--replicaof` master, its link up (the data synced)."""
    replica = RedisServer(workdir=workdir, extra_args=("--replicaof", "127.0.0.1", str(master.port))).start()
    client = connect(broker_settings(redis_url=replica.url))
    wait_for(lambda: client.info("replication")["master_link_status"] == "up", timeout=30, what="the replica's link")
    return replica


def one_line(result) -> str:
    err = result.stderr.decode().strip()
    assert result.returncode == 2, (result.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_status_enqueue_and_worker_name_the_replica_and_its_master_and_exit_2(
    tmp_path, redis_server, stack, tokenizer_path
):
    enqueue_rows(tmp_path, redis_server.url, "rep", single_rows(4), tokenizer=tokenizer_path, batch_size=4)
    replica = replica_of(redis_server, tmp_path / "replica")
    try:
        said = f"the Redis at 127.0.0.1:{replica.port} is a read-only replica of 127.0.0.1:{redis_server.port}"
        assert said in one_line(cli("status", "rep", "--redis", replica.url, check=False))
        rows = write_jsonl(tmp_path / "rows.jsonl", single_rows(4, prefix="more"))
        enqueue = ["enqueue", str(rows), "--campaign", "rep2", "--tokenizer", str(tokenizer_path)]
        assert said in one_line(cli(*enqueue, "--redis", replica.url, check=False))
        worker = ["worker", "--server", "http://127.0.0.1:9", "--out", str(tmp_path / "out")]
        assert said in one_line(cli(*worker, "--redis", replica.url, check=False, timeout=60))
        assert not campaign(redis_server.url, "rep2").exists(), "nothing was written"
    finally:
        replica.stop()


def fail_over(old: RedisServer, new: RedisServer) -> None:
    """Promote `new` (a replica of `old`) and make `old` its replica, losing no write: writes to
    `old` are paused until `new` has all of them."""
    old_client = connect(broker_settings(redis_url=old.url))
    new_client = connect(broker_settings(redis_url=new.url))
    old_client.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
    wait_for(
        lambda: (
            new_client.info("replication")["slave_repl_offset"] == old_client.info("replication")["master_repl_offset"]
        ),
        timeout=30,
        what="the replica to have every write",
    )
    new_client.execute_command("REPLICAOF", "NO", "ONE")
    old_client.execute_command("REPLICAOF", "127.0.0.1", str(new.port))
    old_client.execute_command("CLIENT", "UNPAUSE")


def test_a_master_demoted_mid_campaign_stops_its_worker_with_exit_2(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "demoted", single_rows(24), tokenizer=tokenizer_path, batch_size=4)
    new = replica_of(redis_server, tmp_path / "new")
    try:
        # Slow prompts (about 3 s each): batches are in flight when the master is demoted.
        _, url = stack.devserver("--token-latency", "0.05", "--mean-output-tokens", "60", "--slots", "8")
        out = tmp_path / "out"
        worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST, name="old@test")
        wait_for(lambda: busy_on(campaign(redis_server.url, "demoted"), "demoted"), timeout=60, what="batches")
        fail_over(redis_server, new)
        code = psutil.Process(worker.proc.pid).wait(timeout=120)
        log = worker.log()
        assert code == 2, log[-3000:]
        assert f"read-only replica of 127.0.0.1:{new.port}" in log
        assert "starting it again" not in log, "the supervisor did not restart a worker against the replica"
        stack.worker(servers=[url], out=out, redis_url=new.url, env=FAST, name="new@test")
        wait_finished(new.url, "demoted", expected=24, stack=stack, timeout=180)
        assert_exactly_once(new.url, "demoted", out / "demoted", expected=24)
        assert campaign(new.url, "demoted").progress().failed == 0
    finally:
        new.stop()
