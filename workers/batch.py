"""Run one batch (Celery-free; workers/app.py wraps it in a task): skip what is done, check
every id, send prompt by prompt through the InflightPool (a finished prompt frees its ticket at
once), write records.

Exactly one record or one recorded failure per prompt key. The campaign in Redis, not the
broker, is the source of truth: it knows every key enqueued, which are done or failed, and
keeps every published batch until its keys end (eagle_synth/state/batch_store.py); what the
broker loses, the reconciler publishes again. So a batch may arrive twice, or a key in two
batches, and this module makes sure such copies never both write:
  * keys already done or failed (Redis) are skipped before any request;
  * the batch lease (workers/lease.py) keeps one batch id on one thread at a time; per-key
    claims (eagle_synth/state/fence.py), taken in one Lua script at batch start and tied to that
    lease, keep one key in one live batch whatever published it; a key another live batch
    claimed is skipped and left to it;
  * every write is fenced (eagle_synth/state/fence.py): the lease is renewed just before a record
    file's rename, and the keys are marked done (or failed) in one transaction that checks the
    lease; if that check fails the file is removed again, so a worker frozen past its lease
    writes nothing that stays; a mark whose reply was lost is settled by reading its receipt
    back (fence.py `settle`), so a file whose keys Redis did mark is never removed;
  * records are written (atomically) before their keys are marked done, and the message is
    acknowledged only after both, so a crash at any point leaves the batch to be redone
    minus whatever was committed; files an earlier attempt left on this host are adopted by
    any copy of the batch (a failover can forget marks and acks: workers/own_files.py);
  * a mark counts once a replica holds it (eagle_synth/state/replicas.py: Redis WAIT), so a
    failover cannot forget it;
  * every other ending raises: Requeue (the message goes back to the queue), DiskUnavailable
    (likewise, and the worker stops taking batches), or an unexpected error that the task's
    catch-all retries and finally records as failures (`fail_unfinished`);
  * readers drop a repeated key across all files (eagle_synth/key_set.py), covering the one
    window left: a crash between a rename and its mark, redone elsewhere.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import redis
from celery import Celery

from eagle_synth import reasons
from eagle_synth.errors import (
    BadRequest,
    BadResponse,
    BadSamplingParams,
    Cancelled,
    ClaimLeaseLost,
    CommitUnsure,
    DiskUnavailable,
    LeaseLost,
    PromptMismatch,
    RecordFormatError,
    ReplyAborted,
    Requeue,
    ServerDown,
    TokenizerUnavailable,
    TransientError,
    Unauthorized,
    UntranslatableSampling,
)
from eagle_synth.manifest import build_manifest
from eagle_synth.model_identity import output_id_bound
from eagle_synth.payload import DEFAULT_BATCH_SIZE, PromptItem, TaskPayload
from eagle_synth.queue import make_celery, send_payload
from eagle_synth.records import (
    Record,
    campaign_dir,
    read_record_file,
    records_dir,
    remove_stale_temporaries,
    remove_uncommitted,
    write_manifest,
    write_record_file,
)
from eagle_synth.settings import BrokerSettings, broker_settings
from eagle_synth.state.batch_store import forget_if_finished
from eagle_synth.state.campaign import Campaign, CampaignSettings
from eagle_synth.state.fence import RECEIPT_TTL_MS, Fence, claim, release
from eagle_synth.state.node_state import NodeState
from eagle_synth.state.redis_client import STATE_UNAVAILABLE, connect
from eagle_synth.state.redis_role import is_read_only
from eagle_synth.state.replicas import ReplicaWait
from workers import metrics
from workers.affinity import host_queues_enabled, prefix_key
from workers.config import WorkerConfig
from workers.disk import DiskState
from workers.followups import FollowUps
from workers.inflight import Answer, InflightPool, Route
from workers.lease import BatchLease
from workers.own_files import OwnBatchFiles
from workers.replies import Sent
from workers.servers.fleet import Fleet, Servers
from workers.servers.model_check import REFUSE_PREFIX, ModelCheck
from workers.servers.routing import CampaignRouter, PoolRouting

log = logging.getLogger("eagle_synth.batch")

# First wait after a transient error, seconds; it doubles per attempt up to backoff_max.
BACKOFF_START = 1.0
# Seconds between manifest refreshes by one process.
MANIFEST_REFRESH = 60.0
# Finished records wait at most this long for their batch-mates before they are written, so
# a straggler delays nobody's commit and a crash redoes little.
COMMIT_AFTER = 10.0
# Longest a batch thread sleeps before looking at its deadlines again, seconds.
WAIT_SLICE = 0.5
# Words of SGLang's 400s for a prompt over the context length (tokenizer manager, scheduler).
CONTEXT_MESSAGES = ("context length", "maximum allowed length")
# Seconds between a batch's looks at its campaign's cancel marker (a prompt already sent may
# still answer, and is dropped).
CANCEL_CHECK_INTERVAL = 1.0
# Share of the soft-shutdown timeout a batch keeps working after SIGTERM before it requeues.
SHUTDOWN_GRACE_SHARE = 0.8
# Seconds between tries of a mark Redis could not take (STATE_UNAVAILABLE). The records are on
# disk: giving the batch up here would let another host redo them, a double. A try whose reply
# was lost is settled first (fence.py `settle`): applied, or never to apply and tried again.
MARK_RETRY_DELAY = 1.0


@dataclass(slots=True)
class BatchOutcome:
    """What a batch did, for logs and tests."""

    written: int = 0
    skipped_done: int = 0
    adopted: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    repaired: int = 0


def classify_bad_request(message: str) -> str:
    return reasons.PROMPT_TOO_LONG if any(words in message for words in CONTEXT_MESSAGES) else reasons.BAD_REQUEST


def _invalid_ids(item: PromptItem, *, vocab: int) -> tuple[str, str] | None:
    """One id outside the vocabulary crashes a real SGLang server for everyone."""
    if not item.ids:
        return reasons.EMPTY_PROMPT, "the prompt has no ids"
    if min(item.ids) < 0 or max(item.ids) >= vocab:  # in C; the culprit is looked for only then
        bad = next(i for i in item.ids if i < 0 or i >= vocab)
        return reasons.INVALID_TOKEN_ID, f"id {bad} is outside the vocabulary (size {vocab}); never sent"
    return None


class _Inbox:
    """The resolved futures of one batch, and the wake-ups of its thread.

    Each wake-up costs two context switches, a large share of a record's CPU when a server
    answers at once. So the thread is woken only when every future it waits for resolved, or at
    once when a request failed (a retry or requeue must not wait); other answers wait at most
    until its next WAIT_SLICE look.
    """

    def __init__(self) -> None:
        self._ready = threading.Condition(threading.Lock())
        self._arrived: list[Future] = []
        self._want = 0
        self._failed = False

    def put(self, future: Future) -> None:  # a future's done callback (any thread)
        failed = not future.cancelled() and (future.exception() is not None or future.result().error is not None)
        with self._ready:
            self._arrived.append(future)
            self._failed = self._failed or failed
            if self._want and (failed or len(self._arrived) >= self._want):
                self._ready.notify()  # only a waiting thread is told: Condition.notify is not free

    def take(self, *, want: int, timeout: float) -> list[Future]:
        """Futures resolved since the last call, after waiting up to `timeout` s for `want`
        of them (or for one whose request failed)."""
        with self._ready:
            if not self._failed and len(self._arrived) < want:
                self._want = want
                self._ready.wait(timeout)
                self._want = 0
            arrived, self._arrived, self._failed = self._arrived, [], False
        return arrived


class _Run:
    """One run of one batch under its lease: which prompts it still has to do, its in-flight
    bookkeeping (futures, retries, uncommitted records) and how each prompt ends (fail, settle,
    retry, commit). `claimed` are the keys it holds claims on; `fence` fences every write.

    `sampling` is each prompt's sampling, resolved once, as recorded with a failure, seed
    included; `sent` is what goes to the server: the same, unless a healthy server would refuse
    `sampling_seed` as an unknown key (SGLang before it existed): then samples go without it,
    and records say so.
    """

    settings: CampaignSettings  # set once the batch has prompts to generate
    output_bound: int  # output ids are legal below it (eagle_synth/model_identity.py), with `settings`
    deadline: float  # the task's time budget, from the first send
    timeout: float  # of one request

    def __init__(self, runner: BatchRunner, campaign: Campaign, payload: TaskPayload, lease: BatchLease) -> None:
        self.runner = runner
        self.campaign = campaign
        self.payload = payload
        self.lease = lease
        self.fence = Fence(
            lease.key, lease.holder, lease.ttl_ms, campaign.keys.claims, campaign.keys.receipts(payload.batch)
        )
        self.outcome = BatchOutcome()
        self.claimed: list[str] = []
        self.folder = campaign_dir(runner.config.out, payload.campaign)
        self.sampling = {item.key: payload.sampling_for(item) for item in payload.items}
        self.sent = self.sampling
        self.pending: dict[Future, PromptItem] = {}
        self.answered = _Inbox()
        self.retries: list[tuple[float, str, PromptItem]] = []  # heap by due time (then key: one entry each)
        self.attempts: Counter[str] = Counter()
        self.records: list[Record] = []
        self.first_uncommitted = 0.0
        self.servers: frozenset[str] | None = None  # the campaign's servers among the routable
        self.was_cancelled = False
        self.cancel_checked_at = -CANCEL_CHECK_INTERVAL
        self.feeding = False  # its prompts have reached the pool (workers/reservation.py counts such runs)

    def cancelled(self) -> bool:
        """Whether `eagle-synth cancel` ended the campaign (looked up at most every
        CANCEL_CHECK_INTERVAL s): then nothing more is sent or written."""
        now = time.monotonic()
        if now - self.cancel_checked_at >= CANCEL_CHECK_INTERVAL:
            self.cancel_checked_at = now
            if self.runner.redis_client.exists(self.campaign.keys.cancelled):
                self.was_cancelled = True
                log.info(
                    "batch %s: campaign %s was cancelled; nothing more is written",
                    self.payload.batch,
                    self.campaign.name,
                )
        return self.was_cancelled

    def max_new_tokens(self, item: PromptItem) -> int:
        return self.sampling[item.key].max_new_tokens

    # before generating ------------------------------------------------------------------
    def run(self) -> None:
        runner = self.runner
        campaign = self.campaign
        payload = self.payload
        if runner.redis_client.exists(campaign.keys.ended):
            # `close` folded the done set to disk, so every key would look open: generating would
            # double records. Only a message published after the close can get here.
            log.warning("batch %s of closed campaign %s: nothing generated", payload.batch, payload.campaign)
            return
        if self.cancelled():
            return
        if not (items := self.unfinished()):
            return
        if (settings := runner.followups.campaign_settings(campaign.name)) is None:
            message = (
                f"campaign {campaign.name!r} has no settings in Redis (deleted, or evicted by a Redis whose "
                "maxmemory-policy is not noeviction); run the same `eagle-synth enqueue` again to restore them, "
                f"then `eagle-synth retry-failed {campaign.name}`"
            )
            self.fail_all(items, reasons.CAMPAIGN_SETTINGS_MISSING, message)
            return
        self.settings = settings
        # Outputs may reach the model's padded vocabulary; prompts are checked against the
        # tokenizer's (_invalid_ids).
        self.output_bound = output_id_bound(tokenizer_size=settings.vocab_size, model_vocab=settings.model_vocab_size)
        if any(item.conversation for item in items):
            try:
                runner.followups.prepare(campaign, self.settings)
            except TokenizerUnavailable as exc:
                # No GPU time for turns whose next turn could not be rendered here.
                self.fail_all(items, reasons.TOKENIZER_UNAVAILABLE, str(exc))
                return
        if not (items := self.keep(items, partial(_invalid_ids, vocab=self.settings.vocab_size))):
            return
        if not (servers := runner.fleet.routable(runner.config.servers)):
            raise Requeue("no healthy server")
        if not (servers := runner._serving_the_model(self.settings, servers)):
            raise Requeue("no healthy server serves the campaign's model")
        self.servers = frozenset(servers)
        if not (items := self.drop_too_long(servers, self.drop_untranslatable(servers, items))):
            return
        if any(state.sampling_seed_supported is False for state, _ in servers.values()):
            self.sent = {item.key: self.payload.sampling_for(item, with_seed=False) for item in self.payload.items}
        try:
            self.generate(items)
        finally:
            for future in self.pending:
                future.cancel()
            # Whatever was generated is kept, even when the rest of the batch is requeued,
            # unless the lease is lost (another host may be committing the same prompts) or the
            # campaign was cancelled.
            if not self.lease.lost and not self.was_cancelled:
                self.commit()

    def unfinished(self) -> list[PromptItem]:
        """The batch's open prompts, one per key, once this run claimed them and adopted the
        records a previous attempt left."""
        campaign = self.campaign
        payload = self.payload
        outcome = self.outcome
        lease = self.lease
        keys = [item.key for item in payload.items]
        finished = campaign.finished_keys(keys)
        outcome.skipped_done = len(finished)
        # Claimed before anything is adopted or sent: a key another live batch holds is its own.
        open_keys = list(dict.fromkeys(k for k in keys if k not in finished))
        busy = claim(self.runner.redis_client, campaign.keys.claims, lease.key, lease.holder, open_keys)
        self.claimed.extend(k for k in open_keys if k not in busy)
        if busy:
            log.info("batch %s: %d prompts are held by another live batch; left to it", payload.batch, len(busy))
            finished |= busy
        # A crash between writing a file and marking its keys done leaves the file here, and a
        # failover can forget a mark (and the ack): then a fresh copy of the batch finds it.
        adopted: dict[str, Record] = {}
        for path in self.runner.own_files.files(self.folder, payload.batch):
            try:
                adopted.update({r.key: r for r in read_record_file(path) if r.key not in finished})
            except RecordFormatError as exc:
                # Its prompts are generated again; `eagle-synth verify`/`repair` deal with the file.
                log.warning("batch %s: not adopting damaged file %s: %s", payload.batch, path.name, exc)
        if adopted:
            self.mark(list(adopted.values()))
            outcome.adopted = len(adopted)
            log.info("batch %s: adopted %d records a previous attempt wrote", payload.batch, len(adopted))
        first = {item.key: item for item in reversed(payload.items)}  # a key's first item
        return [first[key] for key in open_keys if key not in finished and key not in adopted]

    # Any healthy server may get any prompt: the campaign's sampling must mean the same on every
    # kind of server among them (vLLM lacks some SGLang values), and a prompt must fit each one.
    def drop_untranslatable(self, servers: Servers, items: list[PromptItem]) -> list[PromptItem]:
        for url, (state, backend) in servers.items():
            try:
                backend.translate_sampling(self.payload.sampling)
            except UntranslatableSampling as exc:
                error = f"server {url} ({state.backend}): {exc}"
                log.error("campaign %s: %s", self.campaign.name, error)
                return self.fail_all(items, reasons.BAD_SAMPLING_PARAMS, error)
        return items

    def drop_too_long(self, servers: Servers, items: list[PromptItem]) -> list[PromptItem]:
        def too_long(item: PromptItem) -> tuple[str, str] | None:
            problems = (
                backend.context_problem(prompt_len=len(item.ids), max_new_tokens=self.max_new_tokens(item), state=state)
                for state, backend in servers.values()
            )
            problem = next((why for why in problems if why), None)
            return None if problem is None else (reasons.PROMPT_TOO_LONG, problem)

        return self.keep(items, too_long)

    # generating -------------------------------------------------------------------------
    def generate(self, items: list[PromptItem]) -> None:
        self.deadline = time.monotonic() + self.runner.task_budget
        self.timeout = self.runner.config.request_timeout(max(self.max_new_tokens(item) for item in items))
        self.send(*items)
        while self.pending or self.retries:
            if why := self.runner._deadline_passed(self.deadline):
                self.settle_all(self.answered.take(want=0, timeout=0))  # answers that arrived are kept
                raise Requeue(why)
            if self.cancelled():
                raise Cancelled(self.campaign.name)
            if self.lease.lost:
                raise Requeue(
                    "the batch lease was lost (Redis unreachable, or the batch given to another worker); "
                    "nothing of this attempt is written"
                )
            due = []
            while self.retries and self.retries[0][0] <= time.monotonic():
                due.append(heapq.heappop(self.retries)[2])
            self.send(*due)  # none due: the pool is not even woken (submit_many)
            wake = WAIT_SLICE
            if self.retries:
                wake = min(wake, max(0.0, self.retries[0][0] - time.monotonic()))
            if self.pending:
                self.settle_all(self.answered.take(want=len(self.pending), timeout=wake))
            else:
                time.sleep(wake)
            if self.records and time.monotonic() - self.first_uncommitted >= COMMIT_AFTER:
                self.commit()

    def send(self, *items: PromptItem) -> None:
        if not self.feeding:
            self.feeding = True
            self.runner.feeding_started(len(items))
        futures = self.runner.pool.submit_many(
            prompts=[(item.ids, self.sent[item.key]) for item in items],
            timeout=min(self.timeout, max(1.0, self.deadline - time.monotonic())),
            tag=self.campaign.name,
            servers=self.servers,
            prefixes=[prefix_key(item) for item in items],
        )
        for future, item in zip(futures, items, strict=True):
            self.pending[future] = item
            future.add_done_callback(self.answered.put)

    def settle_all(self, done: list[Future]) -> None:
        for future in done:
            item = self.pending.pop(future, None)
            if item is not None:  # else withdrawn (cancelled) after a refusal of the sampling
                self.settle(item, future.result())

    # endings ------------------------------------------------------------------------
    def fail(self, item: PromptItem, reason: str, message: str) -> None:
        self.campaign.record_failure(
            item,
            reason=reason,
            message=message,
            sampling=self.sampling[item.key],
            worker=self.runner.node,
            fence=self.fence,
        )
        self.outcome.failed[reason] = self.outcome.failed.get(reason, 0) + 1
        metrics.prompt_failed(self.campaign.name, reason)
        log.warning("prompt %s (%s) failed: %s: %s", item.key, item.source, reason, message)

    def fail_all(self, items: list[PromptItem], reason: str, message: str) -> list[PromptItem]:
        for item in items:
            self.fail(item, reason, message)
        return []

    def keep(self, items: list[PromptItem], problem: Callable[[PromptItem], tuple[str, str] | None]) -> list:
        """`items` but those `problem` names a (reason, message) for, which fail."""
        good = []
        for item in items:
            if (found := problem(item)) is None:
                good.append(item)
            else:
                self.fail(item, *found)
        return good

    def retry(self, item: PromptItem, reason: str, message: str) -> None:
        self.attempts[item.key] += 1
        tries = self.attempts[item.key]
        config = self.runner.config
        if tries >= config.max_attempts:
            self.fail(item, reason, f"{tries} attempts failed; last: {message}")
            return
        delay = min(config.backoff_max, BACKOFF_START * 2 ** (tries - 1))
        delay = random.uniform(delay / 2, delay)
        log.info("prompt %s: %s (attempt %d), retrying in %.1f s", item.key, message, tries, delay)
        heapq.heappush(self.retries, (time.monotonic() + delay, item.key, item))

    def settle(self, item: PromptItem, answer: Answer) -> None:
        """Turn one answer into a record, a failure, a retry, or a requeue of the batch."""
        runner = self.runner
        url = answer.url
        error = answer.error
        backend = answer.backend
        if error is None:
            assert backend is not None, "the pool builds every request with its server's backend"
            sent = Sent(
                item,
                campaign=self.campaign.name,
                sampling=self.sent[item.key],
                server=url,
                worker=runner.node,
                backend=backend.name,
            )
            try:
                record = backend.parse(answer.item, vocab_size=self.output_bound, sent=sent)
            except ReplyAborted:
                runner.fleet.generated_ok(url)
                self.retry(item, reasons.ABORTED, "the server aborted this prompt")
                return
            except PromptMismatch as exc:
                self.fail(item, reasons.PROMPT_MISMATCH, str(exc))
                return
            except (TransientError, BadSamplingParams) as exc:  # BadSamplingParams: SamplingOverridden
                error = exc
            else:
                runner.fleet.generated_ok(url)
                runner._note_server(self.campaign, url)
                if not self.records:
                    self.first_uncommitted = time.monotonic()
                self.records.append(record)
                return
        if isinstance(error, BadSamplingParams):
            self.refuse_sampling(item, error)
        elif isinstance(error, BadRequest):
            self.fail(item, classify_bad_request(str(error)), str(error))
        elif isinstance(error, Unauthorized | ServerDown) or runner.fleet.server_down(url, str(error)):
            # A key refused mid-campaign (the server restarted with another) refuses the server:
            # the gate marks it so (REFUSE_PREFIX), and the prompt goes elsewhere or back to the queue.
            refused = isinstance(error, Unauthorized)
            runner.fleet.suspect(url, f"{REFUSE_PREFIX if refused else ''}{error}")
            if not runner.pool.routable(self.servers):
                raise Requeue(f"server {url} {'refused our API key' if refused else 'is down'}: {error}")
            self.send(item)  # another server takes it; the prompt did nothing wrong
        else:
            self.retry(
                item, reasons.BAD_RESPONSE if isinstance(error, BadResponse) else reasons.SERVER_ERROR, str(error)
            )

    def refuse_sampling(self, item: PromptItem, error: BadSamplingParams) -> None:
        """Every prompt would be refused the same way: the open ones fail now, nothing more is sent."""
        name = self.campaign.name
        log.error(
            "campaign %s: %s. Every prompt of this campaign will be refused the same way: fix the server "
            "(version, options) or the campaign, then `eagle-synth retry-failed %s --reason %s`",
            name,
            error,
            name,
            reasons.BAD_SAMPLING_PARAMS,
        )
        # Prompts not sent yet are withdrawn; those already sent are settled as they answer.
        others = [self.pending.pop(future) for future in list(self.pending) if future.cancel()]
        others += [entry[2] for entry in self.retries]
        self.retries.clear()
        self.fail_all([item, *others], reasons.BAD_SAMPLING_PARAMS, str(error))

    # writing ------------------------------------------------------------------------
    def mark(self, records: list[Record]) -> None:
        """Mark records on disk done (fenced), waiting for Redis if it is down; a conversation's
        turn also stores its next turn in the same step (workers/followups.py). A try whose reply
        was lost is settled by reading Redis back before anything else: applied (done), or not
        and never will be (tried again, or LeaseLost if the lease went meanwhile)."""
        unsure: list[str] = []  # receipts of tries sent without a reply: Redis may have applied them
        unsure_since = 0.0
        while True:
            try:
                if unsure and self.settled(records, unsure, since=unsure_since):
                    log.info("batch %s: a try of the mark whose reply was lost had applied", self.payload.batch)
                    return
                unsure.clear()  # settled: none of them applied, and none can any more
                self.runner.followups.commit(self.campaign, self.payload, records, fence=self.fence)
                # Not done until a replica holds it: else a failover forgets it and another host redoes it.
                self.runner.replicas.confirm()
                return
            except STATE_UNAVAILABLE as exc:
                if isinstance(exc, CommitUnsure):
                    unsure_since = unsure_since if unsure else time.monotonic()
                    unsure.append(exc.receipt)
                if self.runner.stopping.is_set():
                    if is_read_only(exc) and not unsure:
                        # A replica refuses a transaction whole: nothing was marked, the file must go.
                        raise LeaseLost(f"Redis refused the mark as a read-only replica ({exc})") from exc
                    raise
                log.warning(
                    "batch %s: Redis did not take the mark of %d records (%s); trying again in %g s",
                    self.payload.batch,
                    len(records),
                    exc,
                    MARK_RETRY_DELAY,
                )
                time.sleep(MARK_RETRY_DELAY)

    def settled(self, records: list[Record], unsure: list[str], *, since: float) -> bool:
        """Whether one of the tries named by `unsure` applied (Fence.settle). Redis away for longer
        than a receipt lives (RECEIPT_TTL_MS) may have dropped ours: then, with the lease gone,
        keys all done count as applied, so the file stays (a copy another batch wrote is dropped
        by readers) rather than their only record being removed."""
        try:
            return self.fence.settle(self.runner.redis_client, unsure)
        except LeaseLost:
            expired = time.monotonic() - since > RECEIPT_TTL_MS / 1000
            if expired and self.campaign.all_done([record.key for record in records]):
                return True
            raise

    def commit(self) -> None:
        """Write the uncommitted records to one file, then mark them done."""
        records, self.records = self.records, []
        if not records or self.cancelled():
            return
        runner = self.runner
        folder = self.folder
        campaign = self.campaign
        # Turns of conversations with tools say how many tool calls they make.
        runner.followups.count_tool_calls(self.settings, self.payload, records)
        try:
            if campaign.name not in runner._swept:
                runner._swept.add(campaign.name)
                remove_stale_temporaries(folder)
            # A full lease TTL for the rename and the mark that follow; a lost lease writes nothing.
            self.fence.renew(runner.redis_client)
            write = partial(
                write_record_file, folder, campaign=campaign.name, batch=self.payload.batch, records=records
            )
            path = runner.own_files.write(folder, self.payload.batch, write)
        except OSError as exc:  # ENOSPC, EROFS, EACCES, EDQUOT, EIO...: the operator can fix each
            detail = f"cannot write records to {records_dir(folder)}: {exc.strerror or exc}"
            runner.disk.failed(detail, folder=records_dir(folder))
            raise DiskUnavailable(detail) from exc
        try:
            self.mark(records)
        except LeaseLost:
            # Lost between the renewal and the mark (a freeze longer than the TTL just there):
            # another batch may write these keys, so this file must not stay.
            remove_uncommitted(path)
            raise
        self.outcome.written += len(records)
        metrics.records_written(campaign.name, records)
        self.outcome.repaired += sum(1 for r in records if r.repaired_prefix)
        runner._refresh_manifest(campaign, folder)


class BatchRunner:
    """Runs batches on the worker's batch threads, built on the process's first batch with the
    pieces they share: one InflightPool, the process's servers (the fleet, shared with the health
    gate), the output folder's state, follow-ups, and the routing that tells the pool which
    servers may take prompts and with which backend (SGLang or vLLM, as preflight found) to
    build their requests.

    Parameters:
        config, node: worker settings; this worker's Celery node name.
        stopping: set when the worker begins to shut down; batches go on for a share of the
            soft-shutdown timeout after it.
        disk: the output folder's state, shared with the health gate.
        broker: Redis and queue settings (default: from the environment).
        app: the Celery app a conversation's next turns are published with (default: one of
            its own for these broker settings).
        router: which servers take which campaign (workers/servers/routing.py), shared with the
            health gate; without one (a runner driven by hand) a batch goes to every healthy
            server that serves its model or cannot say.
        fleet: the servers as this process knows them (workers/servers/fleet.py), shared with
            the health gate, which publishes their states there (default: one of its own, whose
            states whoever drives the runner by hand publishes).
        replicas: waits for a replica to hold each mark, and reports when none does (default:
            one of its own, for the replicas the master has).
    """

    def __init__(
        self,
        *,
        config: WorkerConfig,
        node: str,
        stopping: threading.Event | None = None,
        disk: DiskState | None = None,
        broker: BrokerSettings | None = None,
        app: Celery | None = None,
        router: CampaignRouter | None = None,
        replicas: ReplicaWait | None = None,
        fleet: Fleet | None = None,
    ) -> None:
        settings = broker or broker_settings()
        self.router = router
        self.fleet = fleet or Fleet(config.servers, api_key=config.api_key)
        self.config = config
        self.node = node
        self.stopping = stopping or threading.Event()
        self.disk = disk or DiskState(folder=config.out)
        self.task_budget = settings.task_budget_seconds
        self.shutdown_grace = float(settings.soft_shutdown_timeout)
        self.redis_client = connect(settings)
        self.node_state = NodeState(self.redis_client, node)
        self.own_files = OwnBatchFiles()
        self.replicas = replicas or ReplicaWait(connect(settings), min_replicas=settings.min_replicas)
        self._published: dict[tuple[str, str], int] = {}
        # Which servers the pool may send to, with how many tickets and which backend.
        self.pool_routing = PoolRouting(self.fleet, config.servers, inflight=config.inflight)
        self.pool = InflightPool(servers=list(config.servers), on_tick=self.tick, api_key=config.api_key)
        # Marks records done and carries conversations' next turns to the queue; holds the
        # process's cache of campaign settings.
        self.followups = FollowUps(
            redis_client=connect(settings),
            # A next turn goes to this worker's host queue: taken here first (workers/handoff.py).
            send=partial(
                send_payload, app or make_celery(settings), settings.queue, host=node if host_queues_enabled() else None
            ),
            render_processes=config.render_processes,
            local_tokenizers=tuple(Path(folder).expanduser() for folder in config.tokenizer),
            stopping=self.stopping,
            hungry=lambda: self.pool.waiting() == 0,
        )
        self._stop_deadline: float | None = None
        self.model_check = router.check if router is not None else ModelCheck(self.fleet.clients)
        self._noted: set[tuple[str, str]] = set()
        self._manifest_at: dict[str, float] = {}
        self._swept: set[str] = set()
        self._lock = threading.Lock()
        # Runs whose prompts reached the pool, and the size of the last one's first send
        # (workers/reservation.py: batches held beyond these are still on their way to it).
        self.feeding = 0
        self.last_batch_size = DEFAULT_BATCH_SIZE

    # entry points -------------------------------------------------------------------
    def run(self, payload: TaskPayload) -> BatchOutcome:
        """Run a batch; raises Requeue, DiskUnavailable or BatchBusy (another thread runs it)."""
        campaign = Campaign(self.redis_client, payload.campaign)
        with BatchLease(self.redis_client, campaign.keys.lease(payload.batch)) as lease:
            run = _Run(self, campaign, payload, lease)
            try:
                run.run()
            except (LeaseLost, ClaimLeaseLost) as exc:
                raise Requeue(f"the batch lease was lost ({exc}); nothing more of this attempt is written") from exc
            finally:
                if run.feeding:
                    self.feeding_ended()
                with contextlib.suppress(redis.RedisError):  # else they lapse with the lease
                    release(self.redis_client, campaign.keys.claims, lease.key, lease.holder, run.claimed)
        # The campaign's copy of the batch is no longer needed once every key ended.
        forget_if_finished(self.redis_client, payload.campaign, payload.batch, [item.key for item in payload.items])
        return run.outcome

    def fail_unfinished(self, payload: TaskPayload, *, reason: str, message: str) -> int:
        """Record every prompt of the batch with neither record nor failure as failed (the
        catch-all's last step: a batch that keeps erring ends replayable, not vanished)."""
        campaign = Campaign(self.redis_client, payload.campaign)
        keys = [item.key for item in payload.items]
        finished = campaign.finished_keys(keys)
        failed = 0
        for item in payload.items:
            if item.key not in finished:
                finished.add(item.key)
                campaign.record_failure(
                    item, reason=reason, message=message, sampling=payload.sampling_for(item), worker=self.node
                )
                failed += 1
        metrics.prompt_failed(payload.campaign, reason, failed)
        forget_if_finished(self.redis_client, payload.campaign, payload.batch, keys)
        return failed

    def feeding_started(self, prompts: int) -> None:
        with self._lock:
            self.feeding += 1
            self.last_batch_size = max(1, prompts)

    def feeding_ended(self) -> None:
        with self._lock:
            self.feeding -= 1

    # shared by the batches ------------------------------------------------------------
    def _serving_the_model(self, settings: CampaignSettings, servers: Servers) -> Servers:
        """`servers` narrowed to those the router gives the campaign, minus any found serving
        another model since (swapped behind its address): that server is kept from this
        campaign only, and serves its own model's (workers/servers/model_check.py)."""
        allowed = None if self.router is None else self.router.servers_for(settings.name)
        kept = {}
        for url, (state, backend) in servers.items():
            if allowed is not None and url not in allowed:
                continue
            if (line := self.model_check.problem(url, state, settings)) is None:
                kept[url] = (state, backend)
            elif self.router is not None:
                self.router.refuse(settings.name, url, line)
            else:
                log.warning("%s", line)
        return kept

    def _deadline_passed(self, deadline: float) -> str | None:
        now = time.monotonic()
        if now >= deadline:
            return "task time budget spent"
        if self.stopping.is_set():
            with self._lock:
                if self._stop_deadline is None:
                    self._stop_deadline = now + self.shutdown_grace * SHUTDOWN_GRACE_SHARE
            if now >= self._stop_deadline:
                return "the worker is shutting down"
        return None

    def _note_server(self, campaign: Campaign, url: str) -> None:
        if (campaign.name, url) not in self._noted:
            state = self.fleet.state(url)
            if state is not None and state.provenance:
                campaign.note_server(url, state.provenance)
                self._noted.add((campaign.name, url))

    def _refresh_manifest(self, campaign: Campaign, folder: Path) -> None:
        """Rewrite manifest.json at most every MANIFEST_REFRESH s, and always after the commit
        that leaves the campaign with nothing pending (its last batch), so its counts are final."""
        now = time.monotonic()
        with self._lock:
            throttled = now - self._manifest_at.get(campaign.name, -MANIFEST_REFRESH) < MANIFEST_REFRESH
        if throttled and campaign.progress().pending:
            return
        with self._lock:
            self._manifest_at[campaign.name] = now
        try:
            write_manifest(folder, build_manifest(campaign))
        except OSError as exc:  # the records are committed; a later batch rewrites it
            log.warning("could not refresh %s/manifest.json: %s", folder, exc)

    def tick(self, counts: Mapping[tuple[str, str], int]) -> dict[str, Route]:
        """The pool's periodic call: publish prompts in flight, return each server's route
        (workers/servers/routing.py PoolRouting)."""
        if counts != self._published:
            self.node_state.publish_inflight(pid=os.getpid(), counts=counts, previous=self._published)
            self._published = dict(counts)
        return self.pool_routing.routes()
