"""The Celery worker: the generate task, the health gate step, and how the CLI starts it.

Run by `eagle-synth worker` (or `celery -A workers.app worker --pool threads` with the
EAGLE_SYNTH_* environment set). One task is one batch, on a thread of Celery's thread pool;
all batches send through one in-flight pool, whose tickets decide what is in flight. Every
way a task ends leaves each prompt with a record, a recorded failure, or its message back in
the queue: see `generate_batch`.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Task, bootsteps
from celery.bin.celery import celery as celery_command
from celery.exceptions import Reject, Retry
from celery.signals import after_setup_logger, worker_ready, worker_shutdown, worker_shutting_down
from celery.worker import state as worker_state

from eagle_synth import reasons
from eagle_synth.errors import (
    USER_ERROR_EXIT,
    BatchBusy,
    Cancelled,
    DiskUnavailable,
    PayloadError,
    ReadOnlyReplica,
    Requeue,
)
from eagle_synth.payload import TASK_NAME, TaskPayload
from eagle_synth.queue import HOST_QUEUE_SEPARATOR, make_celery
from eagle_synth.settings import TIMINGS, broker_settings
from eagle_synth.state.keys import CampaignKeys
from eagle_synth.state.node_state import NodeState
from eagle_synth.state.redis_client import STATE_UNAVAILABLE, connect
from eagle_synth.state.redis_role import is_read_only, read_only_message, refuse_replica
from eagle_synth.state.replicas import ReplicaWait
from workers import metrics
from workers.affinity import host_queues_enabled
from workers.batch import BatchRunner
from workers.config import WorkerConfig
from workers.disk import DiskState, probe_folder
from workers.handoff import Handoff
from workers.memory import limit_malloc_arenas, start_pool_threads
from workers.reaper import ReaperStep, SweepStep
from workers.reconciler import ReconcilerStep
from workers.redis_watch import RedisWatch
from workers.reservation import WAKE_INTERVAL, Demand, gate_consumption, reservation_enabled
from workers.servers.fleet import Fleet
from workers.servers.health import HealthGate
from workers.servers.model_check import ModelCheck
from workers.servers.routing import CampaignRouter

log = logging.getLogger("eagle_synth.worker")

# Seconds before a batch that hit an unexpected error is tried again.
UNEXPECTED_ERROR_RETRY_DELAY = TIMINGS.error_retry_delay
# Unexpected errors a batch may hit before its unfinished prompts are recorded as failed
# (reason `worker-error`, replayable with `retry-failed`).
UNEXPECTED_ERROR_RETRIES = 5
# Seconds before a copy of a batch that another thread holds is looked at again.
BUSY_RETRY_DELAY = 10
# Such looks are not failures; this only bounds a batch whose lease never lapses.
BUSY_RETRIES_MAX = 100_000
# Celery's own lines per task ("received", "succeeded in 0.10883279300014692s: {...}") repeat the
# worker's one line per batch (`batch X: N written, ...`): shown at --loglevel DEBUG only (their
# errors still show).
CELERY_PER_TASK_LOGGERS = ("celery.app.trace", "celery.worker.strategy")

app = make_celery()
_runner: BatchRunner | None = None
_runner_lock = threading.Lock()
# Set when the worker begins to shut down: batches finish what they can, then requeue.
STOPPING = threading.Event()
# Set when preflight refused every server: the process then exits with USER_ERROR_EXIT (2, docs/workers.md).
ALL_REFUSED = threading.Event()
# Set when Redis refused a write as a read-only replica: the process exits 2 too (a restart
# against the same replica would fail again; state/redis_role.py).
READ_ONLY = threading.Event()
# Seconds past the soft-shutdown timeout (the time batches have to finish or requeue) a
# stopping worker process may take to close its connections before StopDeadlineStep ends it.
STOP_DEADLINE_MARGIN = 30


@functools.cache
def _worker_config() -> WorkerConfig:
    """The process's settings: the environment's (the CLI writes them for its worker process)."""
    return WorkerConfig.from_env()


@functools.cache
def _fleet() -> Fleet:
    """The servers as this process knows them, with one client each: the health gate publishes
    their states, the batch threads route by them and report failures back (workers/servers/fleet.py)."""
    config = _worker_config()
    return Fleet(config.servers, api_key=config.api_key)


@functools.cache
def _router() -> CampaignRouter:
    """Which campaigns this process takes and on which servers: the health gate refreshes it,
    the batch threads read it (workers/servers/routing.py)."""
    config = _worker_config()
    settings = broker_settings()
    return CampaignRouter(
        client=connect(settings), base_queue=settings.queue, check=ModelCheck(_fleet().clients), pins=config.campaigns
    )


@functools.cache
def _disk_state() -> DiskState:
    """The output folder's state, shared by batch threads (which find it broken) and the gate
    (which stops taking batches until it works again)."""
    return DiskState(folder=Path(_worker_config().out))


@functools.cache
def _redis_watch() -> RedisWatch:
    """Whether Redis is safe to take batches on, shared by the gate (which re-reads its policy
    and persistence) and batch threads (which report replicas not acknowledging)."""
    config = _worker_config()
    return RedisWatch(
        connect(broker_settings()),
        allow_evicting=config.allow_evicting_redis,
        allow_volatile=config.allow_volatile_redis,
    )


def _get_runner(node: str) -> BatchRunner:
    global _runner
    with _runner_lock:
        if _runner is None:
            settings = broker_settings()
            replicas = ReplicaWait(
                connect(settings),
                min_replicas=settings.min_replicas,
                report=_redis_watch().report_replicas,
                stopping=STOPPING,
            )
            config = _worker_config()
            _runner = BatchRunner(
                config=config,
                node=node,
                stopping=STOPPING,
                disk=_disk_state(),
                app=app,
                replicas=replicas,
                router=_router(),
                fleet=_fleet(),
            )
        return _runner


@after_setup_logger.connect
def _quiet_per_task_lines(loglevel: int | str | None = None, **_: object) -> None:
    level = logging.getLevelName(loglevel) if isinstance(loglevel, str) else loglevel
    if not isinstance(level, int) or level > logging.DEBUG:
        for name in CELERY_PER_TASK_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


@worker_shutting_down.connect
def _on_shutdown(**_: object) -> None:
    STOPPING.set()


@worker_ready.connect
def _on_ready(sender: Any = None, **_: object) -> None:
    # Conversations' next turns held by a dead worker process are adopted even by a worker
    # that has no batch yet (the queue may be empty precisely because they wait).
    _get_runner(getattr(sender, "hostname", None) or "eagle-synth@unknown").followups.start()
    start_pool_threads(getattr(sender, "pool", None))  # RSS flat after warm-up: see its docstring


@worker_shutdown.connect
def _on_worker_shutdown(**_: object) -> None:
    if _runner is not None:
        _runner.followups.close()


def _stop_on_a_replica() -> None:
    """Stop this worker, to exit 2, saying which replica refused the write and its master."""
    if READ_ONLY.is_set():
        return
    READ_ONLY.set()
    log.error("%s; stopping this worker (exit 2)", read_only_message(connect(broker_settings())))
    os.kill(os.getpid(), signal.SIGTERM)


def _exit_code(code: int) -> int:
    """The process's exit code: USER_ERROR_EXIT (2) when restarting cannot help, else `code`."""
    return USER_ERROR_EXIT if ALL_REFUSED.is_set() or READ_ONLY.is_set() else code


