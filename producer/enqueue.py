"""`eagle-synth enqueue`: sources -> rows -> tokenize (every core) -> keys -> publisher.

Every row read ends as exactly one of enqueued (a prompt of it was new), duplicate, or skipped
(with its `file:line` and a reason); docs/producer.md.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import redis

from eagle_synth.errors import DamagedInputError, RowError, StrictModeError
from eagle_synth.input_rows import SourceRows, store_latest
from eagle_synth.model_identity import model_vocab_size, tokenizer_canary
from eagle_synth.payload import PromptItem
from eagle_synth.reasons import PROMPT_TOO_LONG, RECORD_DAMAGED
from eagle_synth.settings import BrokerSettings, broker_settings
from eagle_synth.state.campaign import Campaign, CampaignSettings, refuse_other_settings
from eagle_synth.state.keys import CONVERSATIONS, PROMPTS_ENQUEUED, ROWS_READ, ROWS_SKIPPED
from eagle_synth.state.redis_client import connect
from eagle_synth.templating import check_tokenizer_path, load_tokenizer, tokenizer_facts
from eagle_synth.tokenizer_files import covered_files
from producer.options import DEFAULT_MAX_PROMPT_TOKENS, EnqueueOptions
from producer.planner import PromptPlanner
from producer.resume import ResumeCursors, run_scope
from producer.sources import TRUNCATED_FILE, UNREADABLE_FILE, BadRow, expand_inputs, iter_source_rows
from producer.tokenize import TemplateJob, TemplatingPool

log = logging.getLogger("eagle_synth.producer")

# Rows templated together in one pool job.
ROWS_PER_CHUNK = 256
# Examples of each skip reason kept for the summary.
EXAMPLES_PER_REASON = 3
# Seconds between the main thread's looks at a load running on its own thread (interruptible):
# how long a Ctrl-C may wait; a tenth of a second reads as at once.
INTERRUPT_POLL = 0.1

_Result = TypeVar("_Result")


# BadRow reasons that mean the file itself is damaged (cut short, half copied, unreadable): the
# run stops there unless --allow-truncated, since such a file loses every row after the damage.
DAMAGED_FILE_REASONS = frozenset({TRUNCATED_FILE, UNREADABLE_FILE})


@dataclass(slots=True)
class EnqueueSummary:
    """What one enqueue did. rows_read == rows_enqueued + rows_duplicate + rows_skipped;
    rows_resumed of the duplicates an earlier run claimed (not templated again)."""

    campaign: str
    rows_read: int = 0
    rows_enqueued: int = 0
    rows_duplicate: int = 0
    rows_skipped: int = 0
    prompts_enqueued: int = 0
    prompts_duplicate: int = 0
    prompts_skipped: int = 0
    prompts_recovered: int = 0
    prompts_replayed: int = 0
    rows_resumed: int = 0
    # Of the resumed rows, those the earlier run skipped (known from its cursor; 0 for old cursors).
    rows_resumed_skipped: int = 0
    tasks: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    length_buckets: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    dry_run: bool = False
    # A dry run found the campaign in Redis: its counts are what the real run would enqueue there.
    consulted_redis: bool = False
    # Rows read and skipped per source (as given), stored per source so a rerun replaces them.
    by_source: dict[str, SourceRows] = field(default_factory=dict)

    @property
    def accounted(self) -> bool:
        return self.rows_read == self.rows_enqueued + self.rows_duplicate + self.rows_skipped

    def source(self, source: str) -> SourceRows:
        return self.by_source.setdefault(source, SourceRows())

    def skip(self, where: str, reason: str, detail: str, *, chunk: SourceRows) -> None:
        """Count a skipped row in the run's totals and in its chunk's `chunk` (its source's)."""
        self.rows_skipped += 1
        self.skipped[reason] += 1
        for tally in (self.source(source_of(where)), chunk):
            tally.skipped += 1
            tally.skipped_by_reason[reason] += 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(f"{where}: {detail}")

    def histogram(self) -> list[tuple[str, int]]:
        return [(f"<={b}", self.length_buckets[b]) for b in sorted(self.length_buckets)]

    def count_length(self, length: int) -> None:
        self.length_buckets[max(16, 1 << (length - 1).bit_length())] += 1

    def to_dict(self) -> dict:
        counts = {
            name: getattr(self, name) for name in self.__slots__ if name.startswith(("rows_", "prompts_", "tasks"))
        }
        return {
            "campaign": self.campaign,
            "dry_run": self.dry_run,
            "consulted_redis": self.consulted_redis,
            **counts,
            "skipped_by_reason": dict(self.skipped),
            "examples": self.examples,
            "prompt_length_histogram": dict(self.histogram()),
            "seconds": round(self.seconds, 3),
        }


def source_of(where: str) -> str:
    """The source of a `file:line`."""
    return where.rsplit(":", 1)[0]


# Per source, the rows of one templating chunk: read (resumed ones included) and skipped.
ChunkCounts = dict[str, SourceRows]


@dataclass(slots=True)
class _Rows:
    """One run's rows into prompt items, as `options` ask: planned by `planner`, capped
    (--max-prompt-chars before templating, `max_prompt_tokens` after), every row counted in
    `summary`, a skipped one raising StrictModeError with --strict."""

    options: EnqueueOptions
    summary: EnqueueSummary
    planner: PromptPlanner
    max_prompt_tokens: int | None
    # Per source, the rows of every chunk claimed so far (and those an earlier run's cursor
    # vouches for): what `status` shows for an interrupted run, and what its rerun goes on from.
    claimed: dict[str, SourceRows] = field(default_factory=dict)

    def chunks(
        self, rows: Iterator, cursors: ResumeCursors | None
    ) -> Iterator[tuple[tuple[list, dict, ChunkCounts], list]]:
        """((rows, reached, counts), their prompts' template inputs): rows templated together
        (`file:line`, planned prompts), per source the last line read, up to which every row is
        accounted for once the chunk is claimed (producer/resume.py), and the chunk's rows per
        source (ChunkCounts, for `claim`); rows an earlier run claimed are left out."""
        summary = self.summary
        chunk = list[tuple[str, list]]()
        reached = dict[str, int]()
        flat = list[tuple]()
        counts = ChunkCounts()
        for row in rows:
            summary.rows_read += 1
            tally = summary.source(row.source)
            tally.read += 1
            here = counts.setdefault(row.source, SourceRows())
            here.read += 1
            reached[row.source] = row.line
            # Line 0 is a whole file's problem (unreadable): never an earlier run's row.
            if cursors is not None and 0 < row.line <= cursors.resume_after(row.source):
                summary.rows_duplicate += 1
                summary.rows_resumed += 1
                tally.resumed += 1
                here.resumed += 1
                continue
            where = f"{row.source}:{row.line}"
            if isinstance(row, BadRow):
                if row.reason in DAMAGED_FILE_REASONS and not self.options.allow_truncated:
                    raise DamagedInputError(damaged_message(row, rows_before=tally.read - 1))
                self.skip(where, row.reason, row.detail, chunk=here)
                continue
            try:
                conversations = self.planner.plan(row.data, source=row.source, line=row.line)
            except RowError as exc:
                self.skip(where, exc.reason, str(exc), chunk=here)
                continue
            conversations = self._within_char_cap(where, conversations, chunk=here)
            if conversations:
                chunk.append((where, conversations))
                flat.extend(c.template_input() for c in conversations)
            if len(chunk) >= ROWS_PER_CHUNK:
                yield (chunk, dict(reached), counts), flat
                chunk = []
                flat = []
                counts = ChunkCounts()
        # The last, maybe empty: its `reached` and counts cover rows skipped at the end.
        yield (chunk, reached, counts), flat

    def claim(self, counts: ChunkCounts, cursors: ResumeCursors | None) -> None:
        """A chunk is claimed: its rows join `claimed`. A source's resumed rows bring the skips
        the earlier run counted among them (its cursor keeps them), so a rerun after an
        interruption ends with the figures of a run never interrupted."""
        for source, rows in counts.items():
            total = self.claimed.get(source)
            if total is None:
                total = SourceRows()
                self.claimed[source] = total
                earlier = cursors.skipped_before(source) if cursors is not None and rows.resumed else None
                if earlier is not None:
                    total.inherited = True
                    total.skipped = earlier.total()
                    total.skipped_by_reason = earlier
                    self.summary.rows_resumed_skipped += earlier.total()
            total.read += rows.read
            total.resumed += rows.resumed
            total.skipped += rows.skipped
            total.skipped_by_reason.update(rows.skipped_by_reason)

    def _within_char_cap(self, where: str, conversations: list, *, chunk: SourceRows) -> list:
        """The conversations under --max-prompt-chars; the row is skipped if none is."""
        cap = self.options.max_prompt_chars
        if not cap:
            return conversations
        kept = []
        largest = 0
        for conversation in conversations:
            size = _text_size(conversation.messages) + _text_size(conversation.tools)
            if size > cap:
                largest = max(largest, size)
                self.summary.prompts_skipped += self.options.sampling.n
            else:
                kept.append(conversation)
        if not kept:
            detail = f"{largest} characters > --max-prompt-chars {cap} (checked before templating)"
            self.skip(where, PROMPT_TOO_LONG, detail, chunk=chunk)
        return kept

    def items(self, where: str, conversations: list, results: list, *, chunk: SourceRows) -> list[PromptItem]:
        """The items of a row's templated conversations (`results`: ids, or the template's
        error); `chunk`: its chunk's counts of the row's source."""
        items: list[PromptItem] = []
        problems: list[tuple[str, str]] = []
        cap = self.max_prompt_tokens
        for conversation, result in zip(conversations, results):
            if isinstance(result, str):
                problems.append(("template-error", result))
            elif cap and len(result) > cap:
                problems.append((PROMPT_TOO_LONG, f"{len(result)} tokens > --max-prompt-tokens {cap}"))
            else:
                self.summary.count_length(len(result))
                items.extend(self.planner.items(conversation, result, where=where))
                continue
            self.summary.prompts_skipped += self.options.sampling.n
        if not items and problems:
            self.skip(where, *problems[0], chunk=chunk)
        return items

    def skip(self, where: str, reason: str, detail: str, *, chunk: SourceRows) -> None:
        self.summary.skip(where, reason, detail, chunk=chunk)
        if self.options.strict:
            raise StrictModeError(f"{where}: {reason}: {detail} (--strict stops at the first skipped row)")


def interruptible(call: Callable[[], _Result]) -> _Result:
    """call() on a daemon thread, the main thread waiting in INTERRUPT_POLL steps: a tokenizer's
    load is one long Rust call during which the main thread cannot take a Ctrl-C (seconds to
    minutes for a large vocabulary); this way Ctrl-C acts at once and the load is abandoned."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller as it is
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="eagle-synth-load", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(INTERRUPT_POLL)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def damaged_message(row: BadRow, *, rows_before: int) -> str:
    """One line: which file is damaged where, what was read before, what to do."""
    where = row.source if row.line == 0 else f"{row.source}:{row.line}"
    return (
        f"{where}: {row.reason}: {row.detail}; {rows_before} rows were read from this file before it. "
        "A file cut short or half copied loses every row after the damage: copy it again, or pass "
        "--allow-truncated to enqueue the rows before the damage and go on"
    )


def _text_size(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    parts = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return sum(map(_text_size, parts))


def resolve_max_prompt_tokens(requested: int | None, stored: CampaignSettings | None) -> int | None:
    """The token cap a run uses: as asked (0 = none), else the campaign's own (so a rerun of a
    command older than the default is not refused as a settings change), else the default."""
    if requested is not None:
        return requested or None
    return stored.max_prompt_tokens if stored is not None else DEFAULT_MAX_PROMPT_TOKENS


def resolve_tool_format(options: EnqueueOptions, tokenizer) -> tuple[str | None, str | None]:
    """(the format tool calls are parsed in, why there is none); only `--history own` parses
    the model's answers, and rows with tools are skipped when no format is detected."""
    from eagle_synth.errors import ToolFormatError
    from eagle_synth.toolcalls import resolve_tool_format as resolve

    if options.history != "own":
        return None, None
    try:
        return resolve(getattr(tokenizer, "chat_template", None), override=options.tool_format), None
    except ToolFormatError as exc:  # none detected: EnqueueOptions checked --tool-format
        return None, str(exc)


