"""The emulated GPU's state: SlotScheduler (SGLang's running batch and waiting queue, reduced
to slot timing), PrefixCache (`cached_tokens`, looked up as a prompt is admitted) and DevStats
(the /dev/stats counters).

Each prompt is a SlotJob whose generation time is known when it is admitted (prefill latency,
its wait for the shared prefill engine when prefill is charged, one token latency per output
token), so one thread can run the whole "GPU": it admits waiting jobs into free slots in FIFO
order and completes each when its time is up. Handler threads just wait on their job's event,
so hundreds of queued prompts cost no extra threads.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eagle_synth.errors import QueueFullError

if TYPE_CHECKING:
    from eagle_synth.devserver.config import DevServerConfig

# Outcomes a waiting handler can find on its job.
PENDING = "pending"
FINISHED = "finished"
ABORTED_WAITING = "aborted_waiting"
ABORTED_RUNNING = "aborted_running"


@dataclass(eq=False)
class SlotJob:
    """One prompt's stay on the emulated GPU; the scheduler sets the fields after `output_tokens`."""

    rid: str
    group_rid: str
    output_tokens: int
    prompt_ids: Sequence[int] = ()
    # Set at admission: prompt tokens the prefix cache held, and the rest, which the GPU prefills.
    cached_tokens: int = 0
    prefill_tokens: int = 0
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
    """At most config.slots jobs run at once, each for prefill_latency + output_tokens *
    token_latency; the rest wait in arrival order (at most max_queued_requests beyond free
    slots). With config.charge_prefill an admitted job first waits for its `prefill_tokens` on
    one prefill engine of config.prefill_throughput tokens/s that all jobs share in admission
    order (a GPU's prefill batches), so a server's prefill work per second is bounded. Jobs of
    zero duration with a free slot and nobody waiting complete in the caller's thread. `stats`
    gets each job's slot-seconds (outside the lock) and the load on every change.
    """

    def __init__(self, config: DevServerConfig, stats: DevStats, cache: PrefixCache) -> None:
        self.slots = config.slots
        self.cache = cache
        self.max_queued = config.max_queued_requests
        self.stats = stats
        self.token_latency = config.token_latency
        self.prefill_latency = config.prefill_latency
        # Seconds per uncached prompt token (0: prefill is free).
        self.prefill_cost = 1.0 / config.prefill_throughput if config.charge_prefill else 0.0
        # When the shared prefill engine has done all the prefill admitted so far.
        self._prefill_free_at = 0.0
        self._cond = threading.Condition()
        self._waiting: deque[SlotJob] = deque()
        self._running: list[tuple[float, int, SlotJob]] = []  # heap by finish time
        self._tie = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="devserver-scheduler", daemon=True)
        self._thread.start()

    @property
    def load(self) -> tuple[int, int]:
        with self._cond:
            return len(self._running), len(self._waiting)

    def instant(self, job: SlotJob) -> bool:
        """Whether the job takes no time at all (nothing charged for prefill or decoding)."""
        return not self.prefill_cost and self.prefill_latency + job.output_tokens * self.token_latency == 0

    def submit(self, jobs: list[SlotJob]) -> None:
        """Queue jobs (all or none, else QueueFullError)."""
        finished: list[tuple[SlotJob, float]] = []
        with self._cond:
            if self.max_queued is not None:
                free = self.slots - len(self._running)
                would_wait = len(self._waiting) + max(0, len(jobs) - max(free, 0))
                if would_wait > self.max_queued:
                    raise QueueFullError("The request queue is full.")
            for job in jobs:
                if not self._waiting and len(self._running) < self.slots and self.instant(job):
                    self._look_up(job)
                    job.admitted_at = time.monotonic()
                    job.decode_start = job.admitted_at
                    job.finish_at = job.admitted_at
                    job.outcome = FINISHED
                    job.tokens_done = job.output_tokens
                    finished.append((job, 0.0))
                else:
                    self._waiting.append(job)
            self.stats.load(len(self._running), len(self._waiting))
            self._cond.notify()
        self._finish(finished)

    def abort(self, *, rids: set[str] | None) -> None:
        """End jobs whose rid or group rid is in `rids` (None = all), running ones with the
        tokens generated so far."""

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
                    job.outcome = ABORTED_RUNNING
                    job.tokens_done = self._tokens_at(job, now)
                    ended.append((job, now - job.admitted_at))
            self._running = [entry for entry in self._running if not named(entry[2])]
            heapq.heapify(self._running)
            self.stats.load(len(self._running), len(self._waiting))
            self._cond.notify()
        self._finish(ended)

    def _look_up(self, job: SlotJob) -> None:
        """At admission: what of the prompt the cache holds; from now on the cache holds all of it,
        as SGLang caches a running request's prompt once prefilled, and a prompt admitted later is
        prefilled after this one on the shared engine anyway."""
        job.cached_tokens = self.cache.lookup(job.prompt_ids)
        job.prefill_tokens = len(job.prompt_ids) - job.cached_tokens
        self.cache.insert(job.prompt_ids)

    def _prefilled_at(self, job: SlotJob, now: float) -> float:
        """When the shared prefill engine finishes the job's uncached tokens (call under the lock)."""
        if not job.prefill_tokens or not self.prefill_cost:
            return now
        self._prefill_free_at = max(now, self._prefill_free_at) + job.prefill_tokens * self.prefill_cost
        return self._prefill_free_at

    def _tokens_at(self, job: SlotJob, now: float) -> int:
        if self.token_latency <= 0:
            return job.output_tokens if now >= job.decode_start else 0
        return max(0, min(job.output_tokens, int((now - job.decode_start) / self.token_latency)))

    def _finish(self, jobs: list[tuple[SlotJob, float]]) -> None:
        for job, held in jobs:
            self.stats.add(busy_slot_seconds=held)
            job.done.set()

    def _loop(self) -> None:
        while True:
            finished: list[tuple[SlotJob, float]] = []
            with self._cond:
                now = time.monotonic()
                # Like SGLang's scheduler step: finished sequences leave first, and their slots
                # go to waiting prompts in the same step.
                while self._running and self._running[0][0] <= now:
                    job = heapq.heappop(self._running)[2]
                    job.outcome = FINISHED
                    job.tokens_done = job.output_tokens
                    finished.append((job, job.finish_at - job.admitted_at))
                while self._waiting and len(self._running) < self.slots:
                    job = self._waiting.popleft()
                    self._look_up(job)
                    job.admitted_at = now
                    job.decode_start = self._prefilled_at(job, now) + self.prefill_latency
                    job.finish_at = job.decode_start + job.output_tokens * self.token_latency
                    heapq.heappush(self._running, (job.finish_at, next(self._tie), job))
                self.stats.load(len(self._running), len(self._waiting))
                if not finished:
                    timeout = self._running[0][0] - now if self._running else None
                    self._cond.wait(timeout)
            self._finish(finished)


