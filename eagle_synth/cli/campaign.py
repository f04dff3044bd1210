"""Campaign commands: enqueue prompts, see where a campaign stands, list and retry its failures."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from eagle_synth.cli.flags import settings_flags, settings_from
from eagle_synth.cli.interrupts import arm_interrupts, raise_if_interrupted
from eagle_synth.cli.options import (
    INTERRUPTED_EXIT,
    CampaignArg,
    JsonOpt,
    JsonSummaryOpt,
    RedisOpt,
    check_campaign_name,
    command_group,
    fail,
    print_error,
    redis_client,
    warn,
)
from eagle_synth.sampling import SamplingParams
from eagle_synth.variants import load_variants
from producer.options import EnqueueOptions

if TYPE_CHECKING:
    from eagle_synth.settings import BrokerSettings
    from eagle_synth.state.campaign import Campaign
    from producer.enqueue import EnqueueSummary

app = command_group()


@app.command()
@settings_flags(EnqueueOptions)
def enqueue(
    ctx: typer.Context,
    files: Annotated[
        list[str],
        typer.Argument(help="JSONL / JSON / Parquet files, saved HF dataset folders, globs, or - for JSONL on stdin."),
    ],
    as_json: JsonSummaryOpt = False,
    redis: RedisOpt = None,
) -> None:
    """Template prompt rows with the model's chat template and enqueue their token ids."""
    # Every other flag sets the EnqueueOptions field of its name (producer/options.py declares them).
    sampling = settings_from(SamplingParams, ctx)
    variants_file: Path | None = ctx.params["variants"]  # its variants vary this run's sampling
    options = settings_from(
        EnqueueOptions,
        ctx,
        inputs=files,
        sampling=sampling,
        variants=tuple(load_variants(variants_file, base=sampling)) if variants_file is not None else (),
    )
    check_campaign_name(options.campaign)
    from eagle_synth.settings import broker_settings

    broker = broker_settings(redis_url=redis)  # a dry run reads the campaign from it too, when it answers
    so_far: EnqueueSummary | None = None  # the run's summary, as the producer last reported it

    def on_rows(summary: EnqueueSummary) -> None:
        nonlocal so_far
        so_far = summary
        line.update(summary)
        raise_if_interrupted()

    def on_phase(description: str) -> None:
        line.phase(description)
        raise_if_interrupted()

    try:
        arm_interrupts()  # a Ctrl-C from here on, or one that came while the command started, lands below
        from eagle_synth import progress
        from producer.enqueue import enqueue as run_enqueue
        from producer.enqueue import print_summary
        from producer.sources import READ_PROGRESS, STDIN, estimate_rows, input_bytes

        wanted = not as_json and progress.wanted() and STDIN not in options.inputs
        total_rows = estimate_rows(options.inputs) if wanted else None
        line = progress.EnqueueProgress(
            enabled=not as_json,
            total_rows=total_rows,
            # Inputs whose rows cannot be counted cheaply (a JSON array, compressed JSONL): by bytes read.
            total_bytes=input_bytes(options.inputs) if wanted and total_rows is None else None,
            bytes_read=READ_PROGRESS.bytes_read,
        )
        with line:
            summary = run_enqueue(
                options,
                broker=broker,
                stdin=sys.stdin.buffer,
                on_rows=on_rows,
                on_wait=line.waiting,
                on_warning=warn,
                on_phase=on_phase,
            )
    except KeyboardInterrupt:
        _interrupted(so_far, options=options, broker=broker)
    if as_json:
        print(json.dumps(summary.to_dict()))
    else:
        print_summary(summary)
    if summary.rows_read == 0:
        warn(
            "the input holds no rows: nothing "
            + ("would be " if options.dry_run else "")
            + "enqueued, no campaign created"
        )
    elif not summary.dry_run and summary.rows_skipped == summary.rows_read:
        warn("every row was skipped (reasons above): nothing enqueued, no campaign created")
    if not summary.accounted:
        fail("internal error: rows read != enqueued + duplicate + skipped", code=3)


def _interrupted(summary: EnqueueSummary | None, *, options: EnqueueOptions, broker: BrokerSettings) -> NoReturn:
    """Ctrl-C during enqueue: say what the run kept and that rerunning it resumes; exit 130."""
    import redis as redis_errors

    from eagle_synth.state.campaign import Campaign
    from eagle_synth.state.redis_client import connect

    if options.dry_run:
        fail("interrupted: a dry run enqueues nothing", code=INTERRUPTED_EXIT)
    try:  # the prompts as Redis holds them: the producer's tally can lag a chunk
        enqueued = f"{Campaign(connect(broker), options.campaign).progress().enqueued:,}"
    except redis_errors.RedisError:
        enqueued = "?"
    read = f"; this run read {summary.rows_read} rows" if summary is not None else ""
    print_error(
        f"interrupted: campaign {options.campaign!r} holds {enqueued} "
        f"enqueued prompts, kept in Redis{read}. Rerun the same command to resume: prompts already "
        "enqueued count as duplicates, and those this run claimed but had not queued yet are queued then"
    )
    # Everything is in Redis already; the interpreter's own teardown (a large tokenizer, the
    # templating pool's bookkeeping) took 2-5 s more, so a Ctrl-C ends the process here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(INTERRUPTED_EXIT)


