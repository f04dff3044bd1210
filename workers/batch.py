"""Run one batch: skip what is done, check every id, call /generate, write records.

Celery-free, so it can be read and tested on its own; workers/app.py wraps it in a task.

Exactly one record or one recorded failure per prompt key:
  * keys already done or failed (Redis) are skipped before any request;
  * record files a crashed attempt of this batch left on this host are adopted, not redone;
  * records are written (atomically) before their keys are marked done, and the message is
    acknowledged only after both, so a crash at any point leaves the batch to be redone
    minus whatever was committed;
  * readers drop a repeated key, covering the one window left (a crash after the rename on
    one host and the redo on another).
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from eagle_synth.campaign import Campaign, CampaignSettings
from eagle_synth.node_state import HEALTHY, NodeState, ServerState
from eagle_synth.payload import PromptItem, TaskPayload
from eagle_synth.records import (
    Record, batch_files, campaign_dir, read_record_file, records_dir, write_manifest,
    write_record_file,
)
from eagle_synth.manifest import build_manifest
from workers.client import BadRequest, SGLangClient, ServerDown, TransientError
from workers.config import WorkerConfig
from workers.lease import BatchLease

log = logging.getLogger("eagle_synth.batch")

# First wait after a transient error, seconds; it doubles per attempt up to backoff_max.
BACKOFF_START = 1.0
# Seconds a quick /health check may take when a request failed, to tell "down" from "blip".
QUICK_HEALTH_TIMEOUT = 5.0
# Seconds between manifest refreshes by one process.
MANIFEST_REFRESH = 60.0
# Seconds between "the server answered /generate" reports to the health gate, per child.
OK_REPORT_INTERVAL = 1.0
# A 400 whose message says this is a prompt over the context length.
CONTEXT_MESSAGE = "context length"


# Seconds after which a temporary record file is an orphan of a killed writer, not a write
# in progress.
STALE_TEMPORARY_SECONDS = 3600


def remove_stale_temporaries(folder: Path) -> int:
    """Delete `.tmp-*` files that killed writers left in a campaign's records folder."""
    removed = 0
    cutoff = time.time() - STALE_TEMPORARY_SECONDS
    for path in records_dir(folder).glob(".tmp-*") if records_dir(folder).is_dir() else ():
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            pass
    return removed


class Requeue(Exception):
    """The batch (what is left of it) must go back to the queue: no healthy server, or the
    task's time budget is spent. Not a failure: no retry budget is used."""


@dataclass(slots=True)
class BatchOutcome:
    """What a batch did, for logs and tests."""

    written: int = 0
    skipped_done: int = 0
    adopted: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    repaired: int = 0
    server: str | None = None


def classify_bad_request(message: str) -> str:
    return "prompt-too-long" if CONTEXT_MESSAGE in message else "bad-request"


