"""SlotScheduler: SGLang's running batch and waiting queue, reduced to slot timing.

Each prompt is a SlotJob whose generation time is known in advance (prefill latency plus
one token latency per output token), so one thread can run the whole "GPU": it admits waiting
jobs into free slots in FIFO order and completes each when its time is up. Handler threads
just wait on their job's event, so hundreds of queued prompts cost no extra threads.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from eagle_synth.errors import EagleSynthError

# Outcomes a waiting handler can find on its job.
PENDING, FINISHED, KILLED = "pending", "finished", "killed"
ABORTED_WAITING, ABORTED_RUNNING = "aborted_waiting", "aborted_running"


class QueueFullError(EagleSynthError):
    """More prompts would wait than --max-queued-requests allows."""


@dataclass(eq=False)
class SlotJob:
    """One prompt's stay on the emulated GPU: its `rid`, the client's `group_rid` (which
    /abort_request may name) and the `output_tokens` it generates; the scheduler sets the rest
    (`outcome`, `tokens_done` for a running abort, `done` once it ends)."""

    rid: str
    group_rid: str
    output_tokens: int
    outcome: str = PENDING
    tokens_done: int = 0
    admitted_at: float = 0.0
    decode_start: float = 0.0
    finish_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def aborted(self) -> bool:
        return self.outcome in (ABORTED_WAITING, ABORTED_RUNNING)


class SlotScheduler:
    """At most `slots` jobs run at once; the rest wait in arrival order.

    Behaviour: a job admitted at time t holds its slot until
    t + prefill_latency + output_tokens * token_latency. Jobs of zero duration with a free
    slot and nobody waiting complete in the caller's thread. `abort` ends matching jobs
    (waiting ones with no tokens, running ones with the tokens generated so far); `kill_all`
    ends every job as if the GPU died.

    Parameters:
        slots: running slots.
        max_queued: waiting jobs allowed beyond free slots; None = unbounded.
        token_latency, prefill_latency: seconds, see above.
        on_done: called (outside the lock) with each job that leaves a slot and the seconds
            it held it; the stats use it for busy slot-seconds.
        on_load: called with (running, waiting) after every change, for peak counters.
    """

    def __init__(
        self,
        *,
        slots: int,
        max_queued: int | None,
        token_latency: float,
        prefill_latency: float,
        on_done: Callable[[SlotJob, float], None] = lambda job, held: None,
        on_load: Callable[[int, int], None] = lambda running, waiting: None,
    ) -> None:
        self.slots, self.max_queued = slots, max_queued
        self.token_latency, self.prefill_latency = token_latency, prefill_latency
        self._on_done, self._on_load = on_done, on_load
        self._cond = threading.Condition()
        self._waiting: deque[SlotJob] = deque()
        self._running: list[tuple[float, int, SlotJob]] = []  # heap by finish time
        self._tie = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="devserver-scheduler", daemon=True)
        self._thread.start()

    @property
    def load(self) -> tuple[int, int]:
        """(running, waiting)."""
        with self._cond:
            return len(self._running), len(self._waiting)

    def duration(self, output_tokens: int) -> float:
        return self.prefill_latency + output_tokens * self.token_latency

    def submit(self, jobs: Iterable[SlotJob]) -> None:
        """Queue jobs (all or none); raises QueueFullError past --max-queued-requests."""
        jobs = list(jobs)
        finished: list[tuple[SlotJob, float]] = []
        with self._cond:
            if self._stopped:
                return _kill(jobs)
            if self.max_queued is not None:
                free = self.slots - len(self._running)
                would_wait = len(self._waiting) + max(0, len(jobs) - max(free, 0))
                if would_wait > self.max_queued:
                    raise QueueFullError("The request queue is full.")
            for job in jobs:
                if not self._waiting and len(self._running) < self.slots and self.duration(job.output_tokens) == 0:
                    job.admitted_at = job.decode_start = job.finish_at = time.monotonic()
                    job.outcome, job.tokens_done = FINISHED, job.output_tokens
                    finished.append((job, 0.0))
                else:
                    self._waiting.append(job)
            self._on_load(len(self._running), len(self._waiting))
            self._cond.notify()
        self._finish(finished)

    def abort(self, *, rids: set[str] | None) -> int:
        """End jobs whose rid or group rid is in `rids` (None = all); returns how many."""

        def named(job: SlotJob) -> bool:
            return rids is None or job.rid in rids or job.group_rid in rids

        now = time.monotonic()
        with self._cond:
            ended = [(job, 0.0) for job in self._waiting if named(job)]
            for job, _ in ended:
                job.outcome = ABORTED_WAITING
            self._waiting = deque(job for job in self._waiting if not named(job))
            for _, _, job in self._running:
                if named(job):
                    job.outcome, job.tokens_done = ABORTED_RUNNING, self._tokens_at(job, now)
                    ended.append((job, now - job.admitted_at))
            self._running = [entry for entry in self._running if not named(entry[2])]
            heapq.heapify(self._running)
            self._on_load(len(self._running), len(self._waiting))
            self._cond.notify()
        self._finish(ended)
        return len(ended)

    def kill_all(self) -> None:
        """The GPU died: every job ends as KILLED and later submissions are killed at once."""
        with self._cond:
            self._stopped = True
            jobs = list(self._waiting) + [entry[2] for entry in self._running]
            self._waiting.clear()
            self._running.clear()
            self._cond.notify()
        _kill(jobs)

    def _tokens_at(self, job: SlotJob, now: float) -> int:
        if self.token_latency <= 0:
            return job.output_tokens if now >= job.decode_start else 0
        return max(0, min(job.output_tokens, int((now - job.decode_start) / self.token_latency)))

    def _finish(self, jobs: list[tuple[SlotJob, float]]) -> None:
        for job, held in jobs:
            self._on_done(job, held)
            job.done.set()

    def _loop(self) -> None:
        while True:
            finished: list[tuple[SlotJob, float]] = []
            with self._cond:
                if self._stopped:
                    return
                now = time.monotonic()
                # Like SGLang's scheduler step: finished sequences leave first, and their slots
                # go to waiting prompts in the same step.
                while self._running and self._running[0][0] <= now:
                    job = heapq.heappop(self._running)[2]
                    job.outcome, job.tokens_done = FINISHED, job.output_tokens
                    finished.append((job, job.finish_at - job.admitted_at))
                while self._waiting and len(self._running) < self.slots:
                    job = self._waiting.popleft()
                    job.admitted_at = now
                    job.decode_start = now + self.prefill_latency
                    job.finish_at = now + self.duration(job.output_tokens)
                    heapq.heappush(self._running, (job.finish_at, next(self._tie), job))
                self._on_load(len(self._running), len(self._waiting))
                if not finished:
                    if self._waiting and len(self._running) < self.slots:
                        continue
                    timeout = self._running[0][0] - now if self._running else None
                    self._cond.wait(timeout)
            self._finish(finished)


def _kill(jobs: list[SlotJob]) -> None:
    for job in jobs:
        job.outcome = KILLED
        job.done.set()