@app.task(name=TASK_NAME, bind=True, acks_late=True, ignore_result=True, max_retries=None)
def generate_batch(self: Task, payload: dict, errors: int = 0) -> dict:
    """Generate one batch of prompts and write their records.

    Endings: all prompts recorded or failed (ack); Requeue or DiskUnavailable (the message goes
    back to the queue); another thread holds the batch (retry later); Redis unreachable (retry
    later, uncounted); any other error (retry later; after UNEXPECTED_ERROR_RETRIES the prompts
    still open are recorded as `worker-error` failures).
    """
    try:
        batch = TaskPayload.decode(payload)
    except PayloadError as exc:
        # Not ours or corrupt: no prompt keys can be read from it, so nothing can be recorded.
        log.error("dropping a message that is not an eagle-synth payload: %s", exc)
        return {"error": str(exc)}
    name = batch.batch
    node = self.request.hostname or "eagle-synth@unknown"

    def retry(exc: Exception, countdown: float, *, errors: int = errors, max_retries: int | None = None) -> None:
        """A copy with a countdown; if even that cannot be published, the message goes back."""
        try:
            kwargs = {"errors": errors}
            raise self.retry(args=(payload,), kwargs=kwargs, exc=exc, countdown=countdown, max_retries=max_retries)
        except Retry:
            raise
        except Exception as publish_error:
            raise Reject(f"retry not published ({publish_error}); requeued", requeue=True) from exc

    try:
        outcome = _get_runner(node).run(batch)
    except Cancelled as exc:
        log.info("batch %s: %s; stopped, nothing more written", name, exc)
        return {"cancelled": True}
    except Requeue as exc:
        if _get_runner(node).redis_client.exists(CampaignKeys(batch.campaign).cancelled):
            # Cancelled meanwhile (its lease went with its state): nothing goes back.
            log.info("batch %s: campaign %s was cancelled; not requeued", name, batch.campaign)
            return {"cancelled": True}
        log.info("batch %s back to the queue: %s", name, exc)
        raise Reject(str(exc), requeue=True) from exc
    except DiskUnavailable as exc:
        log.error("batch %s back to the queue: %s; not taking batches until it can be written", name, exc)
        raise Reject(str(exc), requeue=True) from exc
    except BatchBusy as exc:
        # A second copy of a batch another thread runs (after a broker reconnection): look
        # again later, when the holder has finished or its lease has lapsed.
        log.info("batch %s: %s; trying again in %d s", name, exc, BUSY_RETRY_DELAY)
        retry(exc, BUSY_RETRY_DELAY, max_retries=BUSY_RETRIES_MAX)
    except STATE_UNAVAILABLE as exc:
        delay = UNEXPECTED_ERROR_RETRY_DELAY
        log.warning("batch %s: campaign state unavailable (%s); trying again in %g s", name, exc, delay)
        retry(exc, delay)
    except Exception as exc:  # the catch-all: nothing leaves this task unaccounted for
        if is_read_only(exc):  # a replica takes no write, not even a failure's: stop the worker
            _stop_on_a_replica()
            raise Reject(f"Redis is a read-only replica ({exc}); requeued", requeue=True) from exc
        tries = (name, errors + 1, UNEXPECTED_ERROR_RETRIES)
        if errors + 1 < UNEXPECTED_ERROR_RETRIES:
            log.exception(
                "batch %s: unexpected error %d/%d; trying again in %g s", *tries, UNEXPECTED_ERROR_RETRY_DELAY
            )
            retry(exc, UNEXPECTED_ERROR_RETRY_DELAY, errors=errors + 1)
        log.exception("batch %s: unexpected error %d/%d; recording its open prompts as failed", *tries)
        try:
            failed = _get_runner(node).fail_unfinished(
                batch, reason=reasons.WORKER_ERROR, message=f"{type(exc).__name__}: {exc}"
            )
        except Exception as record_exc:
            raise Reject(f"could not record failures: {record_exc}", requeue=True) from exc
        return {"written": 0, "failed": {reasons.WORKER_ERROR: failed}}
    counts = (outcome.written, outcome.skipped_done, outcome.adopted, outcome.failed, outcome.repaired)
    log.info("batch %s: %d written, %d already done, %d adopted, failed %s, %d repaired", name, *counts)
    return {"written": outcome.written, "failed": outcome.failed}