# Cache granularity: prefixes are remembered per block of this many tokens, so cached_tokens
# is a multiple of it (real SGLang with page size 1 is exact to the token).
BLOCK_TOKENS = 16
# Stale entries the leaf heap may hold per live block before it is rebuilt (bounds its memory).
HEAP_SLACK = 2


class PrefixCache:
    """Remembers sequences as chains of full blocks (each keyed by the hash of everything before
    it, so equal blocks at different places do not collide): a tree like SGLang's radix cache.
    `lookup` counts a prompt's known leading blocks, capped at len(prompt) - 1 because SGLang
    always computes at least one token, and marks them used. Past `budget_tokens` the least
    recently used leaves go first, as SGLang's radix cache evicts, so a shared prefix outlives
    the branches that extend it and a chain never loses its middle.

    Parameters:
        budget_tokens: tokens kept at most (0: nothing is cached).
    """

    def __init__(self, budget_tokens: int) -> None:
        self.max_blocks = budget_tokens // BLOCK_TOKENS
        self._parent: dict[int, int] = {}  # block -> the block before it (0: the root)
        self._children: dict[int, int] = {}  # block -> blocks extending it
        self._used: dict[int, int] = {}  # block -> its last use (a tick)
        self._leaves: list[tuple[int, int]] = []  # heap of (last use, block); stale entries skipped
        self._tick = itertools.count(1)
        self._lock = threading.Lock()

    def _keys(self, ids: Sequence[int]) -> list[int]:
        b = BLOCK_TOKENS
        blocks = (tuple(ids[start : start + b]) for start in range(0, len(ids) - b + 1, b))
        return list(itertools.accumulate(blocks, lambda key, block: hash((key, block)), initial=0))[1:]

    def lookup(self, prompt_ids: Sequence[int]) -> int:
        keys = self._keys(prompt_ids)
        with self._lock:
            known = list(itertools.takewhile(self._used.__contains__, keys))
            self._touch(known)
        return min(len(known) * BLOCK_TOKENS, max(len(prompt_ids) - 1, 0))

    def insert(self, ids: Sequence[int]) -> None:
        """Remember a sequence: a prompt once admitted, prompt + output when finished (as SGLang)."""
        keys = self._keys(ids)
        if not self.max_blocks:
            return
        with self._lock:
            parent = 0
            for key in keys:
                if key not in self._used:
                    self._parent[key] = parent
                    self._children[key] = 0
                    self._used[key] = 0
                    if parent:
                        self._children[parent] += 1
                parent = key
            self._touch(keys)
            self._evict()

    def flush(self) -> None:
        with self._lock:
            self._parent.clear()
            self._children.clear()
            self._used.clear()
            self._leaves.clear()

    def _touch(self, chain: list[int]) -> None:
        """Mark a chain used now (under the lock); its last block is the one a leaf may be."""
        tick = next(self._tick)
        for key in chain:
            self._used[key] = tick
        if chain and not self._children[chain[-1]]:
            heapq.heappush(self._leaves, (tick, chain[-1]))
        if len(self._leaves) > HEAP_SLACK * len(self._used) + BLOCK_TOKENS:
            self._leaves = [(used, key) for key, used in self._used.items() if not self._children[key]]
            heapq.heapify(self._leaves)

    def _evict(self) -> None:
        """Drop least recently used leaves until within budget (under the lock)."""
        while len(self._used) > self.max_blocks and self._leaves:
            used, key = heapq.heappop(self._leaves)
            if self._used.get(key) != used or self._children[key]:
                continue  # used again since, or extended: a newer entry or none stands for it
            del self._used[key]
            del self._children[key]
            parent = self._parent.pop(key)
            if parent:
                self._children[parent] -= 1
                if not self._children[parent]:
                    heapq.heappush(self._leaves, (self._used[parent], parent))