class BatchRunner:
    """Runs batches in one pool child; keeps HTTP connections and caches across batches.

    Parameters:
        config: worker settings.
        redis_client: campaign state and node state.
        node: this worker's node name.
        task_budget: seconds a batch may run before it requeues what is left.
    """

    def __init__(self, *, config: WorkerConfig, redis_client: redis.Redis, node: str,
                 task_budget: float) -> None:
        self.config = config
        self.redis = redis_client
        self.node = node
        self.node_state = NodeState(redis_client, node)
        self.task_budget = task_budget
        self.clients = {url: SGLangClient(url) for url in config.servers}
        self._settings: dict[str, CampaignSettings] = {}
        self._noted: set[tuple[str, str]] = set()
        self._manifest_at: dict[str, float] = {}
        self._swept: set[str] = set()
        self._ok_reported: dict[str, float] = {}

    # entry point ------------------------------------------------------------------
    def run(self, payload: TaskPayload, *, retried: bool = False) -> BatchOutcome:
        """Run a batch; raises Requeue (give it back) or BatchBusy (another child runs it).

        `retried` says this message was delivered before (redelivered, requeued or retried):
        only then can an earlier attempt have left record files to adopt, so only then is the
        records folder searched (listing it costs more as a campaign grows).
        """
        campaign = Campaign(self.redis, payload.campaign)
        with BatchLease(self.redis, campaign.keys.lease(payload.batch)) as lease:
            return self._run(campaign, payload, look_for_files=retried or lease.took_over)

    def _run(self, campaign: Campaign, payload: TaskPayload, *, look_for_files: bool) -> BatchOutcome:
        outcome = BatchOutcome()
        settings = self._campaign_settings(campaign)
        folder = campaign_dir(self.config.out, payload.campaign)
        items = self._unfinished(campaign, payload, folder, outcome, look_for_files=look_for_files)
        if not items:
            return outcome
        items = self._drop_invalid(campaign, payload, settings, items, outcome)
        if not items:
            return outcome

        url, state = self._pick_server()
        outcome.server = url
        items = self._drop_too_long(campaign, payload, state, items, outcome)
        if not items:
            return outcome
        self._note_server(campaign, url, state)

        deadline = time.monotonic() + self.task_budget
        records: list[Record] = []
        pid = os.getpid()
        self.node_state.set_inflight(pid=pid, url=url, campaign=campaign.name, prompts=len(items))
        try:
            self._generate(campaign, payload, url, items, records, outcome, deadline)
        finally:
            self.node_state.set_inflight(pid=pid, url=url, campaign=campaign.name, prompts=0)
            # Whatever was generated is kept, even when the rest of the batch is requeued.
            self._commit(campaign, payload, folder, records, outcome)
        return outcome

    # steps --------------------------------------------------------------------------
    def _campaign_settings(self, campaign: Campaign) -> CampaignSettings:
        if campaign.name not in self._settings:
            settings = campaign.settings()
            if settings is None:
                raise RuntimeError(f"campaign {campaign.name!r} has no settings in Redis (deleted?)")
            self._settings[campaign.name] = settings
        return self._settings[campaign.name]

    def _unfinished(self, campaign: Campaign, payload: TaskPayload, folder: Path,
                    outcome: BatchOutcome, *, look_for_files: bool) -> list[PromptItem]:
        keys = [item.key for item in payload.items]
        finished = campaign.finished_keys(keys)
        outcome.skipped_done = len(finished)
        # A crash between writing a file and marking its keys done leaves the file here.
        adopted: dict[str, Record] = {}
        for path in batch_files(folder, payload.batch) if look_for_files else ():
            for record in read_record_file(path):
                if record.key not in finished:
                    adopted[record.key] = record
        if adopted:
            campaign.mark_done(
                list(adopted),
                tokens_in=sum(len(r.prompt_ids) for r in adopted.values()),
                tokens_out=sum(len(r.output_ids) for r in adopted.values()),
            )
            outcome.adopted = len(adopted)
            log.info("batch %s: adopted %d records a previous attempt wrote", payload.batch, len(adopted))
        seen: set[str] = set()
        pending = []
        for item in payload.items:
            if item.key in finished or item.key in adopted or item.key in seen:
                continue
            seen.add(item.key)
            pending.append(item)
        return pending

    def _fail(self, campaign: Campaign, payload: TaskPayload, item: PromptItem, reason: str,
              message: str, outcome: BatchOutcome) -> None:
        campaign.record_failure(item, reason=reason, message=message, sampling=payload.sampling, worker=self.node)
        outcome.failed[reason] = outcome.failed.get(reason, 0) + 1
        log.warning("prompt %s (%s) failed: %s: %s", item.key, item.source, reason, message)

    def _drop_invalid(self, campaign, payload, settings, items, outcome) -> list[PromptItem]:
        """One id outside the vocabulary crashes a real SGLang server for everyone."""
        vocab = settings.vocab_size
        good = []
        for item in items:
            bad = next((i for i in item.ids if i < 0 or i >= vocab), None)
            if not item.ids:
                self._fail(campaign, payload, item, "empty-prompt", "the prompt has no ids", outcome)
            elif bad is not None:
                self._fail(campaign, payload, item, "invalid-token-id",
                           f"id {bad} is outside the vocabulary (size {vocab}); never sent", outcome)
            else:
                good.append(item)
        return good

    def _drop_too_long(self, campaign, payload, state: ServerState, items, outcome) -> list[PromptItem]:
        limit = state.context_length
        if not limit:
            return items
        max_new = int(payload.sampling.get("max_new_tokens", 0))
        good = []
        for item in items:
            if len(item.ids) + max_new > limit:
                self._fail(
                    campaign, payload, item, "prompt-too-long",
                    f"prompt of {len(item.ids)} tokens + max_new_tokens {max_new} exceeds the "
                    f"server's context length {limit}", outcome,
                )
            else:
                good.append(item)
        return good

    def _pick_server(self) -> tuple[str, ServerState]:
        states, suspects, inflight = self.node_state.routing()
        healthy = []
        for url in self.config.servers:
            state = states.get(url)
            if state is None or state.state != HEALTHY:
                continue
            if suspects.get(url, 0.0) > state.since:
                continue
            healthy.append((url, state))
        if not healthy:
            raise Requeue("no healthy server")
        return min(healthy, key=lambda us: (inflight.get(us[0], 0), random.random()))

    def _note_server(self, campaign: Campaign, url: str, state: ServerState) -> None:
        if (campaign.name, url) not in self._noted and state.provenance:
            campaign.note_server(url, state.provenance)
            self._noted.add((campaign.name, url))

    def _server_down(self, url: str, detail: str) -> bool:
        """After a failed request: is the server itself down (requeue) or was it a blip (retry)?"""
        try:
            ok, why = self.clients[url].health(timeout=QUICK_HEALTH_TIMEOUT)
        except ServerDown as exc:
            ok, why = False, str(exc)
        if not ok:
            self.node_state.suspect(url, f"{detail}; health: {why}")
        return not ok

    def _sampling_for(self, payload: TaskPayload, items: list[PromptItem]) -> dict | list[dict]:
        if all(item.seed is None for item in items):
            return payload.sampling
        return [
            payload.sampling if item.seed is None else {**payload.sampling, "sampling_seed": item.seed}
            for item in items
        ]

    def _generate(self, campaign, payload, url, items, records, outcome, deadline) -> None:
        """Generate `items`, isolating prompts the server refuses; appends to `records`."""
        client = self.clients[url]
        max_new = int(payload.sampling.get("max_new_tokens", 0))
        attempts = 0
        pending = list(items)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Requeue("task time budget spent")
            timeout = min(self.config.request_timeout(max_new), remaining)
            try:
                responses = client.generate(
                    [item.ids for item in pending], self._sampling_for(payload, pending), timeout=timeout
                )
            except BadRequest as exc:
                if len(pending) == 1:
                    self._fail(campaign, payload, pending[0], classify_bad_request(str(exc)), str(exc), outcome)
                    return
                # One bad prompt fails the whole request: halve until it stands alone.
                mid = len(pending) // 2
                self._generate(campaign, payload, url, pending[:mid], records, outcome, deadline)
                self._generate(campaign, payload, url, pending[mid:], records, outcome, deadline)
                return
            except (ServerDown, TransientError) as exc:
                if isinstance(exc, ServerDown) or self._server_down(url, str(exc)):
                    if isinstance(exc, ServerDown):
                        self.node_state.suspect(url, str(exc))
                    raise Requeue(f"server {url} is down: {exc}") from exc
                attempts += 1
                if attempts >= self.config.max_attempts:
                    if len(pending) > 1:
                        # Maybe one prompt breaks the server's handling: isolate it.
                        mid = len(pending) // 2
                        self._generate(campaign, payload, url, pending[:mid], records, outcome, deadline)
                        self._generate(campaign, payload, url, pending[mid:], records, outcome, deadline)
                        return
                    self._fail(campaign, payload, pending[0], "server-error",
                               f"{attempts} attempts failed; last: {exc}", outcome)
                    return
                self._backoff(attempts, deadline, exc)
                continue

            self._report_ok(url)
            retry = []
            for item, response in zip(pending, responses):
                record = self._record(campaign, payload, url, item, response, outcome)
                if record is None:
                    retry.append(item)
                else:
                    records.append(record)
            if retry:
                attempts += 1
                if attempts >= self.config.max_attempts:
                    for item in retry:
                        self._fail(campaign, payload, item, "aborted",
                                   f"the server aborted this prompt {attempts} times", outcome)
                    return
                self._backoff(attempts, deadline, "server aborted prompts")
            pending = retry

    def _report_ok(self, url: str) -> None:
        # The gate only needs to know the server answered recently; once a second is plenty.
        now = time.monotonic()
        if now - self._ok_reported.get(url, 0.0) >= OK_REPORT_INTERVAL:
            self._ok_reported[url] = now
            self.node_state.generated_ok(url)

    def _backoff(self, attempts: int, deadline: float, why) -> None:
        delay = min(self.config.backoff_max, BACKOFF_START * 2 ** (attempts - 1))
        delay = random.uniform(delay / 2, delay)
        if time.monotonic() + delay >= deadline:
            raise Requeue("task time budget spent")
        log.info("transient error (attempt %d), retrying in %.1f s: %s", attempts, delay, why)
        time.sleep(delay)

    def _record(self, campaign, payload, url, item: PromptItem, response: dict,
                outcome: BatchOutcome) -> Record | None:
        """A record from one response item; None if the server aborted it (retry)."""
        meta = response.get("meta_info") or {}
        finish = meta.get("finish_reason") or {}
        if isinstance(finish, str):
            finish = {"type": finish}
        kind = finish.get("type") or "unknown"
        if kind == "abort":
            return None
        output_ids = list(response.get("output_ids") or [])
        completion = meta.get("completion_tokens")
        repaired = 0
        if isinstance(completion, int) and len(output_ids) > completion:
            # Old SGLang (< ~0.5.5) prefixed output_ids with prompt-tail ids.
            repaired = len(output_ids) - completion
            output_ids = output_ids[repaired:]
            outcome.repaired += 1
        sampling = payload.sampling if item.seed is None else {**payload.sampling, "sampling_seed": item.seed}
        return Record(
            key=item.key, id=item.row_id, sample=item.sample, turn=item.turn,
            prompt_ids=item.ids, output_ids=output_ids,
            finish_reason=kind, finish_matched=finish.get("matched"),
            prompt_tokens=int(meta.get("prompt_tokens", len(item.ids))),
            completion_tokens=int(completion if isinstance(completion, int) else len(output_ids)),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            campaign=campaign.name, sampling=sampling, source=item.source, server=url,
            worker=self.node, e2e_latency=meta.get("e2e_latency"), created_at=time.time(),
            repaired_prefix=repaired,
        )

    def _commit(self, campaign, payload, folder: Path, records: list[Record], outcome) -> None:
        if not records:
            return
        if campaign.name not in self._swept:
            self._swept.add(campaign.name)
            remove_stale_temporaries(folder)
        write_record_file(folder, campaign=campaign.name, batch=payload.batch, records=records)
        campaign.mark_done(
            [r.key for r in records],
            tokens_in=sum(len(r.prompt_ids) for r in records),
            tokens_out=sum(len(r.output_ids) for r in records),
            repaired=sum(1 for r in records if r.repaired_prefix),
        )
        outcome.written += len(records)
        self._refresh_manifest(campaign, folder)

    def _refresh_manifest(self, campaign: Campaign, folder: Path) -> None:
        now = time.monotonic()
        if now - self._manifest_at.get(campaign.name, -MANIFEST_REFRESH) < MANIFEST_REFRESH:
            return
        self._manifest_at[campaign.name] = now
        write_manifest(folder, build_manifest(campaign))