def campaign_settings(
    options: EnqueueOptions, tokenizer, *, tool_format: str | None, max_prompt_tokens: int | None = None
) -> CampaignSettings:
    # Every fact but the fingerprint is the setting of its name (chat_template_hash, vocab_size, ...).
    facts = asdict(tokenizer_facts(tokenizer))
    local = Path(options.tokenizer).expanduser().is_dir()
    return CampaignSettings(
        name=options.campaign,
        tokenizer_path=str(options.tokenizer),
        tokenizer_fingerprint=facts.pop("fingerprint"),
        **facts,
        chat_template_kwargs=dict(options.chat_template_kwargs),
        system_prompt=options.system,
        sampling=options.sampling.to_dict(),
        max_prompt_tokens=max_prompt_tokens,
        created_at=time.time(),
        history=options.history,
        max_turns=options.max_turns if options.history == "own" else None,
        variants=[v.to_dict() for v in options.variants],
        tool_format=tool_format,
        batch_size=options.batch_size,
        model_vocab_size=model_vocab_size(options.tokenizer),
        tokenizer_canary=tokenizer_canary(tokenizer),
        tokenizer_files=covered_files(options.tokenizer) if options.trust_remote_code and local else {},
    )


def enqueue(
    options: EnqueueOptions,
    *,
    broker: BrokerSettings | None = None,
    stdin: IO[bytes] | None = None,
    on_rows: Callable[[EnqueueSummary], None] | None = None,
    on_wait: Callable[..., None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    tokenizer: Any = None,
    on_phase: Callable[[str], None] | None = None,
) -> EnqueueSummary:
    """Template every row of the inputs and enqueue new prompts; returns the summary.

    `tokenizer`: `options.tokenizer` already loaded by load_tokenizer (tests enqueue often in
    one process). `on_phase` hears what the run is doing before its first rows are in (loading
    the tokenizer takes seconds to minutes for a large vocabulary). The campaign is registered only once it has a prompt to enqueue. Raises
    CampaignMismatch, InputError (every input checked first), StrictModeError, TemplateError,
    EvictingRedisError.
    """
    started = time.monotonic()
    summary = EnqueueSummary(campaign=options.campaign, dry_run=options.dry_run)
    inputs = expand_inputs(options.inputs)
    check_tokenizer_path(options.tokenizer)
    say = on_phase or (lambda _phase: None)
    if tokenizer is None:
        say(f"loading the tokenizer {options.tokenizer}")
        tokenizer = interruptible(
            lambda: load_tokenizer(
                options.tokenizer, trust_remote_code=options.trust_remote_code, chat_template_file=options.chat_template
            )
        )
    broker = broker or broker_settings()
    tool_format, no_tool_format = resolve_tool_format(options, tokenizer)

    publisher = None if options.dry_run else _publisher(options, broker, on_wait, on_warning or log.warning)
    # A dry run's campaign is the one in Redis, if Redis answers.
    campaign = publisher.campaign if publisher is not None else _existing_campaign(options.campaign, broker)
    stored = campaign.settings() if campaign is not None else None
    summary.consulted_redis = publisher is None and campaign is not None
    max_prompt_tokens = resolve_max_prompt_tokens(options.max_prompt_tokens, stored)
    settings = campaign_settings(options, tokenizer, tool_format=tool_format, max_prompt_tokens=max_prompt_tokens)
    if summary.consulted_redis and stored is not None:
        refuse_other_settings(options.campaign, stored, settings)  # what the real run would refuse, writing nothing
    registered = publisher is not None and stored is not None
    cursors = None
    if publisher is not None:
        campaign = publisher.campaign
        if registered:
            from eagle_synth.state.campaign_archive import reopen_if_closed

            # A closed campaign's keys come back before any is claimed; the user hears of it.
            if (reopened := reopen_if_closed(campaign)) is not None:
                (on_warning or log.warning)(
                    f"campaign {options.campaign!r} was closed: reopened it, {reopened[0]} done and "
                    f"{reopened[1]} failed keys read back from its state file (`eagle-synth close` folds it again)"
                )
            _register(campaign, settings, options, tokenizer)  # refuses other settings before templating
            summary.prompts_recovered = publisher.recover()
        scope = run_scope(
            settings.to_json(),
            turns=options.turns,
            max_prompt_chars=options.max_prompt_chars,
            max_prompt_tokens=max_prompt_tokens,
        )
        damaged = campaign.failure_counts().get(RECORD_DAMAGED, 0) > 0
        cursors = ResumeCursors(campaign.client, campaign.keys, scope=scope, enabled=not damaged)
    seen_in_dry_run: set[str] = set()

    def claim(items: list[PromptItem]) -> list[bool]:
        """Per item, whether it is new (a dry run: new to this run and to the campaign in Redis)."""
        nonlocal registered
        if publisher is not None:
            if items and not registered:
                _register(publisher.campaign, settings, options, tokenizer)
                registered = True
            return publisher.claim(items)
        new = [item.key not in seen_in_dry_run for item in items]
        seen_in_dry_run.update(item.key for item in items)
        if campaign is not None:  # was_enqueued([]) is [] without asking Redis
            new = [is_new and not was for is_new, was in zip(new, campaign.was_enqueued([i.key for i in items]))]
        return new

    job = TemplateJob(
        tokenizer=str(options.tokenizer),
        trust_remote_code=options.trust_remote_code,
        chat_template_file=options.chat_template,
        template_kwargs=tuple(sorted(options.chat_template_kwargs.items())),
    )
    say("starting the templating processes")
    pool = TemplatingPool(job, processes=options.processes, tokenizer=tokenizer)
    say("templating the first rows")
    run = _Rows(options, summary, PromptPlanner(options, no_tool_format=no_tool_format), max_prompt_tokens)
    try:
        rows = itertools.islice(iter_source_rows(inputs, stdin=stdin), options.limit)  # limit None: every row
        for (chunk, reached, counts), results in pool.map(run.chunks(rows, cursors)):
            left = iter(results)
            per_row = [
                run.items(where, planned, [next(left) for _ in planned], chunk=counts[source_of(where)])
                for where, planned in chunk
            ]
            flags = iter(claim([item for items in per_row for item in items]))
            for items in filter(None, per_row):  # rows without items were skipped above
                new = sum(next(flags) for _ in items)
                summary.prompts_enqueued += new
                summary.prompts_duplicate += len(items) - new
                summary.rows_enqueued += new > 0
                summary.rows_duplicate += new == 0
            run.claim(counts, cursors)
            if cursors is not None and registered:
                cursors.note(reached, run.claimed)
            if on_rows:
                on_rows(summary)
    except BaseException:
        pool.close(abort=True)  # Ctrl-C or an error: the chunks in the pool are not wanted
        raise
    finally:
        pool.close()
        if publisher is not None:
            publisher.close()
            summary.tasks = publisher.tasks
            summary.prompts_replayed = publisher.replayed
            if registered:
                campaign = publisher.campaign
                campaign.count(
                    {
                        ROWS_READ: summary.rows_read,
                        ROWS_SKIPPED: summary.rows_skipped,
                        PROMPTS_ENQUEUED: summary.prompts_enqueued,
                    }
                )
                campaign.count_skipped(dict(summary.skipped))
                # The rows claimed (an interrupted run's rows past its last claim are read again by its rerun).
                store_latest(campaign.client, campaign.keys, run.claimed)
        summary.seconds = time.monotonic() - started
    return summary


def _publisher(
    options: EnqueueOptions, broker: BrokerSettings, on_wait: Callable[..., None] | None, warn: Callable[[str], None]
):
    from eagle_synth.queue import make_celery
    from eagle_synth.state.campaign_control import refuse_if_cancelled, set_priority
    from eagle_synth.state.redis_policy import check_redis_ready
    from eagle_synth.state.redis_role import refuse_replica
    from producer.publisher import Publisher

    client = connect(broker)
    refuse_replica(client)
    check_redis_ready(
        client, warn=warn, allow_evicting=options.allow_evicting_redis, allow_volatile=options.allow_volatile_redis
    )
    refuse_if_cancelled(client, options.campaign)
    if options.priority is not None:
        set_priority(client, options.campaign, options.priority, base_queue=broker.queue)
    return Publisher(
        campaign=Campaign(client, options.campaign),
        app=make_celery(broker),
        queue=broker.queue,
        sampling=options.sampling.server(),
        batch_size=options.batch_size,
        max_backlog=options.max_backlog,
        max_backlog_bytes=options.max_backlog_mb * 1_000_000,
        on_wait=on_wait,
        count_new_as=CONVERSATIONS if options.history == "own" else None,
    )


def _existing_campaign(name: str, broker: BrokerSettings) -> Campaign | None:
    """For a dry run (which needs no Redis): the campaign in Redis, else None."""
    try:
        campaign = Campaign(connect(broker), name)
        return campaign if campaign.exists() else None
    except redis.RedisError as exc:
        log.info("dry run without Redis (%s): counting as for a new campaign", exc)
        return None


def _register(campaign: Campaign, settings, options: EnqueueOptions, tokenizer) -> None:
    """Register the settings; with history 'own', also the tokenizer workers render later turns
    with, unless it runs code (tokenizer_files): workers load that from their own folder."""
    campaign.register(settings)
    if options.history == "own" and not settings.tokenizer_files:
        from eagle_synth.state.tokenizer_store import store_tokenizer

        store_tokenizer(
            campaign.client,
            tokenizer,
            fingerprint=settings.tokenizer_fingerprint,
            chat_template_hash=settings.chat_template_hash,
        )


def print_summary(summary: EnqueueSummary) -> None:
    verb = "would enqueue" if summary.dry_run else "enqueued"
    resumed = ""
    if summary.rows_resumed:
        earlier = f", which skipped {summary.rows_resumed_skipped} of them" if summary.rows_resumed_skipped else ""
        resumed = f" / resumed {summary.rows_resumed} (read by an earlier run{earlier}: not templated again)"
    print(
        f"rows read {summary.rows_read} / {verb} {summary.rows_enqueued} / duplicate "
        f"{summary.rows_duplicate - summary.rows_resumed} / skipped {summary.rows_skipped}{resumed}"
    )
    print(
        f"prompts {verb} {summary.prompts_enqueued} in {summary.tasks} tasks, duplicate "
        f"{summary.prompts_duplicate}, skipped {summary.prompts_skipped}"
        + (" (too long or refused by the template; rows skipped whole have none)" if summary.rows_skipped else "")
        + (f", republished after a killed run {summary.prompts_recovered}" if summary.prompts_recovered else "")
        + (f", re-enqueued after `repair` {summary.prompts_replayed}" if summary.prompts_replayed else "")
        + f" ({summary.seconds:.1f} s)"
    )
    for reason, count in summary.skipped.most_common():
        print(f"  skipped {reason}: {count}")
        for example in summary.examples.get(reason, []):
            print(f"    {example}")
    if summary.dry_run:
        print(
            f"dry run: counted against campaign {summary.campaign!r} as it stands in Redis"
            if summary.consulted_redis
            else f"dry run: no campaign {summary.campaign!r} in Redis (or Redis not reachable): counted as a new campaign"
        )
    if summary.dry_run and summary.length_buckets:
        print("prompt length histogram (tokens):")
        peak = max(count for _, count in summary.histogram())
        for label, count in summary.histogram():
            print(f"  {label:>8} {count:>8} {'#' * max(1, round(40 * count / peak))}")
