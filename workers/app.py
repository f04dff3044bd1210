"""The Celery worker: the generate task, the health gate step, and how the CLI starts it.

Run by `eagle-synth worker` (or `celery -A workers.app worker` with the EAGLE_SYNTH_*
environment set). One task is one batch; a pool child runs one batch at a time, so the pool
size times the batch size is the number of prompts in flight.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid

import redis
from celery import bootsteps
from celery.exceptions import Reject
from celery.signals import worker_process_init

from eagle_synth.node_state import NodeState
from eagle_synth.payload import TASK_NAME, PayloadError, TaskPayload
from eagle_synth.queue import make_celery
from eagle_synth.redis_client import connect
from eagle_synth.settings import broker_settings
from workers.batch import BatchRunner, Requeue
from workers.config import WorkerConfig
from workers.health import HealthGate
from workers.lease import BatchBusy
from workers.reaper import ReaperStep

log = logging.getLogger("eagle_synth.worker")

# Seconds before a batch that failed on a worker bug or a Redis outage is tried again.
UNEXPECTED_ERROR_RETRY_DELAY = 15
# Seconds before a copy of a batch that another child holds is looked at again.
BUSY_RETRY_DELAY = 10
# Such looks are not failures; this only bounds a batch whose lease never lapses.
BUSY_RETRIES_MAX = 100_000
# Times such a batch is retried before its messages are dropped with an error logged.
UNEXPECTED_ERROR_RETRIES = 20

app = make_celery()
_runner: BatchRunner | None = None


def _get_runner(node: str) -> BatchRunner:
    global _runner
    if _runner is None:
        settings = broker_settings()
        _runner = BatchRunner(
            config=WorkerConfig.from_env(), redis_client=connect(settings), node=node,
            task_budget=settings.task_budget_seconds,
        )
    return _runner


@worker_process_init.connect
def _fresh_child(**_: object) -> None:
    # Connections must not be shared across fork.
    global _runner
    _runner = None


@app.task(name=TASK_NAME, bind=True, acks_late=True, ignore_result=True,
          max_retries=UNEXPECTED_ERROR_RETRIES)
def generate_batch(self, payload: dict) -> dict:
    """Generate one batch of prompts and write their records."""
    try:
        batch = TaskPayload.decode(payload)
    except PayloadError as exc:
        # Nothing can be done with it, and requeueing would loop; say so loudly.
        log.error("dropping a message that is not an eagle-synth payload: %s", exc)
        return {"error": str(exc)}
    node = self.request.hostname or "eagle-synth@unknown"
    try:
        delivery = self.request.delivery_info or {}
        retried = bool(delivery.get("redelivered")) or bool(self.request.retries)
        outcome = _get_runner(node).run(batch, retried=retried)
    except Requeue as exc:
        log.info("batch %s back to the queue: %s", batch.batch, exc)
        raise Reject(str(exc), requeue=True) from exc
    except BatchBusy as exc:
        # A second copy of a batch another child is running (after a broker reconnection):
        # look again later, when the holder has finished or its lease has lapsed.
        log.info("batch %s: %s; trying again in %d s", batch.batch, exc, BUSY_RETRY_DELAY)
        raise self.retry(exc=exc, countdown=BUSY_RETRY_DELAY, max_retries=BUSY_RETRIES_MAX)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        # Campaign state is unreachable: the batch is intact, try it again later.
        raise self.retry(exc=exc, countdown=UNEXPECTED_ERROR_RETRY_DELAY)
    log.info(
        "batch %s: %d written, %d already done, %d adopted, failed %s, %d repaired",
        batch.batch, outcome.written, outcome.skipped_done, outcome.adopted, outcome.failed, outcome.repaired,
    )
    return {"written": outcome.written, "failed": outcome.failed}


class HealthGateStep(bootsteps.StartStopStep):
    """Consumer step: consume the queue only while a server is healthy.

    Starts closed (the queue is cancelled before the first fetch) and lets the HealthGate
    open it; survives consumer restarts (broker reconnections) by re-applying the gate.
    """

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self.gate: HealthGate | None = None

    def start(self, c):
        settings = broker_settings()
        queue = settings.queue
        hub = getattr(c, "hub", None)

        def in_loop(fn, *args):
            if hub is not None:
                hub.call_soon(fn, *args)
            else:
                fn(*args)

        def open_gate():
            in_loop(c.add_task_queue, queue)

        def close_gate():
            in_loop(c.cancel_task_queue, queue)
            if self.gate is not None and self.gate.all_refused():
                log.error("every server was refused by preflight: stopping this worker")
                os.kill(os.getpid(), signal.SIGTERM)

        if self.gate is None:
            c.cancel_task_queue(queue)
            config = WorkerConfig.from_env()
            node_state = NodeState(connect(settings), c.hostname)
            node_state.reset(list(config.servers))
            self.gate = HealthGate(
                servers=list(config.servers), node_state=node_state, on_open=open_gate,
                on_close=close_gate, allow_server_parsers=config.allow_server_parsers,
                probe_timeout=config.probe_timeout,
            )
            self.gate.start()
        elif not self.gate.is_open:
            c.cancel_task_queue(queue)

    def shutdown(self, c):
        if self.gate is not None:
            self.gate.stop()


app.steps["consumer"].add(HealthGateStep)
app.steps["consumer"].add(ReaperStep)


def run_worker(*, config: WorkerConfig, concurrency: int, loglevel: str = "INFO",
               name: str | None = None, task_events: bool = True) -> None:
    """Start a Celery worker in this process (blocks until it stops)."""
    os.environ.update(config.to_env())
    settings = broker_settings()
    node = name or f"eagle-synth-{uuid.uuid4().hex[:6]}@%h"
    app.conf.worker_send_task_events = task_events
    app.worker_main([
        "worker",
        "--queues", settings.queue,
        "--concurrency", str(concurrency),
        "--pool", "prefork",
        "--hostname", node,
        "--loglevel", loglevel,
        *(["--task-events"] if task_events else []),
        "--without-gossip",
        "--without-mingle",
        "--prefetch-multiplier", "1",
    ])