@app.command()
def status(
    campaign: Annotated[list[str], typer.Argument(help="Campaign name; several for one line each.")],
    as_json: JsonOpt = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh a live view until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes with --watch.")] = 2.0,
    redis: RedisOpt = None,
) -> None:
    """Where a campaign stands: enqueued, queued, in flight, stranded, done, failed, throughput, workers;
    its model, priority and the workers taking it. Several campaigns: a table, a line each."""
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.redis_role import refuse_replica
    from eagle_synth.tools.status import campaign_status
    from eagle_synth.tools.status_view import render_fleet, render_status, watch_status

    client = redis_client(redis)
    refuse_replica(client)  # status writes too (its reaper look, a layout move): a replica refuses them
    queue = broker_settings(redis_url=redis).queue
    rows = [campaign_status(client, name, queue=queue) for name in campaign]
    if watch:
        watch_status(client, campaign, interval=interval, as_json=as_json, queue=queue)
    elif as_json:
        print(json.dumps(rows[0] if len(rows) == 1 else rows))
    elif len(rows) == 1:
        render_status(rows[0])
    else:
        render_fleet(rows)


@app.command()
def campaigns(as_json: JsonOpt = False, redis: RedisOpt = None) -> None:
    """List campaigns with their progress."""
    from eagle_synth.settings import broker_settings
    from eagle_synth.tools.status import campaigns_overview

    rows = campaigns_overview(redis_client(redis), queue=broker_settings(redis_url=redis).queue)
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        typer.echo("no campaigns")
    for r in rows:
        if r["cancelled"]:
            typer.echo(f"{r['campaign']:<30} cancelled  done {r['done']}  failed {r['failed']} (records kept on disk)")
            continue
        model = (r["model"] or {}).get("tokenizer") or "?"
        typer.echo(
            f"{r['campaign']:<30} {100 * r['finished_share']:5.1f}%  done {r['done']}  failed {r['failed']}  "
            f"queued {r['queued']}  in flight {r['inflight']}"
            + (f"  stranded {r['stranded']}" if r["stranded"] else "")
            + f"  priority {r['priority']}  workers {len(r['serving'])}  model {model}"
            + ("  closed" if r["ended"] else "")
        )


def _existing_campaign(redis_url: str | None, name: str) -> Campaign:
    from eagle_synth.errors import CampaignNotFound
    from eagle_synth.state.campaign import Campaign

    target = Campaign(redis_client(redis_url), name)
    if not target.exists():
        raise CampaignNotFound(name)
    return target


def _check_failure_reason(target: Campaign, reason: str) -> None:
    """Stop naming --reason unless the campaign has, or once had, failures with that reason: a
    misspelt reason would otherwise re-enqueue nothing and look like success."""
    from eagle_synth.state.keys import FAILED_PREFIX

    ever = {key.removeprefix(FAILED_PREFIX) for key in target.progress().counters if key.startswith(FAILED_PREFIX)}
    known = set(target.failure_counts()) | ever
    if reason in known:
        return
    fail(
        f"--reason {reason!r}: campaign {target.name!r} has no failures with that reason; "
        + (f"its reasons: {', '.join(sorted(known))}" if known else "it has no failures at all")
        + " (`eagle-synth failed` lists them)"
    )


@app.command()
def failed(
    campaign: CampaignArg,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option(help="Examples shown per reason.")] = 5,
    redis: RedisOpt = None,
) -> None:
    """List a campaign's failed prompts by reason."""
    from eagle_synth.tools.failures import failure_summary, format_failures, write_failures_json

    target = _existing_campaign(redis, campaign)
    if as_json:
        write_failures_json(target, sys.stdout, examples=limit)
        return
    for line in format_failures(failure_summary(target, examples=limit), limit=limit):
        typer.echo(line)


@app.command("retry-failed")
def retry_failed(
    campaign: CampaignArg,
    reason: Annotated[str | None, typer.Option(help="Only failures with this reason.")] = None,
    redis: RedisOpt = None,
) -> None:
    """Enqueue a campaign's failed prompts again."""
    from eagle_synth.queue import make_celery
    from eagle_synth.reasons import RECORD_DAMAGED
    from eagle_synth.settings import broker_settings
    from producer.retry import retry_failed as run_retry

    settings = broker_settings(redis_url=redis)
    target = _existing_campaign(redis, campaign)
    if reason is not None:
        _check_failure_reason(target, reason)
    count = run_retry(target, app=make_celery(settings), queue=settings.queue, reason=reason)
    typer.echo(f"re-enqueued {count} failed prompts of {campaign}" + (f" (reason {reason})" if reason else ""))
    damaged = target.failure_counts().get(RECORD_DAMAGED, 0) if reason in (None, RECORD_DAMAGED) else 0
    if damaged:
        typer.echo(
            f"{damaged} prompts failed `{RECORD_DAMAGED}` have no prompt ids to replay: rerun the campaign's "
            "original `eagle-synth enqueue` command to enqueue them again"
        )


