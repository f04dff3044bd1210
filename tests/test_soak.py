"""The faults of issue 23 at once, on one campaign: Redis restarted 10 times, a worker frozen past
its lease, a worker's Celery process SIGKILLed, `retry-failed` while batches run, two workers on
one hostname. Every prompt ends exactly once; every worker is alive or back by itself."""

from __future__ import annotations

import signal

from eagle_synth.payload import TaskPayload
from eagle_synth.state.batch_store import stored_batches
from eagle_synth.state.redis_client import text
from eagle_synth.testing.harness import RedisServer, wait_for
from tests.helpers import assert_exactly_once, campaign, cli, enqueue_rows, wait_finished
from tests.test_exactly_once import FAST, celery_child, single_rows

PROMPTS = 128
RESTARTS = 10


def test_soak_every_fault_at_once(tmp_path, stack, tokenizer_path):
    redis_server = RedisServer(workdir=tmp_path / "redis", appendonly=True).start()
    try:
        url_redis = redis_server.url
        enqueue_rows(tmp_path, url_redis, "soak", single_rows(PROMPTS), tokenizer=tokenizer_path, batch_size=4)
        _, url = stack.devserver("--token-latency", "0.03", "--mean-output-tokens", "60", "--slots", "32")
        out = tmp_path / "out"
        clone = {**FAST, "EAGLE_SYNTH_HOSTNAME": "clone-host"}
        workers = {
            "a": stack.worker(servers=[url], out=out, redis_url=url_redis, env={**clone, "EAGLE_SYNTH_BOOT_ID": "a"}),
            "b": stack.worker(servers=[url], out=out, redis_url=url_redis, env={**clone, "EAGLE_SYNTH_BOOT_ID": "b"}),
            "frozen": stack.worker(servers=[url], out=out, redis_url=url_redis, env=FAST),
        }
        c = campaign(url_redis, "soak")
        children = {name: wait_for(lambda w=w: celery_child(w), timeout=60, what=name) for name, w in workers.items()}
        frozen = children["frozen"]

        def progressed(before: int) -> bool:
            done = c.progress().done + c.progress().failed
            return done > before or done == PROMPTS

        def frozen_leases() -> list[str]:
            return [
                key
                for key in (text(k) for k in c.client.scan_iter(match=f"{c.keys.lease('')}*", count=1000))
                if f"|{frozen.pid}|" in (text(c.client.get(key) or b""))
            ]

        for restart in range(1, RESTARTS + 1):
            before = c.progress().done + c.progress().failed
            wait_for(lambda before=before: progressed(before), timeout=60, what=f"progress before restart {restart}")
            if restart == 2:
                frozen.send_signal(signal.SIGSTOP)
            if restart == 3:
                children["a"].kill()  # SIGKILL of a Celery process: its supervisor brings it back
            if restart == 4:
                # A running batch's key is recorded failed and retried while the batch holds it.
                running = next(
                    (
                        TaskPayload.decode(s.payload)
                        for s in stored_batches(c.client, "soak")
                        if c.client.exists(c.keys.lease(s.batch))
                    ),
                    None,
                )
                if running is not None:
                    item = running.items[-1]
                    if not c.finished_keys([item.key]):
                        c.record_failure(
                            item, reason="server-error", message="soak", sampling=running.sampling_for(item)
                        )
                cli("retry-failed", "soak", "--redis", url_redis)
            redis_server.restart()
            if restart == 6:
                # Frozen past its lease: every lease it held has lapsed (or was taken) by now.
                wait_for(lambda: not frozen_leases(), timeout=60, what="the frozen worker's leases to lapse")
                frozen.send_signal(signal.SIGCONT)

        wait_finished(url_redis, "soak", expected=PROMPTS, stack=stack, timeout=120)
        assert_exactly_once(url_redis, "soak", out / "soak", expected=PROMPTS)
        assert c.progress().failed == 0
        for name, worker in workers.items():
            assert worker.alive(), f"worker {name} is alive"
            assert wait_for(lambda w=worker: celery_child(w), timeout=60, what=f"{name}'s Celery process")
        assert celery_child(workers["a"]).pid != children["a"].pid, "the killed process was started again"
    finally:
        redis_server.stop()
