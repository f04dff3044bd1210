"""CLI commands for operations: `eagle-synth flower`, `eagle-synth repair`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from eagle_synth.cli import RedisOpt, _client, _fail, app


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def flower(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="Port of Flower's web UI and API.")] = 5555,
    address: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 to serve other hosts.")] = "127.0.0.1",
    basic_auth: Annotated[Optional[str], typer.Option(
        "--basic-auth", help="user:password[,user2:password2]. Default: $FLOWER_BASIC_AUTH (preferred: not shown by ps).",
    )] = None,
    no_auth: Annotated[bool, typer.Option(
        "--no-auth", help="Start without credentials (UI open to anyone who can reach it; API refused).",
    )] = False,
    redis: RedisOpt = None,
) -> None:
    """Run Flower on the campaign broker, with basic auth. Unknown options go to Flower (e.g. --url_prefix=flower)."""
    from eagle_synth.settings import SettingsError, broker_settings
    from eagle_synth.tools.flower import FlowerAuthError, FlowerOptions, flower_urls, resolve_auth, run_flower

    try:
        settings = broker_settings(redis_url=redis)
        credentials = resolve_auth(basic_auth=basic_auth, no_auth=no_auth, environ=os.environ)
    except (FlowerAuthError, SettingsError) as exc:
        _fail(str(exc))
    options = FlowerOptions(
        credentials=tuple(credentials) if credentials is not None else None,
        port=port, address=address, extra_args=tuple(ctx.args),
    )
    users = ", ".join(c.split(":", 1)[0] for c in credentials) if credentials else "none (--no-auth)"
    broker_page, queue_api = flower_urls(address=address, port=port)
    typer.echo(f"Flower on queue {settings.queue!r}: {broker_page} (API {queue_api}); basic-auth users: {users}")
    raise typer.Exit(run_flower(settings=settings, options=options))


@app.command()
def repair(
    campaign_dir: Annotated[Path, typer.Argument(help="Campaign folder: OUT/<campaign>.")],
    campaign: Annotated[Optional[str], typer.Option("--campaign", help="Campaign name (default: manifest.json's, else the folder's name).")] = None,
    dry_run: Annotated[bool, typer.Option(help="Show what would be moved and requeued; change nothing.")] = False,
    force: Annotated[bool, typer.Option(help="Requeue lost keys even when more are missing than the damaged files can have held.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan and outcome as one JSON object.")] = False,
    redis: RedisOpt = None,
) -> None:
    """Move damaged record files to DIR/damaged/ and put the prompts they held back on the queue.

    Prompts read back intact are queued again at once; the others are recorded as failures
    `record-damaged`, which a rerun of the campaign's original `enqueue` command re-enqueues.
    Rerun it until it reports nothing; see docs/reliability.md.
    """
    from eagle_synth.campaign import Campaign
    from eagle_synth.queue import make_celery
    from eagle_synth.records import records_dir
    from eagle_synth.settings import broker_settings
    from eagle_synth.tools.compact import CompactBusy, exclusive
    from eagle_synth.tools.repair import (
        campaign_name_of,
        mark_record_damaged,
        move_aside,
        plan_repair,
    )
    from producer.retry import publish_unfinished, return_lost_records

    name = campaign or campaign_name_of(campaign_dir)
    if not records_dir(campaign_dir).is_dir():
        _fail(f"{records_dir(campaign_dir)} does not exist: is {campaign_dir} a campaign folder (OUT/<campaign>)?")
    try:
        target = Campaign(_client(redis), name)
    except ValueError as exc:
        _fail(f"--campaign: {exc}")
    settings = broker_settings(redis_url=redis)
    outcome = {"republished_from_outbox": 0, "moved": [], "requeued": 0, "record_damaged": 0}
    try:
        with exclusive(records_dir(campaign_dir)):
            plan = plan_repair(campaign_dir, target, force=force)
            if plan.refusal is None and not dry_run:
                celery_app = make_celery(settings)
                # A repair stopped half way may have left prompts in the outbox: publish them first.
                outcome["republished_from_outbox"] = publish_unfinished(target, app=celery_app, queue=settings.queue)
                outcome["moved"] = [str(p) for p in move_aside(plan)]
                outcome["requeued"] = return_lost_records(target, plan.recoverable, app=celery_app, queue=settings.queue)
                outcome["record_damaged"] = mark_record_damaged(target, plan.unrecoverable)
    except CompactBusy as exc:
        _fail(str(exc))
    except KeyError as exc:
        _fail(str(exc.args[0]))
    if as_json:
        print(json.dumps({**plan.to_dict(), "dry_run": dry_run, **outcome}))
    else:
        _print_repair(plan, outcome, dry_run=dry_run)
    if plan.refusal is not None:
        _fail(plan.refusal)


def _print_repair(plan, outcome: dict, *, dry_run: bool) -> None:
    live = [d for d in plan.damaged if not d.moved_before]
    typer.echo(f"{plan.folder}: {plan.healthy_records} readable records in {plan.healthy_files} files; "
               f"{len(live)} damaged files; {plan.done} keys done in Redis, {len(plan.lost)} of them "
               "without a readable record here")
    if not live and not plan.lost:
        typer.echo("nothing to repair")
        return
    for damaged in plan.damaged if plan.lost else live:
        where = "in damaged/ already" if damaged.moved_before else "to move to damaged/"
        typer.echo(f"  {damaged.path.name} ({where}; {damaged.salvaged} prompts read back intact): {damaged.error}")
    if plan.refusal is not None:
        return
    if dry_run:
        typer.echo(f"would requeue {len(plan.recoverable)} prompts read back intact and record "
                   f"{len(plan.unrecoverable)} as failed `record-damaged`")
        return
    if outcome["republished_from_outbox"]:
        typer.echo(f"published {outcome['republished_from_outbox']} prompts an earlier stopped run left in the outbox")
    typer.echo(f"moved {len(outcome['moved'])} damaged files aside; requeued {outcome['requeued']} prompts; "
               f"recorded {outcome['record_damaged']} as failed `record-damaged`")
    if outcome["record_damaged"]:
        typer.echo("  their prompts could not be read back: rerun the campaign's original `eagle-synth enqueue` "
                   "command to enqueue them again (everything else counts as duplicate)")