def with_host_queue(act: Callable[[str], object], node: str) -> Callable[[str], None]:
    """`act` on a campaign's queue and, with host queues on, on this worker's host queue of
    it (workers/handoff.py): the worker takes its own next turns while it takes the campaign."""

    def both(queue: str) -> None:
        act(queue)
        if host_queues_enabled():
            act(f"{queue}{HOST_QUEUE_SEPARATOR}{node}")

    return both


class HealthGateStep(bootsteps.StartStopStep):
    """Consumer step: consume campaigns' queues only while a server is healthy, and only those of
    campaigns a healthy server serves (workers/servers/routing.py). Starts with none (the base queue
    cancelled before the first fetch) for the HealthGate to add; a consumer restart (broker
    reconnection) keeps what the gate selected, Celery's own queue selection."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.gate: HealthGate | None = None

    def start(self, c: Any) -> None:
        settings = broker_settings()
        hub = getattr(c, "hub", None)

        def in_loop(fn: Callable[[str], object]) -> Callable[[str], Any]:
            return lambda queue: hub.call_soon(fn, queue) if hub is not None else fn(queue)

        def all_refused() -> None:
            log.error("every server was refused by preflight: stopping this worker (exit 2)")
            ALL_REFUSED.set()
            os.kill(os.getpid(), signal.SIGTERM)

        if self.gate is None:
            # The base queue the worker was started on holds no campaign's batches: it takes
            # the campaigns' own queues, as the gate finds servers for them.
            c.cancel_task_queue(settings.queue)
        else:
            return  # a consumer restart keeps the queues the gate selected
        config = _worker_config()
        node_state = NodeState(connect(settings), c.hostname)
        node_state.reset(list(config.servers))
        disk = _disk_state()
        if problem := probe_folder(disk.folder):
            log.error("the output folder cannot take records: %s; not taking batches until it can", problem)
            disk.failed(problem)
        consume = in_loop(with_host_queue(c.add_task_queue, c.hostname))
        stop = in_loop(with_host_queue(c.cancel_task_queue, c.hostname))
        self.gate = HealthGate(
            config=config,
            node_state=node_state,
            router=_router(),
            on_consume=consume,
            on_stop=stop,
            disk=disk,
            on_all_refused=all_refused,
            redis_watch=_redis_watch(),
            fleet=_fleet(),
        )
        self.gate.start()

    def shutdown(self, c: Any) -> None:
        if self.gate is not None:
            self.gate.stop()


class HandoffStep(SweepStep):
    """Consumer step: hand next turns waiting in host queues to their campaigns' queues
    (workers/handoff.py)."""

    label = "handoff"

    def sweeper(self, c: Any) -> Handoff:
        return Handoff(connect(broker_settings()), node=c.hostname)


class ReservationStep(bootsteps.StartStopStep):
    """Consumer step: take a further batch only while the in-flight pool needs one
    (workers/reservation.py), so a worker holds little more than it keeps in flight and a
    campaign's last batches go to the workers with free slots. Applied again to the new channel
    after a consumer restart; the loop is woken every WAKE_INTERVAL s to look."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.wake: Any = None

    def start(self, c: Any) -> None:
        if not reservation_enabled() or c.task_consumer is None:
            return
        runner = _get_runner(c.hostname)
        demand = Demand(
            pool=runner.pool,
            held=lambda: len(worker_state.reserved_requests),
            feeding=lambda: runner.feeding,
            batch_size=lambda: runner.last_batch_size,
        )
        gate_consumption(c.task_consumer.channel.qos, demand.wants_more)
        hub = getattr(c, "hub", None)
        if hub is not None and self.wake is None:
            self.wake = hub.call_repeatedly(WAKE_INTERVAL, lambda: None)

    def shutdown(self, c: Any) -> None:
        if self.wake is not None:
            self.wake.cancel()
            self.wake = None