@app.command()
def close(
    campaign: CampaignArg,
    out: Annotated[Path, typer.Option("--out", help="Output folder holding NAME/records (the workers' --out).")],
    redis: RedisOpt = None,
) -> None:
    """End a complete campaign: fold its Redis state (keys, failures, counts) into OUT/NAME and free Redis."""
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.campaign import Campaign
    from eagle_synth.state.campaign_archive import close_campaign

    summary = close_campaign(Campaign(redis_client(redis), campaign), out, queue=broker_settings(redis_url=redis).queue)
    typer.echo(
        f"closed {campaign}: {summary.done} done and {summary.failed} failed keys folded into {summary.path} "
        f"({summary.file_bytes:,} bytes); Redis used {summary.redis_bytes_before / 1e6:,.1f} MB before, "
        f"{summary.redis_bytes_after / 1e6:,.1f} MB after"
    )


@app.command()
def priority(
    campaign: CampaignArg,
    level: Annotated[int, typer.Argument(help="0-9, higher is served first.", metavar="PRIORITY")],
    redis: RedisOpt = None,
) -> None:
    """Change a campaign's priority: its queued batches move at once, later ones follow it."""
    from eagle_synth.priorities import check_priority
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.campaign_control import set_priority

    check_priority(level)
    target = _existing_campaign(redis, campaign)
    moved = set_priority(target.client, campaign, level, base_queue=broker_settings(redis_url=redis).queue)
    typer.echo(f"campaign {campaign}: priority {level}; {moved} queued batches moved to it")


@app.command()
def cancel(
    campaign: CampaignArg,
    forget: Annotated[
        bool, typer.Option("--forget", help="Remove a cancelled campaign's marker so its name can be enqueued again.")
    ] = False,
    settle: Annotated[
        float, typer.Option(help="Seconds to wait for workers to stop its prompts in flight before the last sweep.")
    ] = 60.0,
    redis: RedisOpt = None,
) -> None:
    """Cancel a campaign: its queued and stranded batches leave the queue, batches in flight stop
    at their next prompt, its Redis state is freed; records already written stay readable."""
    from eagle_synth.errors import CampaignNotFound
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.campaign import Campaign
    from eagle_synth.state.campaign_control import cancel_campaign, cancel_marker, forget_cancel

    client = redis_client(redis)
    if forget:
        if not forget_cancel(client, campaign):
            fail(f"campaign {campaign!r} was not cancelled: nothing to forget")
        typer.echo(f"forgot the cancel of {campaign}: the name can be enqueued again")
        return
    if not Campaign(client, campaign).exists():
        if cancel_marker(client, campaign) is not None:
            typer.echo(f"campaign {campaign} was already cancelled")
            return
        raise CampaignNotFound(campaign)

    def waiting(inflight: int) -> None:
        typer.echo(f"waiting for workers to stop {inflight} prompts in flight ...", err=True)

    done = cancel_campaign(
        client, campaign, base_queue=broker_settings(redis_url=redis).queue, settle_timeout=settle, on_wait=waiting
    )
    typer.echo(
        f"cancelled {campaign}: {done.queued_batches} queued and {done.held_batches} held batches taken off the "
        f"queue, {done.keys_deleted} Redis keys freed; its {done.done} records stay in its folder, "
        f"{done.failed} prompts had failed"
    )
    if not done.settled:
        warn(
            f"workers still reported prompts of {campaign} in flight after {settle:g} s; they write nothing "
            "more (their leases are gone): run `eagle-synth cancel` again later to sweep what they leave"
        )


@app.command()
def reopen(
    campaign: CampaignArg,
    state: Annotated[
        Path | None, typer.Option("--state", help="The state file `close` wrote (default: where it wrote it).")
    ] = None,
    redis: RedisOpt = None,
) -> None:
    """Read a closed campaign's state back into Redis (enqueue and retry-failed do this themselves)."""
    from eagle_synth.state.campaign import Campaign
    from eagle_synth.state.campaign_archive import ended_info, reopen_campaign

    target = Campaign(redis_client(redis), campaign)
    info = ended_info(target)
    if info is None and state is None:
        fail(f"campaign {campaign!r} is not closed")
    path = state if state is not None else Path(info["path"] if info else "")
    done, failed = reopen_campaign(target, path)
    typer.echo(f"reopened {campaign}: {done} done and {failed} failed keys read back")