# Every counter /dev/stats reports, in its order (after uptime and started_at).
COUNTERS = (
    *("generate_requests", "generate_calls_before_healthy", "first_generate_at", "prompts", "output_tokens"),
    *("busy_slot_seconds", "injected_failures", "injected_drops", "client_errors", "queue_full", "aborted"),
    *("health_requests", "health_unavailable", "health_trickled", "injected_malformed", "deprecated_info_calls"),
    *("peak_running", "peak_waiting", "peak_prompts", "prompt_tokens", "cached_tokens"),
)


class DevStats:
    """Thread-safe counters since start (`reset()` zeroes them but keeps the uptime clock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._counts: dict[str, Any] = {**dict.fromkeys(COUNTERS, 0), "busy_slot_seconds": 0.0}
            self._counts["first_generate_at"] = None

    def add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] += amount

    def generate_received(self, *, healthy: bool) -> None:
        with self._lock:
            self._counts["generate_requests"] += 1
            self._counts["generate_calls_before_healthy"] += not healthy
            if self._counts["first_generate_at"] is None:
                self._counts["first_generate_at"] = time.time()

    def load(self, running: int, waiting: int) -> None:
        # Called under the scheduler lock on every change: keep it tiny.
        counts = self._counts
        counts["peak_running"] = max(counts["peak_running"], running)
        counts["peak_waiting"] = max(counts["peak_waiting"], waiting)
        counts["peak_prompts"] = max(counts["peak_prompts"], running + waiting)

    def snapshot(self, **live: Any) -> dict[str, Any]:
        """The /dev/stats body, with the current values in `live`."""
        with self._lock:
            return {
                "uptime": time.monotonic() - self._started_mono,
                "started_at": self.started_at,
                **self._counts,
                **live,
            }
