"""Exactly once when the broker is not to be trusted (issue 23): each fault of the adversarial run,
with real processes (redis-server that the test kills and restarts, `eagle-synth worker` processes
under their supervisor, devservers over HTTP), each ending in the exact accounting check.
docs/reliability.md lists them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from eagle_synth.payload import TaskPayload
from eagle_synth.processes import boot_id, holder_dead, hostname, pid_space
from eagle_synth.queue import campaign_queue, queue_lists
from eagle_synth.settings import DEFAULT_QUEUE
from eagle_synth.state.batch_store import stored_batches
from eagle_synth.state.node_state import all_nodes
from eagle_synth.state.stranded import UNACKED_KEY
from eagle_synth.testing.harness import RedisServer, free_port, wait_for
from tests.conftest import write_jsonl
from tests.helpers import (
    assert_exactly_once,
    campaign,
    cli,
    devserver_stats,
    enqueue_rows,
    queued,
    queued_items,
    wait_finished,
)
from tests.tcp_forward import TcpForward

# Short lease, reap and reconcile settings (the env knobs of workers/lease.py, stranded.py,
# reaper.py, reconciler.py, supervisor.py) and an hour-long visibility timeout, so nothing in a
# test comes back by kombu's own redelivery: only by the mechanisms under test.
FAST = {
    "EAGLE_SYNTH_VISIBILITY_TIMEOUT": "3600",
    "EAGLE_SYNTH_LEASE_TTL": "4",
    "EAGLE_SYNTH_REAP_AFTER": "5",
    "EAGLE_SYNTH_REAP_INTERVAL": "1",
    "EAGLE_SYNTH_RECONCILE_INTERVAL": "1",
    "EAGLE_SYNTH_RECONCILE_AFTER": "4",
    "EAGLE_SYNTH_BACKOFF_MAX": "0.5",
    "EAGLE_SYNTH_RESTART_BACKOFF": "0.5",
    "EAGLE_SYNTH_RESTART_BACKOFF_MAX": "2",
    "EAGLE_SYNTH_ERROR_RETRY_DELAY": "1",
}


def single_rows(count: int, prefix: str = "row") -> list[dict]:
    """Rows of one user turn each: one prompt per row."""
    return [{"id": f"{prefix}-{i}", "messages": [{"role": "user", "content": f"Say {i} twice."}]} for i in range(count)]


def celery_child(worker) -> psutil.Process | None:
    """The supervised Celery process of an `eagle-synth worker` (None while it is being restarted)."""
    try:
        children = psutil.Process(worker.proc.pid).children()
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            if "workers.child" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def handles(process: psutil.Process, sig: signal.Signals) -> bool:
    """Whether `process` has a handler of its own for `sig` (Linux: SigCgt in /proc/PID/status);
    Celery installs its SIGTERM handler as it starts, so a SIGTERM then is a warm shutdown."""
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(caught >> (sig - 1) & 1)


def busy_on(c, name: str, node: str | None = None) -> bool:
    return any(
        n.get("inflight_by_campaign", {}).get(name) and (node is None or n.get("node") == node)
        for n in all_nodes(c.client)
    )


# 1 ------------------------------------------------------------------------------------------------
def test_worker_survives_redis_restarts_and_its_crashed_process_comes_back(tmp_path, stack, tokenizer_path):
    redis_server = RedisServer(workdir=tmp_path / "redis", appendonly=True).start()
    try:
        enqueue_rows(tmp_path, redis_server.url, "rr", single_rows(48), tokenizer=tokenizer_path, batch_size=4)
        _, url = stack.devserver("--token-latency", "0.004", "--mean-output-tokens", "60", "--slots", "8")
        out = tmp_path / "out"
        worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST, name="rr@test")
        c = campaign(redis_server.url, "rr")
        child = wait_for(lambda: celery_child(worker), timeout=60, what="the Celery process")
        for restart in range(6):
            before = c.progress().done
            wait_for(
                lambda before=before: c.progress().done > before or c.progress().done == 48,
                timeout=60,
                what=f"progress before Redis restart {restart + 1}",
            )
            redis_server.restart()
        # The Celery process itself dies: the supervisor starts it again.
        child = celery_child(worker) or wait_for(lambda: celery_child(worker), timeout=60, what="the Celery process")
        child.kill()
        wait_for(
            lambda: (now := celery_child(worker)) is not None and now.pid != child.pid,
            timeout=60,
            what="a new Celery process",
        )
        wait_finished(redis_server.url, "rr", expected=48, stack=stack, timeout=180)
        assert_exactly_once(redis_server.url, "rr", out / "rr", expected=48)
        assert c.progress().failed == 0
        assert worker.alive(), "the worker (its supervisor) is alive"
        assert "starting it again" in worker.log()
    finally:
        redis_server.stop()


# 2 ------------------------------------------------------------------------------------------------
def test_a_message_the_broker_lost_is_published_again_by_the_reconciler(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "lost", single_rows(16), tokenizer=tokenizer_path, batch_size=4)
    c = campaign(redis_server.url, "lost")
    # What a Redis death between kombu's BRPOP and its `unacked` write leaves: a message popped
    # that is in no queue and not unacked, known only to a worker that is gone.
    raw = next(filter(None, (c.client.rpop(name) for name in queue_lists(campaign_queue(DEFAULT_QUEUE, "lost")))))
    assert raw is not None and c.client.hlen(UNACKED_KEY) == 0
    assert len({s.batch for s in stored_batches(c.client, "lost")}) == 4, "the campaign keeps every batch"
    _, url = stack.devserver("--token-latency", "0.002", "--mean-output-tokens", "30")
    out = tmp_path / "out"
    worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST)
    wait_finished(redis_server.url, "lost", expected=16, stack=stack, timeout=120)
    assert_exactly_once(redis_server.url, "lost", out / "lost", expected=16)
    assert c.progress().failed == 0
    assert "the broker lost it" in worker.log()
    wait_for(lambda: c.client.hlen(c.keys.batches) == 0, timeout=30, what="the finished batches forgotten")


# 3 ------------------------------------------------------------------------------------------------
def test_a_frozen_worker_writes_nothing_after_losing_its_lease(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "frozen", single_rows(16), tokenizer=tokenizer_path, batch_size=4)
    # Slow prompts (about 2 s each): the frozen worker holds answers it has not written.
    _, url = stack.devserver("--token-latency", "0.03", "--mean-output-tokens", "60", "--slots", "16")
    out = tmp_path / "out"
    env = {**FAST, "EAGLE_SYNTH_ERROR_RETRY_DELAY": "1"}
    frozen = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=env, name="frozen@test")
    c = campaign(redis_server.url, "frozen")
    wait_for(lambda: busy_on(c, "frozen"), timeout=60, what="batches in flight")
    child = celery_child(frozen)
    assert child is not None
    child.send_signal(signal.SIGSTOP)
    try:
        stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=env, name="other@test")
        wait_finished(redis_server.url, "frozen", expected=16, stack=stack, timeout=120)
    finally:
        child.send_signal(signal.SIGCONT)
    # Woken, it finds its leases gone: its batches end without a write, nothing is left held.
    wait_for(
        lambda: not busy_on(c, "frozen") and c.client.hlen(UNACKED_KEY) == 0 and queued(c.client) == 0,
        timeout=60,
        what="the woken worker to let go of its batches",
    )
    records = assert_exactly_once(redis_server.url, "frozen", out / "frozen", expected=16)
    assert c.progress().failed == 0
    assert {r.worker for r in records.values()} >= {"other@test"}


# 4 ------------------------------------------------------------------------------------------------
def test_two_hosts_with_one_hostname_never_take_each_others_leases(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "clones", single_rows(32), tokenizer=tokenizer_path, batch_size=4)
    c = campaign(redis_server.url, "clones")
    # A batch held by a live process on a cloned host: our hostname, a pid that does not run
    # here, another boot. Only its lease's expiry may free it, never a pid check on this machine.
    planted = TaskPayload.decode(next(iter(stored_batches(c.client, "clones"))).payload)
    lease = c.keys.lease(planted.batch)
    c.client.set(lease, f"clone-host|{2**22 + 7}|otherboot|cafe", px=120_000)
    _, url = stack.devserver("--token-latency", "0.002", "--mean-output-tokens", "30")
    out = tmp_path / "out"
    same = {**FAST, "EAGLE_SYNTH_HOSTNAME": "clone-host"}
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, env={**same, "EAGLE_SYNTH_BOOT_ID": "boot-a"})
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, env={**same, "EAGLE_SYNTH_BOOT_ID": "boot-b"})
    planted_keys = {item.key for item in planted.items}
    wait_finished(redis_server.url, "clones", expected=32 - len(planted_keys), stack=stack, timeout=120)
    assert not c.finished_keys(sorted(planted_keys)), "the clone's live lease was not taken over"
    assert c.client.exists(lease)
    c.client.delete(lease)  # the clone's lease lapses: its batch is reaped and done
    wait_finished(redis_server.url, "clones", expected=32, stack=stack, timeout=120)
    assert_exactly_once(redis_server.url, "clones", out / "clones", expected=32)
    nodes = all_nodes(c.client)
    assert {n.get("host") for n in nodes} == {"clone-host"} and len(nodes) == 2


# 5 ------------------------------------------------------------------------------------------------
def test_retry_failed_while_a_batch_holds_the_key_does_not_double(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "hold", single_rows(8), tokenizer=tokenizer_path, batch_size=4)
    # Slow prompts (about 10 s each), so the batch still holds its keys when the copy arrives.
    _, url = stack.devserver("--token-latency", "0.1", "--mean-output-tokens", "100", "--slots", "16")
    out = tmp_path / "out"
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST, concurrency=4)
    c = campaign(redis_server.url, "hold")

    def held() -> tuple[TaskPayload, object] | None:
        for stored in stored_batches(c.client, "hold"):
            if c.client.exists(c.keys.lease(stored.batch)):
                payload = TaskPayload.decode(stored.payload)
                finished = c.finished_keys([i.key for i in payload.items])
                for item in payload.items:
                    if item.key not in finished and c.client.hexists(c.keys.claims, item.key):
                        return payload, item
        return None

    payload, item = wait_for(held, timeout=60, what="a batch generating")
    # The key is recorded failed while its batch still generates it (a late copy's failure,
    # an operator's mistake): retry-failed publishes it in a new batch at once.
    c.record_failure(item, reason="server-error", message="injected", sampling=payload.sampling_for(item))
    result = cli("retry-failed", "hold", "--redis", redis_server.url).stdout.decode()
    assert "re-enqueued 1" in result
    wait_for(
        lambda: c.progress().done + c.progress().failed == 8 and queued(c.client) == 0,
        timeout=120,
        what="every prompt ended and the retried copy consumed",
    )
    wait_for(lambda: c.client.hlen(UNACKED_KEY) == 0, timeout=60, what="every message acknowledged")
    assert_exactly_once(redis_server.url, "hold", out / "hold", expected=8)
    assert c.progress().failed == 0


# 6 ------------------------------------------------------------------------------------------------
def test_a_trickling_health_endpoint_hangs_nothing(tmp_path, redis_server, stack, tokenizer_path):
    enqueue_rows(tmp_path, redis_server.url, "trickle", single_rows(16), tokenizer=tokenizer_path, batch_size=4)
    _, bad = stack.devserver("--trickle-health", "2")
    _, good = stack.devserver("--token-latency", "0.05", "--mean-output-tokens", "40")
    out = tmp_path / "out"
    stack.worker(
        servers=[bad, good], out=out, redis_url=redis_server.url, env=FAST, args=["--probe-timeout", "3"], name="tr@t"
    )
    c = campaign(redis_server.url, "trickle")

    def states() -> dict:
        nodes = [n for n in all_nodes(c.client) if n.get("node") == "tr@t"]
        return nodes[0].get("server_states", {}) if nodes else {}

    # Probes of the trickling server end at their deadline, again and again; the heartbeat goes on.
    wait_for(lambda: devserver_stats(bad).get("health_trickled", 0) >= 3, timeout=60, what="three trickled probes")
    wait_finished(redis_server.url, "trickle", expected=16, stack=stack, timeout=120)
    seen = states()
    assert seen[good]["state"] == "healthy" and seen[bad]["state"] != "healthy"
    assert "within" in seen[bad]["detail"] or "complete" in seen[bad]["detail"]
    assert_exactly_once(redis_server.url, "trickle", out / "trickle", expected=16)


# 7 ------------------------------------------------------------------------------------------------
def test_a_low_completion_tokens_or_a_missing_stop_id_never_becomes_a_record(
    tmp_path, redis_server, stack, tokenizer_path
):
    enqueue_rows(tmp_path, redis_server.url, "low", single_rows(8), tokenizer=tokenizer_path, batch_size=4)
    _, understated = stack.devserver("--understate-completion", "3", "--mean-output-tokens", "20")
    out = tmp_path / "out"
    worker = stack.worker(
        servers=[understated], out=out, redis_url=redis_server.url, env=FAST, args=["--max-attempts", "2"]
    )
    wait_finished(redis_server.url, "low", expected=8, stack=stack, timeout=120)
    c = campaign(redis_server.url, "low")
    assert c.failure_counts() == {"bad-response": 8}, "no record lost its first 3 ids"
    assert_exactly_once(redis_server.url, "low", out / "low", expected=8)
    worker.stop()

    enqueue_rows(tmp_path, redis_server.url, "nostop", single_rows(24), tokenizer=tokenizer_path, batch_size=4)
    _, dropping = stack.devserver("--drop-stop-id", "--mean-output-tokens", "20")
    stack.worker(servers=[dropping], out=out, redis_url=redis_server.url, env=FAST, args=["--max-attempts", "2"])
    wait_finished(redis_server.url, "nostop", expected=24, stack=stack, timeout=120)
    records = assert_exactly_once(redis_server.url, "nostop", out / "nostop", expected=24)
    c = campaign(redis_server.url, "nostop")
    assert set(c.failure_counts()) <= {"bad-response"} and c.failure_counts(), "stops without their id refused"
    for record in records.values():
        assert record.finish_reason != "stop" or record.output_ids[-1:] == [record.finish_matched]


# 8 ------------------------------------------------------------------------------------------------
def test_a_lone_surrogate_is_one_skipped_row(tmp_path, redis_server, stack, tokenizer_path):
    path = tmp_path / "rows.jsonl"
    rows = single_rows(3)
    lines = [json.dumps(r) for r in rows]
    lines[1] = lines[1].replace("Say 1 twice.", "Say \\ud800 twice.")
    path.write_text("\n".join(lines) + "\n")
    common = ["--tokenizer", str(tokenizer_path), "--redis", redis_server.url, "--max-new-tokens", "16"]
    result = cli("enqueue", str(path), "--campaign", "sur", *common, check=False)
    said = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, said
    assert f"{path}:2" in said and "bad-text" in said and "\\ud800" in said
    c = campaign(redis_server.url, "sur")
    assert c.skipped() == {"bad-text": 1}
    rerun = cli("enqueue", str(path), "--campaign", "sur", *common, check=False)
    assert rerun.returncode == 0, rerun.stderr.decode()
    _, url = stack.devserver("--mean-output-tokens", "10")
    stack.worker(servers=[url], out=tmp_path / "out", redis_url=redis_server.url, env=FAST)
    wait_finished(redis_server.url, "sur", expected=2, stack=stack)
    assert_exactly_once(redis_server.url, "sur", tmp_path / "out" / "sur", expected=2)


# 9 ------------------------------------------------------------------------------------------------
def test_a_redis_that_persists_nothing_is_refused_unless_accepted(tmp_path, stack, tokenizer_path):
    volatile = RedisServer(workdir=tmp_path / "redis", save="", appendonly=False).start()
    try:
        path = write_jsonl(tmp_path / "rows.jsonl", single_rows(4))
        common = ["--tokenizer", str(tokenizer_path), "--redis", volatile.url, "--max-new-tokens", "16"]
        refused = cli("enqueue", str(path), "--campaign", "vol", *common, check=False)
        assert refused.returncode == 2
        error = refused.stderr.decode()
        assert "persists nothing" in error and "--appendonly yes" in error and "--allow-volatile-redis" in error
        _, url = stack.devserver("--mean-output-tokens", "10")
        out = tmp_path / "out"
        worker = cli("worker", "--server", url, "--out", str(out), "--redis", volatile.url, check=False, timeout=60)
        assert worker.returncode == 2 and "--allow-volatile-redis" in worker.stderr.decode()
        assert not campaign(volatile.url, "vol").exists(), "nothing was written"

        accepted = cli("enqueue", str(path), "--campaign", "vol", *common, "--allow-volatile-redis")
        assert "--allow-volatile-redis" in accepted.stderr.decode()
        stack.worker(servers=[url], out=out, redis_url=volatile.url, env=FAST, args=["--allow-volatile-redis"])
        wait_finished(volatile.url, "vol", expected=4, stack=stack)
        assert_exactly_once(volatile.url, "vol", out / "vol", expected=4)
    finally:
        volatile.stop()


# 10 -----------------------------------------------------------------------------------------------
def test_a_worker_whose_only_server_is_refused_at_its_first_preflight_exits_2(
    tmp_path, redis_server, stack, tokenizer_path
):
    enqueue_rows(tmp_path, redis_server.url, "refused", single_rows(8), tokenizer=tokenizer_path, batch_size=4)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    worker = stack.worker(servers=[url], out=tmp_path / "out", redis_url=redis_server.url, env=FAST)
    c = campaign(redis_server.url, "refused")
    wait_for(lambda: all_nodes(c.client), timeout=60, what="the worker waiting for its server")
    # The server comes up after the worker, launched with a parser preflight refuses.
    stack.devserver("--reasoning-parser", "deepseek-r1", port=port)
    wait_for(lambda: not worker.alive(), timeout=60, what="the worker to exit")
    assert worker.proc.returncode == 2, worker.log()[-2000:]
    assert "refused by preflight" in worker.log()
    # Nothing was taken: every prompt is still queued, none done or failed.
    assert c.progress().done == c.progress().failed == 0
    assert sorted(i.key for i in queued_items(redis_server.url)) == sorted(
        k.decode() for k in c.client.smembers(c.keys.enqueued)
    )
    assert not c.client.exists(c.keys.claims)


# 11 -----------------------------------------------------------------------------------------------
def test_a_celery_process_that_ends_by_itself_with_any_code_comes_back(tmp_path, redis_server, stack, tokenizer_path):
    # kombu's "Unrecoverable error" after a Redis restart ends the Celery process by itself, and
    # Celery's exit code used to be dropped, so the supervisor saw 0 and ended for good. Signals to
    # the Celery process alone end it the same ways, on demand: SIGINT with Celery's code 1,
    # SIGTERM with 0. Neither was a stop asked of the worker, so each time it comes back.
    enqueue_rows(tmp_path, redis_server.url, "self", single_rows(24), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--token-latency", "0.01", "--mean-output-tokens", "40", "--slots", "8")
    out = tmp_path / "out"
    worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST)
    c = campaign(redis_server.url, "self")
    child = wait_for(lambda: celery_child(worker), timeout=60, what="the Celery process")
    for sig in (signal.SIGINT, signal.SIGTERM):
        wait_for(lambda child=child: handles(child, signal.SIGTERM), timeout=60, what="Celery's signal handlers")
        child.send_signal(sig)
        child = wait_for(
            lambda old=child.pid: (now := celery_child(worker)) is not None and now.pid != old and now,
            timeout=90,
            what=f"a new Celery process after {sig.name}",
        )
    wait_finished(redis_server.url, "self", expected=24, stack=stack, timeout=120)
    assert_exactly_once(redis_server.url, "self", out / "self", expected=24)
    assert c.progress().failed == 0
    assert worker.alive(), "the worker (its supervisor) is alive"
    log = worker.log()
    assert "the worker process exited with code 1" in log and "the worker process exited with code 0" in log


# 12 (issue 35, item 1) ----------------------------------------------------------------------------
def lose_some_commits(every: int, most: int) -> tuple[list[bytes], Callable[[bytes], bool]]:
    """A picker (tests/tcp_forward.py) of every `every`-th fenced commit (its MULTI ... EXEC
    carries the receipt), `most` of them at most, and the list of those picked."""
    seen: list[bytes] = []
    picked: list[bytes] = []

    def pick(chunk: bytes) -> bool:
        if b":receipts:" not in chunk or not chunk.endswith(b"EXEC\r\n"):
            return False
        seen.append(chunk)
        if len(seen) % every == 0 and len(picked) < most:
            picked.append(chunk)
            return True
        return False

    return picked, pick


def test_a_mark_whose_reply_is_lost_keeps_its_record(tmp_path, redis_server, stack, tokenizer_path):
    """The worker reaches Redis through a proxy that lets every other fenced commit through but
    cuts the connection before its reply comes back (Redis applied it). Each is settled by
    reading the receipt back: its record file stays, nothing is redone."""
    enqueue_rows(tmp_path, redis_server.url, "unsure", single_rows(40), tokenizer=tokenizer_path, batch_size=4)
    lost, pick = lose_some_commits(every=2, most=4)
    forward = TcpForward(free_port(), redis_server.port, lose_reply=pick)
    try:
        _, url = stack.devserver("--token-latency", "0.002", "--mean-output-tokens", "30")
        out = tmp_path / "out"
        proxied = f"redis://127.0.0.1:{forward.port}"
        worker = stack.worker(servers=[url], out=out, redis_url=proxied, env=FAST)
        wait_finished(redis_server.url, "unsure", expected=40, stack=stack, timeout=180)
    finally:
        forward.close()
    records = assert_exactly_once(redis_server.url, "unsure", out / "unsure", expected=40)
    assert len(lost) == 4, "the proxy lost four replies"
    assert campaign(redis_server.url, "unsure").progress().failed == 0
    assert len(records) == 40
    assert worker.log().count("a try of the mark whose reply was lost had applied") == 4


# 13 (issue 35, item 5) ----------------------------------------------------------------------------
def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_sigkilled_supervisor_takes_its_celery_process_with_it(tmp_path, redis_server, stack, tokenizer_path):
    """kill -9 of `eagle-synth worker` mid-campaign: its Celery process gets SIGTERM from the
    kernel (PR_SET_PDEATHSIG) and ends (a warm shutdown, bounded by the soft-shutdown timeout)
    instead of taking batches unsupervised; a new worker finishes the campaign exactly once."""
    enqueue_rows(tmp_path, redis_server.url, "orphan", single_rows(24), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--token-latency", "0.02", "--mean-output-tokens", "60", "--slots", "8")
    out = tmp_path / "out"
    env = {**FAST, "EAGLE_SYNTH_SOFT_SHUTDOWN_TIMEOUT": "2"}
    killed = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=env, name="killed@test")
    c = campaign(redis_server.url, "orphan")
    wait_for(lambda: busy_on(c, "orphan", "killed@test"), timeout=60, what="batches in flight")
    child = celery_child(killed)
    assert child is not None
    psutil.Process(killed.proc.pid).kill()
    # Soft-shutdown timeout (2 s) + the stop deadline's margin (30 s) bound the warm shutdown.
    wait_for(lambda: gone(child), timeout=45, what="the orphaned Celery process to end")
    stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST, name="after@test")
    wait_finished(redis_server.url, "orphan", expected=24, stack=stack, timeout=180)
    assert_exactly_once(redis_server.url, "orphan", out / "orphan", expected=24)
    assert c.progress().failed == 0


@pytest.mark.integration
def test_a_celery_process_whose_supervisor_died_before_it_started_ends_at_once(tmp_path):
    """The supervisor died before the child asked for the death signal: the parent-pid check
    ends it at once; and where prctl is unavailable, the parent watch ends it within seconds."""
    early = psutil.Popen(
        [
            sys.executable,
            "-c",
            "from workers.parent_death import end_with_parent; end_with_parent(1)\nimport time; time.sleep(60)",
        ],
    )
    assert early.wait(timeout=30) == -signal.SIGTERM
    ready = tmp_path / "ready"
    watched = (
        "import sys, time, workers.parent_death as death\n"
        "death._request_death_signal = lambda signum: False\n"
        "death.end_with_parent(int(sys.argv[1]))\n"
        "open(sys.argv[2], 'w').close()\n"
        "time.sleep(60)\n"
    )
    # An intermediate shell starts the child, waits until it watches, prints its pid and exits.
    shell = psutil.Popen(
        [
            "sh",
            "-c",
            f'{sys.executable} -c "$0" $$ {ready} & echo $!; while [ ! -e {ready} ]; do sleep 0.05; done',
            watched,
        ],
        stdout=subprocess.PIPE,
    )
    assert shell.stdout is not None
    orphan = psutil.Process(int(shell.stdout.readline()))
    assert shell.wait(timeout=30) == 0
    wait_for(lambda: gone(orphan), timeout=10, what="the watched child to end with its parent")


def test_celerys_stack_dump_signal_leaves_the_worker_running(tmp_path, redis_server, stack, tokenizer_path):
    """SIGUSR1 (Celery's stack dump) and SIGTTIN/SIGTTOU/SIGUSR2 to `eagle-synth worker`: the
    supervisor passes SIGUSR1 on (the Celery process dumps its threads) and ignores the others;
    neither process ends or restarts, and the campaign ends exactly once."""
    enqueue_rows(tmp_path, redis_server.url, "usr1", single_rows(16), tokenizer=tokenizer_path, batch_size=4)
    _, url = stack.devserver("--token-latency", "0.01", "--mean-output-tokens", "40")
    out = tmp_path / "out"
    worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST)
    child = wait_for(
        lambda: (found := celery_child(worker)) is not None and handles(found, signal.SIGUSR1) and found,
        timeout=60,
        what="Celery's stack-dump handler",
    )
    supervisor = psutil.Process(worker.proc.pid)
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTTIN, signal.SIGTTOU):
        supervisor.send_signal(sig)
    wait_for(lambda: "LOCAL VARIABLES" in worker.log(), timeout=30, what="the Celery process's stack dump")
    wait_finished(redis_server.url, "usr1", expected=16, stack=stack, timeout=120)
    assert_exactly_once(redis_server.url, "usr1", out / "usr1", expected=16)
    assert worker.alive() and supervisor.status() != psutil.STATUS_STOPPED
    assert celery_child(worker) == child and child.status() != psutil.STATUS_STOPPED
    assert "starting it again" not in worker.log()


# 16 (issue 35, item 6) ----------------------------------------------------------------------------
# Holds a batch lease from another pid namespace until its stdin closes: argv REDIS_URL, lease key.
FOREIGN_HOLDER = """
import sys
from eagle_synth.settings import broker_settings
from eagle_synth.state.redis_client import connect
from workers.lease import BatchLease

with BatchLease(connect(broker_settings(redis_url=sys.argv[1])), sys.argv[2]) as lease:
    print(lease.holder, flush=True)
    sys.stdin.read()
"""


class ForeignHolder:
    """A live holder of `lease` in another pid namespace on this kernel (`holder`: its id), whose
    pid runs no process here, so this namespace's /proc would call it dead. As root, a process
    started by `unshare --pid --fork` (its pid chosen through the new namespace's ns_last_pid);
    elsewhere, its holder record (this boot, another namespace's inode) set with a long TTL.
    `release()` ends it and frees the lease."""

    def __init__(self, redis_url: str, lease: str) -> None:
        self.client = campaign(redis_url, "ns").client
        self.lease = lease
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        self.pid = next(p for p in range(pid_max - 100, pid_max) if not psutil.pid_exists(p))
        self.process: subprocess.Popen | None = None
        if os.geteuid() == 0 and shutil.which("unshare"):
            # ns_last_pid is the new namespace's: the holder, started next, gets `pid`.
            script = f'echo {self.pid - 1} > /proc/sys/kernel/ns_last_pid && "{sys.executable}" -c "$0" "$1" "$2"; true'
            command = ["unshare", "--pid", "--fork", "sh", "-c", script, FOREIGN_HOLDER, redis_url, lease]
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert self.process.stdout is not None
            self.holder = self.process.stdout.readline().strip()
        else:
            self.holder = f"{hostname()}|{self.pid}|{boot_id()}.4026500000|cafe"
            self.client.set(lease, self.holder, px=300_000)
        assert self.holder.split("|")[1] == str(self.pid), self.holder
        assert not psutil.pid_exists(self.pid), "the holder's pid runs no process in this namespace"

    def release(self) -> None:
        if self.process is not None:
            self.process.communicate("", timeout=30)  # it releases its lease and ends
        else:
            self.client.delete(self.lease)


def test_a_live_holder_in_another_pid_namespace_is_never_called_dead(tmp_path, redis_server, stack, tokenizer_path):
    """Two containers on one kernel: a batch lease held by a live process of another pid
    namespace (same boot id, a pid that runs nothing here) is not taken over by a pid check; the
    batch waits for its lease, and is generated once."""
    enqueue_rows(tmp_path, redis_server.url, "ns", single_rows(16), tokenizer=tokenizer_path, batch_size=4)
    c = campaign(redis_server.url, "ns")
    planted = TaskPayload.decode(next(iter(stored_batches(c.client, "ns"))).payload)
    lease = c.keys.lease(planted.batch)
    foreign = ForeignHolder(redis_server.url, lease)
    holder_id = foreign.holder
    try:
        assert holder_id.split("|")[2].split(".")[0] == pid_space().split(".")[0], "one boot"
        assert holder_id.split("|")[2] != pid_space(), "another pid namespace"
        assert not holder_dead(holder_id)
        _, url = stack.devserver("--token-latency", "0.002", "--mean-output-tokens", "30")
        out = tmp_path / "out"
        stack.worker(servers=[url], out=out, redis_url=redis_server.url, env=FAST)
        planted_keys = sorted(item.key for item in planted.items)
        wait_finished(redis_server.url, "ns", expected=16 - len(planted_keys), stack=stack, timeout=120)
        assert not c.finished_keys(planted_keys), "the live foreign holder's lease was not taken over"
        assert c.client.get(lease).decode() == holder_id
    finally:
        foreign.release()
    wait_finished(redis_server.url, "ns", expected=16, stack=stack, timeout=120)
    assert_exactly_once(redis_server.url, "ns", out / "ns", expected=16)
    assert devserver_stats(url)["prompts"] == 16, "no prompt was generated twice"