class StopDeadlineStep(bootsteps.StartStopStep):
    """Worker step: once the worker begins to stop, by a signal or by an error, batches wind down
    (STOPPING) and the process ends within the soft-shutdown timeout plus STOP_DEADLINE_MARGIN
    seconds, whatever still holds it, with the worker's exit code (0 when stopped; 1 after
    kombu's "Unrecoverable error", which the supervisor restarts; 2 when preflight refused every
    server). A stop after a Redis restart was seen to hang with no exit, and a supervisor
    restarts only a process that ended.
    """

    requires = {"celery.worker.components:Pool"}

    def stop(self, w: Any) -> None:
        STOPPING.set()
        deadline = broker_settings().soft_shutdown_timeout + STOP_DEADLINE_MARGIN

        def end() -> None:
            code = _exit_code(w.exitcode if isinstance(w.exitcode, int) else 1)
            log.error("the worker did not finish stopping in %d s; ending it (exit code %d)", deadline, code)
            logging.shutdown()
            os._exit(code)

        timer = threading.Timer(deadline, end)
        timer.daemon = True
        timer.start()


app.steps["worker"].add(StopDeadlineStep)
app.steps["consumer"].add(HealthGateStep)
app.steps["consumer"].add(ReservationStep)
app.steps["consumer"].add(HandoffStep)
app.steps["consumer"].add(ReaperStep)
app.steps["consumer"].add(ReconcilerStep)


def run_worker(*, concurrency: int, loglevel: str, name: str, task_events: bool) -> None:
    """Start a Celery worker named `name` in this process (blocks until it stops) with `concurrency`
    batch threads; the supervised child (workers/supervisor.py) calls it with supervise_worker's options."""
    limit_malloc_arenas()  # before Celery starts the batch threads
    config = _worker_config()  # a bad setting stops the process here, before Celery starts
    _refuse_a_replica()
    if config.metrics_port is not None:
        try:
            metrics.serve(port=config.metrics_port, address=config.metrics_address, servers=config.servers)
        except OSError as exc:
            # The CLI checked the port at start; taken since: the supervisor tries again after its backoff.
            log.error("cannot serve metrics on %s:%d: %s", config.metrics_address, config.metrics_port, exc)
            raise SystemExit(1) from exc
    app.conf.worker_send_task_events = task_events
    argv = ["--app", "workers.app:app", "worker", "--queues", broker_settings().queue, "--hostname", name]
    argv += ["--concurrency", str(concurrency), "--loglevel", loglevel, *(["--task-events"] if task_events else [])]
    argv += ["--pool", "threads", "--without-gossip", "--without-mingle", "--prefetch-multiplier", "1"]
    # The celery command itself: app.worker_main and app.start drop the worker's exit code, so a
    # Celery ended by kombu's "Unrecoverable error" (1) exited 0, as if stopped.
    code = celery_command.main(args=argv, standalone_mode=False)
    if code and not READ_ONLY.is_set():  # kombu ends Celery on a READONLY reply to its own writes
        _refuse_a_replica()
    raise SystemExit(_exit_code(code))


def _refuse_a_replica() -> None:
    """Exit 2 with one line if REDIS_URL names a read-only replica (unreachable: Celery will say)."""
    try:
        refuse_replica(connect(broker_settings()))
    except ReadOnlyReplica as exc:
        log.error("%s; stopping this worker (exit 2)", exc)
        raise SystemExit(USER_ERROR_EXIT) from None
    except redis.RedisError:
        pass
