"""FollowUps: a worker process's part in multi-turn regeneration (`enqueue --history own`).

A committed turn k goes to the queue as turn k+1 (states and scripts:
eagle_synth/state/conversation_store.py; the crash analysis: docs/reliability.md):
1. commit (batch thread): one script marks turn k done and stores the conversation's end or an
   outbox entry `render` for turn k+1, owned by this process;
2. render (workers/renderer.py's processes, off this process's GIL): the answer becomes an
   assistant message and the next prompt is templated;
3. ready: turn k+1's key is claimed and its entry holds the item, or the conversation ends;
4. form and publish: rendered turns wait up to COALESCE_WAIT for batch-mates, so follow-up
   batches stay near full size; a formed batch is stored before it is published.
A background thread drives 2-4 and sweeps between them: entries held by a dead process are
adopted and carried on from their state. A second keeps this process's liveness key alive, so a
slow render or publish cannot let it lapse.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import redis

from eagle_synth.conversation import END_TEMPLATE_ERROR, ConversationState, NextTurn, end_before_render, turn_key
from eagle_synth.errors import RendererMismatch, TokenizerFolderError, TokenizerUnavailable
from eagle_synth.ids import pack_ids, unpack_ids
from eagle_synth.payload import DEFAULT_BATCH_SIZE, PromptItem, TaskPayload, batch_id, pack_item, unpack_item
from eagle_synth.processes import holder_alive, holder_id
from eagle_synth.records import Record
from eagle_synth.sampling import ServerSampling
from eagle_synth.settings import TIMINGS
from eagle_synth.state.campaign import Campaign, CampaignSettings, campaign_names
from eagle_synth.state.conversation_store import BATCH_FIELD_PREFIX, END, FOLLOW, NOTHING, ConversationStore, end_json
from eagle_synth.state.fence import Fence
from eagle_synth.state.keys import followup_owner
from eagle_synth.state.tokenizer_store import fetch_tokenizer
from eagle_synth.tokenizer_files import matching_folder
from workers.background import every
from workers.lease import LEASE_TTL
from workers.renderer import Renderer

log = logging.getLogger("eagle_synth.followups")

# Prompts per follow-up batch (what the producer uses by default).
FOLLOWUP_BATCH_SIZE = DEFAULT_BATCH_SIZE
# Seconds a rendered turn waits for batch-mates before a smaller batch is published.
COALESCE_WAIT = 2.0
# ... or only this long while this worker has no prompt waiting for a server (it would idle).
HUNGRY_WAIT = 0.25
# Seconds the background thread sleeps when there is nothing to do.
LOOP_TICK = 0.2
# Seconds between sweeps for entries of dead processes (and this process's own lost ones).
SWEEP_INTERVAL = TIMINGS.followup_sweep
# Seconds this process's liveness key lives without renewal (as a batch lease does).
OWNER_TTL = LEASE_TTL
# Renders sent to the pool per call (amortizes the round trip to a process).
RENDER_CHUNK = 16
# Attempts to render an entry whose renderer process died before it is ended as template-error.
RENDER_ATTEMPTS = 3
# Seconds before a stored tokenizer that failed to start or to match is tried again.
PREPARE_RETRY = 30.0
# Seconds a batch thread waits for the rendering processes to count its answers' tool calls.
COUNT_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class _Answer:
    """A committed turn's answer, as its follow-up holds it until rendered: the record's
    `output_ids`, `finish_reason` and `matched` stop (next_turn's arguments of the same names)."""

    output_ids: list[int]
    finish_reason: str
    matched: int | str | None


@dataclass(slots=True)
class _Pending:
    """A follow-up (turn `key` of `campaign`) held in memory through render, ready, form, sent
    with its batch's `sampling`. Until it is rendered, `item` is the previous turn's (ids left
    out) and `answer` that turn's answer; then `item` is its own and `answer` None. Each outbox
    entry is packed from it once, and read back (`stored`) only by a process that did not hold it."""

    campaign: str
    key: str
    sampling: ServerSampling
    item: PromptItem
    answer: _Answer | None = None
    attempts: int = 0
    since: float = field(default_factory=time.monotonic)

    def packed(self) -> bytes:
        """As the outbox stores it: state "render" (with the answer) or "ready"."""
        data: dict = {"s": "ready", "sampling": self.sampling.as_map(), "item": pack_item(self.item)}
        if self.answer is not None:
            data["s"] = "render"
            data["out"] = pack_ids(self.answer.output_ids)
            data["finish"] = self.answer.finish_reason
            data["matched"] = self.answer.matched
        return msgspec.msgpack.encode(data)

    @classmethod
    def stored(cls, campaign: str, key: str, blob: bytes) -> _Pending:
        data = msgspec.msgpack.decode(blob)
        answer = _Answer(unpack_ids(data["out"]), data["finish"], data["matched"]) if data["s"] == "render" else None
        return cls(campaign, key, ServerSampling(data["sampling"]), unpack_item(data["item"]), answer)


Entry = tuple[str, str, str, bytes | str]  # a ConversationStore step: key, action, target, data


def _end_entry(key: str, item: PromptItem, reason: str, message: str = "") -> Entry:
    conversation = ConversationState.from_dict(item.conversation or {}).key
    blob = end_json(
        reason=reason,
        conversation=conversation,
        turns=item.turn + 1,
        row_id=item.row_id,
        source=item.source,
        message=message,
        at=time.time(),
    )
    return key, END, conversation, blob


def _group_of(pending: _Pending) -> tuple[str, str]:
    """Rendered turns batch together when their campaign and sampling are the same."""
    return pending.campaign, pending.sampling.identity


def _by_campaign(pendings: Iterable[Any], campaign: Callable[[Any], str]) -> dict[str, list]:
    groups: dict[str, list] = defaultdict(list)
    for pending in pendings:
        groups[campaign(pending)].append(pending)
    return groups


def _parse_facts(settings: CampaignSettings) -> dict:
    """What a rendering process needs of the campaign to read an answer."""
    return {
        "eos_token_ids": list(settings.eos_token_ids),
        "think_close_id": settings.think_close_id,
        "tool_format": settings.tool_format,
    }


@dataclass(kw_only=True, eq=False)
class FollowUps:
    """Commits conversation turns and carries their next turns to the queue (module docstring).

    Parameters:
        redis_client: campaign state.
        send: publishes one encoded TaskPayload (eagle_synth.queue.send_payload bound to the app).
        render_processes: rendering processes per stored tokenizer.
        stopping: set when the worker begins to shut down (rendered turns are published at once).
        hungry: True while this worker has no prompt waiting for a server ticket; rendered turns
            then go out after HUNGRY_WAIT instead of waiting for a full batch.
        local_tokenizers: the worker's `--tokenizer` folders: campaigns whose tokenizer runs code
            (settings.tokenizer_files) render with the one holding their files, never from Redis.
    """

    redis_client: redis.Redis
    send: Callable[[dict], None]
    render_processes: int
    stopping: threading.Event = field(default_factory=threading.Event)
    hungry: Callable[[], bool] = lambda: False
    local_tokenizers: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        self.owner = holder_id(secrets.token_hex(4))
        self._lock = threading.Lock()
        self._renderer_lock = threading.Lock()
        self._renderers: dict[tuple[str, str], Renderer] = {}
        self._unavailable: dict[tuple[str, str], tuple[float, str]] = {}
        self._settings: dict[str, CampaignSettings] = {}
        self._to_render: deque[_Pending] = deque()
        self._rendering: dict[tuple[str, str], _Pending] = {}
        self._rendered: queue.Queue = queue.Queue()
        self._ready_results: list[tuple[_Pending, NextTurn]] = []
        self._ready: dict[tuple[str, str], dict[str, _Pending]] = {}
        self._unsent: dict[tuple[str, str], dict] = {}
        self._untracked_before: set[tuple[str, str]] = set()
        self._blocked_until: dict[str, float] = {}
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._flush_now = threading.Event()  # close(): publish what is rendered without waiting
        self._threads: list[threading.Thread] = []
        self._swept_at = 0.0

    def _store(self, name: str) -> ConversationStore:
        return ConversationStore(Campaign(self.redis_client, name))

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background threads (idempotent): they keep this process's liveness key alive and
        adopt dead processes' entries."""
        with self._lock:
            if self._threads:
                return
            self._threads = [threading.Thread(target=self._run, name="eagle-synth-followups", daemon=True)]
        with contextlib.suppress(redis.RedisError):  # else the thread keeps trying
            self._keep_alive()  # before any entry of ours can be seen by another process's sweep
        self._threads[0].start()
        self._threads.append(every(OWNER_TTL / 3, self._keep_alive, stop=self._closed, what="follow-ups liveness"))

    def close(self, *, timeout: float = 5.0) -> None:
        """Publish what is rendered, then stop; what is left is adopted by another process."""
        self._flush_now.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        while self._threads and time.monotonic() < deadline and (any(self._ready.values()) or self._unsent):
            time.sleep(LOOP_TICK)
        self._closed.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()) + 1)
        with contextlib.suppress(redis.RedisError):
            self.redis_client.delete(followup_owner(self.owner))  # others adopt at their next sweep
        with self._renderer_lock:
            for renderer in self._renderers.values():
                renderer.close()
            self._renderers.clear()

    # ---- batch thread API ------------------------------------------------------------------
    def prepare(self, campaign: Campaign, settings: CampaignSettings) -> None:
        """Make sure this campaign's next turns can be rendered here (before generating any);
        raises TokenizerUnavailable (saying what to do) if its stored tokenizer is missing or wrong."""
        if settings.history == "own":
            self._settings.setdefault(campaign.name, settings)
            self._renderer(settings)
            self.start()

    def count_tool_calls(self, settings: CampaignSettings, payload: TaskPayload, records: list[Record]) -> None:
        """Set `tool_calls` on the records of conversation turns with tools, before they are
        written. Parsing needs the tokenizer, so it runs in the rendering processes while this
        batch thread waits; a pool that breaks is replaced and asked once more."""
        if settings.tool_format is None:  # not --history own, or no format to parse calls in
            return
        conversations = {item.key: item.conversation or {} for item in payload.items}
        wanted = [(r, conversations[r.key]) for r in records if conversations.get(r.key, {}).get("steps") is not None]
        if not wanted:
            return
        facts = _parse_facts(settings)
        jobs = [
            {"tools": conv.get("tools"), "output_ids": r.output_ids, "matched": r.finish_matched, **facts}
            for r, conv in wanted
        ]
        for attempt in range(RENDER_ATTEMPTS):
            try:
                counts = self._renderer(settings).count_tool_calls(jobs).result(timeout=COUNT_TIMEOUT)
                break
            except Exception as exc:  # the pool broke (a process died): a new one, or give up
                log.warning("renderer failed counting tool calls (%s: %s)", type(exc).__name__, exc)
                self._drop_renderer(settings)
                if attempt + 1 == RENDER_ATTEMPTS:
                    raise
        for (record, _), count in zip(wanted, counts):
            record.tool_calls = count

    def commit(
        self, campaign: Campaign, payload: TaskPayload, records: list[Record], *, fence: Fence | None = None
    ) -> int:
        """Mark committed records done (their records are on disk); for conversation turns, in
        the same step, store each conversation's end or its next turn. Returns how many were new.
        With a fence, only while the batch lease is the writer's (else LeaseLost, nothing changes)."""
        if not records:
            return 0
        tokens = {
            "tokens_in": sum(len(r.prompt_ids) for r in records),
            "tokens_out": sum(len(r.output_ids) for r in records),
            "repaired": sum(1 for r in records if r.repaired_prefix),
            "tokens_cached": sum(r.cached_tokens for r in records),
        }
        items = {item.key: item for item in payload.items}
        if not any(items[r.key].conversation for r in records if r.key in items):
            return campaign.mark_done([r.key for r in records], fence=fence, **tokens)
        self.start()  # alive (liveness key) before storing entries that name this process
        entries: list[Entry] = []
        follow: dict[str, _Pending] = {}
        for record in records:
            item = items.get(record.key)
            if item is None or item.conversation is None:
                entries.append((record.key, NOTHING, "", ""))
                continue
            state = ConversationState.from_dict(item.conversation)
            if (end := end_before_render(state, finish_reason=record.finish_reason)) is not None:
                entries.append(_end_entry(record.key, item, end))
                continue
            following = turn_key(state.key, item.turn + 1)
            parent = msgspec.structs.replace(item, ids=[])
            answer = _Answer(record.output_ids, record.finish_reason, record.finish_matched)
            pending = _Pending(campaign.name, following, payload.sampling, parent, answer)
            follow[following] = pending
            entries.append((record.key, FOLLOW, following, pending.packed()))
        with self._lock:  # tracked before the script runs, so a sweep never takes them for lost
            self._rendering.update({(campaign.name, key): pending for key, pending in follow.items()})
        stored: set[str] = set()
        try:
            added, stored = ConversationStore(campaign).commit(entries, owner=self.owner, fence=fence, **tokens)
        finally:  # what the script did not store is forgotten; the rest goes on to render
            with self._lock:
                for key, pending in follow.items():
                    if key in stored:
                        self._to_render.append(pending)
                    else:
                        self._rendering.pop((campaign.name, key), None)
        if stored:
            self._wake.set()
        return added

    # ---- background thread -----------------------------------------------------------------
    def _run(self) -> None:
        # The sweep runs between the other steps, never during one: an entry a step is moving is
        # in none of the tracking dicts for that moment, and the sweep must not take it as lost.
        steps = (self._submit_renders, self._store_rendered, self._form_batches, self._publish_formed, self._sweep)
        while not self._closed.is_set():
            for step in steps:
                try:
                    step()
                except (redis.RedisError, OSError) as exc:
                    log.warning("follow-ups: %s: %s (retrying)", step.__name__.strip("_"), exc)
                except Exception:  # one bad step must not stop the others for good
                    log.exception("follow-ups: %s failed (retrying)", step.__name__.strip("_"))
            self._wake.wait(LOOP_TICK)
            self._wake.clear()

    def _keep_alive(self) -> None:
        self.redis_client.set(followup_owner(self.owner), "1", px=int(OWNER_TTL * 1000))

    def campaign_settings(self, name: str) -> CampaignSettings | None:
        """A campaign's settings (read from Redis once per process), None if Redis has none."""
        if name not in self._settings and (settings := Campaign(self.redis_client, name).settings()) is not None:
            self._settings[name] = settings
        return self._settings.get(name)

    def _renderer(self, settings: CampaignSettings) -> Renderer:
        """The renderer for a campaign's tokenizer, started on first need (TokenizerUnavailable)."""
        identity = (settings.tokenizer_fingerprint, settings.chat_template_hash)
        with self._renderer_lock:
            if (renderer := self._renderers.get(identity)) is not None:
                return renderer
            failed = self._unavailable.get(identity)
            if failed and time.monotonic() - failed[0] < PREPARE_RETRY:
                raise TokenizerUnavailable(failed[1])
            folder = self._tokenizer_folder(settings)
            try:
                renderer = Renderer(
                    folder=folder,
                    processes=self.render_processes,
                    fingerprint=identity[0],
                    chat_template_hash=identity[1],
                    trust_remote_code=bool(settings.tokenizer_files),
                )
            except (redis.RedisError, OSError):
                raise
            except Exception as exc:  # a mismatch, or the rendering processes could not start
                message = (
                    str(exc)
                    if isinstance(exc, RendererMismatch)
                    else f"cannot start the rendering processes: {type(exc).__name__}: {exc}"
                )
                self._unavailable[identity] = (time.monotonic(), message)
                raise TokenizerUnavailable(message) from exc
            self._renderers[identity] = renderer
            log.info(
                "rendering next turns with the tokenizer %s (template %s) in %d processes",
                *identity,
                self.render_processes,
            )
            return renderer

    def _tokenizer_folder(self, settings: CampaignSettings) -> Path:
        """Where the campaign's tokenizer is: the local folder holding its code's files (checked
        before any of it runs), else the files stored in Redis (TokenizerUnavailable)."""
        if settings.tokenizer_files:
            try:
                return matching_folder(list(self.local_tokenizers), settings.tokenizer_files, campaign=settings.name)
            except TokenizerFolderError as exc:
                raise TokenizerUnavailable(str(exc)) from None
        # A tokenizer that is not stored is asked for again each time (one GET): a rerun of the
        # enqueue stores it, and `retry-failed` must then find it at once.
        return fetch_tokenizer(
            self.redis_client,
            fingerprint=settings.tokenizer_fingerprint,
            chat_template_hash=settings.chat_template_hash,
        )

    def _drop_renderer(self, settings: CampaignSettings) -> None:
        with self._renderer_lock:
            renderer = self._renderers.pop((settings.tokenizer_fingerprint, settings.chat_template_hash), None)
        if renderer is not None:
            renderer.close()

    def _submit_renders(self) -> None:
        with self._lock:
            waiting, self._to_render = list(self._to_render), deque()
        for name, group in _by_campaign(waiting, lambda p: p.campaign).items():
            keep = group  # what is not submitted stays for a later tick
            try:
                keep = self._submit_campaign(name, group)
            finally:
                with self._lock:
                    self._to_render.extend(keep)

    def _submit_campaign(self, name: str, group: list[_Pending]) -> list[_Pending]:
        """Send a campaign's turns to its renderer; returns those that could not be sent."""
        if time.monotonic() < self._blocked_until.get(name, 0.0):
            return group
        settings = self.campaign_settings(name)
        try:
            if settings is None:
                raise TokenizerUnavailable(f"campaign {name!r} has no settings in Redis")
            renderer = self._renderer(settings)
        except TokenizerUnavailable as exc:
            log.error("%d next turns of %s wait (trying again in %.0f s): %s", len(group), name, PREPARE_RETRY, exc)
            self._blocked_until[name] = time.monotonic() + PREPARE_RETRY
            return group
        facts = {**_parse_facts(settings), "max_prompt_tokens": settings.max_prompt_tokens}
        for start in range(0, len(group), RENDER_CHUNK):
            chunk = group[start : start + RENDER_CHUNK]
            jobs = [_render_job(pending, facts) for pending in chunk]
            try:
                future = renderer.submit(jobs)
            except Exception as exc:  # the pool broke: a new one at the next tick
                log.warning("renderer unusable (%s: %s); starting a new one", type(exc).__name__, exc)
                self._drop_renderer(settings)
                return group[start:]
            future.add_done_callback(partial(self._on_rendered, chunk))
        return []

    def _on_rendered(self, chunk: list[_Pending], future: Future) -> None:
        # Runs in the pool's management thread: hand over, and let the background thread store it.
        self._rendered.put((chunk, future))
        self._wake.set()

    def _store_rendered(self) -> None:
        while not self._rendered.empty():
            chunk, future = self._rendered.get_nowait()
            try:
                self._ready_results.extend(zip(chunk, future.result()))
            except Exception as exc:  # a renderer process died: start a new pool, try again
                log.warning("renderer failed (%s: %s); rendering %d turns again", type(exc).__name__, exc, len(chunk))
                self._drop_renderer(self._settings[chunk[0].campaign])
                for pending in chunk:
                    pending.attempts += 1
                    if pending.attempts >= RENDER_ATTEMPTS:
                        message = f"the renderer died on it {pending.attempts} times: {exc}"
                        self._ready_results.append((pending, NextTurn(end=END_TEMPLATE_ERROR, message=message)))
                    else:
                        with self._lock:
                            self._to_render.append(pending)
        for name, results in _by_campaign(self._ready_results, lambda r: r[0].campaign).items():
            settings = self._settings[name]  # what its turns were submitted to render with
            entries: list[Entry] = []
            ready = {}
            for pending, turn in results:
                parent = pending.item
                if turn.ids is None or turn.state is None:
                    entries.append(_end_entry(pending.key, parent, turn.end or END_TEMPLATE_ERROR, turn.message))
                    continue
                item = _next_item(parent, ids=turn.ids, state=turn.state, settings=settings)
                rendered = _Pending(name, pending.key, pending.sampling, item)
                ready[pending.key] = rendered
                entries.append((pending.key, "ready", turn.state.key, rendered.packed()))  # the conversation's key
            held = self._store(name).ready(entries, owner=self.owner)
            self._ready_results = [r for r in self._ready_results if r[0].campaign != name]
            with self._lock:
                for pending, _ in results:
                    self._rendering.pop((name, pending.key), None)
                for key, pending in ready.items():
                    if key in held:
                        self._ready.setdefault(_group_of(pending), {})[key] = pending

    def _form_batches(self) -> None:
        now = time.monotonic()
        with self._lock:
            groups = [(group, dict(members)) for group, members in self._ready.items() if members]
        hurry = self.stopping.is_set() or self._flush_now.is_set()
        wait = 0.0 if hurry else HUNGRY_WAIT if self.hungry() else COALESCE_WAIT
        for group_key, members in groups:
            name = group_key[0]
            pendings = sorted(members.values(), key=lambda p: p.since)
            while pendings and (len(pendings) >= FOLLOWUP_BATCH_SIZE or now - pendings[0].since >= wait):
                chunk = pendings[:FOLLOWUP_BATCH_SIZE]
                items = [p.item for p in chunk]
                keys = [i.key for i in items]
                batch = batch_id(keys)
                payload = TaskPayload(campaign=name, batch=batch, sampling=chunk[0].sampling, items=items).encode()
                blob = msgspec.msgpack.encode(payload)
                lost = self._store(name).form(owner=self.owner, batch=batch, payload=blob, keys=keys)
                gone = {p.key for p in chunk if p.key in lost} if lost else set(keys)
                with self._lock:
                    group = self._ready.get(group_key, {})
                    for key in gone:
                        group.pop(key, None)
                    if not lost:
                        self._unsent[(name, batch)] = payload
                pendings = [p for p in pendings if p.key not in gone]

    def _publish_formed(self) -> None:
        with self._lock:
            formed = list(self._unsent.items())
        for (name, batch), payload in formed:
            self.send(payload)
            self._store(name).sent(batch)
            with self._lock:
                self._unsent.pop((name, batch), None)
            log.info("queued %d next turns of %s (batch %s)", len(payload["keys"]), name, batch)

    # ---- sweeping --------------------------------------------------------------------------
    def _sweep(self) -> None:
        if time.monotonic() - self._swept_at < SWEEP_INTERVAL:
            return
        self._swept_at = time.monotonic()
        untracked_now: set[tuple[str, str]] = set()
        for name in ConversationStore.campaigns_with_entries(self.redis_client, campaign_names(self.redis_client)):
            store = self._store(name)
            for owner, pairs in _by_campaign(store.owners().items(), lambda pair: pair[1]).items():
                entries = [entry for entry, _ in pairs]
                if owner == self.owner:
                    # Entries of this process it no longer tracks (a Redis error lost a step's reply):
                    # resumed when still untracked a sweep later, so a step in progress is left alone.
                    lost = [e for e in entries if not self._tracked(name, e)]
                    untracked_now.update((name, e) for e in lost)
                    for entry in [e for e in lost if (name, e) in self._untracked_before]:
                        self._resume(store, name, entry)
                elif not holder_alive(self.redis_client, owner, followup_owner(owner)):
                    taken = store.adopt(entries, owner=self.owner, dead=owner)
                    if taken:
                        log.warning(
                            "adopting %d follow-up entries of %s from a dead worker process %s", len(taken), name, owner
                        )
                    for entry in taken:
                        self._resume(store, name, entry)
        self._untracked_before = untracked_now

    def _tracked(self, name: str, entry: str) -> bool:
        with self._lock:
            if entry.startswith(BATCH_FIELD_PREFIX):
                return (name, entry.removeprefix(BATCH_FIELD_PREFIX)) in self._unsent
            # Every entry waiting to be rendered is in `_rendering` from its commit to its ready.
            return (name, entry) in self._rendering or any(
                entry in members for (group_name, _), members in self._ready.items() if group_name == name
            )

    def _resume(self, store: ConversationStore, name: str, entry: str) -> None:
        """Carry on with an entry this process now holds, from the state it is in."""
        if entry.startswith(BATCH_FIELD_PREFIX):
            batch = entry.removeprefix(BATCH_FIELD_PREFIX)
            if (blob := store.batch(batch)) is not None:
                with self._lock:
                    self._unsent[(name, batch)] = msgspec.msgpack.decode(blob)
            return
        if (blob := store.entry(entry)) is None:
            return
        pending = _Pending.stored(name, entry, blob)
        with self._lock:
            if pending.answer is not None:
                self._rendering[(name, entry)] = pending
                self._to_render.append(pending)
            else:
                self._ready.setdefault(_group_of(pending), {})[entry] = pending


def _render_job(pending: _Pending, facts: dict) -> dict:
    """What a rendering process gets for one follow-up (workers/renderer.py): its state, its
    parent's answer and the campaign's `facts`, as next_turn's keyword arguments."""
    answer = pending.answer
    assert answer is not None, "only follow-ups holding their parent's answer are rendered"
    job = {
        "state": pending.item.conversation,
        "output_ids": answer.output_ids,
        "finish_reason": answer.finish_reason,
        "matched": answer.matched,
    }
    job.update(facts)
    return job


def _next_item(
    parent: PromptItem, *, ids: list[int], state: ConversationState, settings: CampaignSettings
) -> PromptItem:
    key = turn_key(state.key, parent.turn + 1)
    # Every sample has a seed (as the producer gives turn 0): from --seed, else from its key.
    seed = settings.sampling_params().sample_seed(
        prompt_key_material=pack_ids(ids), sample=parent.sample, prompt_key=key
    )
    return msgspec.structs.replace(
        parent, key=key, ids=ids, seed=seed, turn=parent.turn + 1, conversation=state.to_dict()
    )
