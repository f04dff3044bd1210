"""Commands over record folders: export, vocab, verify, inspect, compact, repair."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from eagle_synth.cli.flags import settings_flags, settings_from
from eagle_synth.cli.options import (
    JsonSummaryOpt,
    RedisOpt,
    command_group,
    fail,
    output_errors,
    redis_client,
    warn,
)
from eagle_synth.errors import NotACampaignFolder, RecordFormatError
from eagle_synth.records import read_manifest, record_files, records_dir
from eagle_synth.tools.compact import DEFAULT_MIN_AGE, DEFAULT_SHARD_BYTES, DEFAULT_THREADS, exclusive
from eagle_synth.tools.compact import compact as run_compact
from eagle_synth.tools.filters import ExportFilters

if TYPE_CHECKING:
    from eagle_synth.progress import RecordsProgress

app = command_group()
# compact's flags' defaults are the library's.

CampaignDirArg = Annotated[Path, typer.Argument(help="Campaign folder: OUT/<campaign>.")]
# The help of the flags whose declaration would not fit a line, by parameter (and command) name.
HELP = {
    "out": "jsonl/parquet/specforge: output file (.jsonl, .jsonl.gz, .parquet); with --shard-rows a name to number or a folder. speculators/hf: a folder.",
    "format": "jsonl or parquet (every record field); specforge (JSONL for data.prompts_path); speculators (its prepared-data folder + token_freq); hf (a datasets folder, load_from_disk). Default: from --out's extension (.parquet, .jsonl, .jsonl.gz), else jsonl.",
    "shard_rows": "Rows per output file: out-00000.parquet, ... (default: one file; speculators/hf: datasets' shard size).",
    "turns": "--history own campaigns: 'all' turns of each conversation, or only its 'last' one.",
    "shard_tokens": "jsonl/parquet/specforge: at most N ids per output file; one SpecForge run per file holds about 44 bytes per id.",
    "zero_last_loss": "specforge, EAGLE-3 strategies: loss_mask 0 on each row's last token, which SpecForge trains on a zero target (upstream #885). Not for DFlash.",
    "replace": "speculators/hf: replace --out even if it holds files no export wrote (hidden_states/, d2t.npy, vocab files).",
    "draft_vocab_size": "Size of the draft vocabulary (e.g. 32000).",
    "vocab out": "Folder for token_freq.json, d2t.npy, t2d.npy, vocab_mapping.json (and .pt files with torch); a speculators data folder is a good place.",
    "target_vocab_size": "The target model's vocab_size (default: config.json in the manifest's tokenizer_path).",
    "tokenizer": "The campaign's tokenizer folder (default: the settings in manifest.json).",
    "inspect tokenizer": "The campaign's tokenizer folder (default: tokenizer_path in manifest.json).",
    "shard_mb": "MiB of batch files merged into each shard.",
    "min_age": "Only merge batch files at least this many seconds old.",
    "threads": "zstd compression threads (0 = the calling thread only). Default: one per core.",
    "campaign": "Campaign name (default: manifest.json's, else the folder's name).",
    "force": "Requeue lost keys even when more are missing than the damaged files can have held.",
}


# The parameters of export and vocab in --help order: the filters (ExportFilters' flags, shared
# so a draft vocabulary counts the rows a drafter trains on) among the commands' own.
FILTER_FLAGS = (
    "drop_truncated",
    "min_output_tokens",
    "max_length",
    "drop_longer",
    "min_loss_tokens",
    "splits",
    "sample",
    "seed",
)
EXPORT_ORDER = (
    "ctx",
    "campaign_dir",
    "out",
    "format",
    *FILTER_FLAGS,
    "shard_rows",
    "turns",
    "shard_tokens",
    "zero_last_loss",
    "replace",
    "as_json",
)
VOCAB_ORDER = ("ctx", "campaign_dir", "draft_vocab_size", "out", "target_vocab_size", *FILTER_FLAGS, "as_json")


# Formats --out names by its extension (export infers them when --format is absent); .jsonl.gz
# before .jsonl, which it ends with too.
FILE_FORMATS_BY_SUFFIX = {".jsonl.gz": "jsonl", ".jsonl": "jsonl", ".parquet": "parquet"}
# Formats that write a folder (datasets' save_to_disk); never inferred: a folder's name says no trainer.
FOLDER_FORMATS = ("speculators", "hf")
# What each file format may be written as (specforge is JSONL, read as plain text).
SUFFIXES_OF_FORMAT = {"jsonl": (".jsonl", ".jsonl.gz"), "parquet": (".parquet",), "specforge": (".jsonl", ".jsonl.gz")}


def export_format(format: str | None, out: Path) -> str:
    """--format, else the one --out's extension names, else jsonl (an --out without extension);
    an extension no format has (`train.csv`) without --format, or a --format contradicting the
    extension, stops the command (an unknown --format is left to the exporter, which lists them)."""
    suffix = next((s for s in FILE_FORMATS_BY_SUFFIX if out.name.lower().endswith(s)), None)
    if format is None and suffix is None and out.suffix and not out.is_dir():
        from eagle_synth.tools.export import FORMATS

        fail(
            f"--out {out}: export cannot tell a format from {out.suffix!r}; name it "
            f"{', '.join(FILE_FORMATS_BY_SUFFIX)}, or pass --format (one of {', '.join(FORMATS)})"
        )
    if format is None:
        return FILE_FORMATS_BY_SUFFIX.get(suffix or "", "jsonl")
    if suffix is None:
        return format
    if format in FOLDER_FORMATS:
        fail(f"--format {format} writes a folder (datasets' save_to_disk), but --out {out} names a {suffix} file")
    allowed = SUFFIXES_OF_FORMAT.get(format)
    if allowed is not None and suffix not in allowed:
        fail(
            f"--format {format} contradicts --out {out}: a {suffix} file holds {FILE_FORMATS_BY_SUFFIX[suffix]}; "
            f"name it {' or '.join(allowed)}, or drop --format to write {FILE_FORMATS_BY_SUFFIX[suffix]}"
        )
    return format


def _require_records(campaign_dir: Path, what: str) -> None:
    """Stop when campaign_dir holds no record yet: exporting nothing would read as success."""
    if not record_files(campaign_dir):  # NotACampaignFolder when there is no records/ folder
        fail(
            f"{records_dir(campaign_dir)} holds no record files yet: nothing to {what} "
            "(workers write them as batches finish; `eagle-synth status NAME` shows the campaign's progress)"
        )


@contextmanager
def _reading(campaign_dir: Path) -> Iterator[RecordsProgress]:
    from eagle_synth.progress import RecordsProgress

    expected = None  # the progress total: the records the manifest counts done, if it reads
    with suppress(ValueError):
        expected = ((read_manifest(campaign_dir) or {}).get("counts") or {}).get("done")
    try:
        with RecordsProgress(total_records=expected) as progress:
            yield progress
    except RecordFormatError as exc:
        fail(
            f"{exc}\nRun `eagle-synth verify {campaign_dir}` to list damaged files; move them aside to export the rest."
        )


@app.command()
@settings_flags(ExportFilters, order=EXPORT_ORDER)
def export(
    ctx: typer.Context,
    campaign_dir: CampaignDirArg,
    out: Annotated[Path, typer.Option("--out", help=HELP["out"])],
    format: Annotated[str | None, typer.Option("--format", help=HELP["format"])] = None,
    shard_rows: Annotated[int | None, typer.Option("--shard-rows", help=HELP["shard_rows"])] = None,
    turns: Annotated[str, typer.Option(help=HELP["turns"])] = "all",
    shard_tokens: Annotated[int | None, typer.Option("--shard-tokens", help=HELP["shard_tokens"])] = None,
    zero_last_loss: Annotated[bool, typer.Option("--zero-last-loss", help=HELP["zero_last_loss"])] = False,
    replace: Annotated[bool, typer.Option("--replace", help=HELP["replace"])] = False,
    as_json: JsonSummaryOpt = False,
) -> None:
    """Export records as training rows: input_ids, loss_mask (0 prompt, 1 output) and provenance, for each trainer."""
    from eagle_synth.tools.export import FORMATS, export_records

    filters = settings_from(ExportFilters, ctx)  # the other flags set the ExportFilters fields of their names
    format = export_format(format, out)
    if format in FORMATS:  # an unknown --format is named by the exporter first, listing the known ones
        _require_records(campaign_dir, "export")
    with output_errors(out), _reading(campaign_dir) as progress:
        written = export_records(
            campaign_dir,
            out,
            format=format,
            filters=filters,
            progress=progress,
            turns=turns,
            shard_rows=shard_rows,
            shard_tokens=shard_tokens,
            zero_last_loss=zero_last_loss,
            replace=replace,
        )
    for warning in written.warnings:
        warn(warning)
    for command in written.commands:
        typer.echo(command, err=True)
    if as_json:
        print(json.dumps(written.to_dict()))
        return
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(written.stats.dropped.items())) or "none"
    splits = "; splits: " + ", ".join(f"{k} {v}" for k, v in written.split_rows.items()) if written.split_rows else ""
    typer.echo(
        f"exported {written.rows} rows ({written.tokens} tokens, {written.loss_tokens} with loss, "
        f"{written.tokens_per_s:,.0f} tokens/s; clipped {written.stats.clipped}; dropped: {dropped}{splits}) "
        f"to {', '.join(str(p) for p in written.paths)}"
    )
    for split, ratio in written.train_data_ratio.items():
        if ratio is not None:
            where = f" ({split}/)" if split != "all" else ""
            typer.echo(
                f"speculators{where}: train with --train-data-ratio {ratio} (not its default 0.9): its validation "
                "split is the last rows by index, and this ratio cuts between two input rows, so no row's samples "
                "and turns land on both sides"
            )
    if written.format == "specforge":
        typer.echo(
            f"SpecForge holds about {written.to_dict()['specforge_memory_bytes'] / 1e9:.2f} GB for the largest file "
            f"({written.largest_file_tokens} ids); --shard-tokens or --sample make it smaller"
        )


@app.command()
@settings_flags(
    ExportFilters, order=VOCAB_ORDER, helps={"splits": "The export's --split: only the rows of 'train' are counted."}
)
def vocab(
    ctx: typer.Context,
    campaign_dir: CampaignDirArg,
    draft_vocab_size: Annotated[int, typer.Option("--draft-vocab-size", help=HELP["draft_vocab_size"])],
    out: Annotated[Path, typer.Option("--out", help=HELP["vocab out"])],
    target_vocab_size: Annotated[int | None, typer.Option(help=HELP["target_vocab_size"])] = None,
    as_json: JsonSummaryOpt = False,
) -> None:
    """Count loss-masked tokens and write the EAGLE-3 draft vocabulary mapping (d2t, t2d).

    Pass the same filters as the export the drafter trains on; with --split only 'train' is counted.
    """
    from eagle_synth.tools.vocab import build_vocab

    filters = settings_from(ExportFilters, ctx)  # the other flags set the ExportFilters fields of their names
    _require_records(campaign_dir, "count")
    with output_errors(out), _reading(campaign_dir) as progress:
        result = build_vocab(
            campaign_dir,
            out,
            draft_vocab_size=draft_vocab_size,
            target_vocab_size=target_vocab_size,
            filters=filters,
            progress=progress,
        )
    mapping = result.mapping
    summary = {
        "rows": result.rows,
        "loss_tokens": mapping.total,
        "covered_tokens": mapping.covered,
        "coverage": round(mapping.coverage, 6),
        "draft_vocab_size": len(mapping.d2t),
        "target_vocab_size": len(mapping.t2d),
        **{name: getattr(result.stats, name) for name in ("read", "dropped", "clipped")},
        **{name: getattr(result, name) for name in ("target_vocab_size_source", "torch_files", "warnings", "commands")},
        "paths": [str(p) for p in result.paths],
        "seconds": round(result.seconds, 3),
    }
    for warning in result.warnings:
        warn(warning)
    for command in result.commands:
        typer.echo(command, err=True)
    if as_json:
        print(json.dumps(summary))
        return
    typer.echo(
        f"counted {mapping.total} loss tokens in {result.rows} rows; the {len(mapping.d2t)} most frequent "
        f"of {len(mapping.t2d)} target ids ({result.target_vocab_size_source}) cover "
        f"{100 * mapping.coverage:.2f}% of them; wrote {', '.join(p.name for p in result.paths)} to {out}"
    )


@app.command()
def verify(
    campaign_dir: CampaignDirArg,
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", help=HELP["tokenizer"])] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    strict: Annotated[bool, typer.Option(help="Exit nonzero on warnings too.")] = False,
) -> None:
    """Check records: repeated keys, ids outside the vocabulary, counts, EOS, empty outputs, reasoning structure.

    Exit 0 when there is no hard error, 1 when there is (or a warning, with --strict), 2 when it cannot run.
    """
    from rich.console import Console

    from eagle_synth.tools.verify import format_report, verify_campaign

    _require_records(campaign_dir, "verify")
    report = verify_campaign(campaign_dir, tokenizer=tokenizer)
    if as_json:
        print(json.dumps(report))
    else:
        console = Console(highlight=False)
        for line, style in format_report(report):
            console.print(line, style=style, markup=False)
    if not report["ok"] or (strict and report["warnings"]):
        raise typer.Exit(1)


@app.command()
def inspect(
    campaign_dir: CampaignDirArg,
    key: Annotated[str | None, typer.Argument(help="A record key, or a unique prefix of one.")] = None,
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", help=HELP["inspect tokenizer"])] = None,
    random_n: Annotated[int | None, typer.Option("--random", help="Show N records drawn at random instead.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for --random.")] = None,
    prompt_tail: Annotated[int | None, typer.Option(help="Show only the last N prompt tokens.")] = None,
) -> None:
    """Show a record decoded, special tokens highlighted, the prompt/output boundary marked."""
    from eagle_synth.tools.inspect import find_records, render_record
    from eagle_synth.tools.verify import check_settings, load_plain_tokenizer

    _require_records(campaign_dir, "inspect")
    manifest = read_manifest(campaign_dir)
    if tokenizer is None:
        stored = ((manifest or {}).get("settings") or {}).get("tokenizer_path")
        if not stored:
            fail("pass --tokenizer with the campaign's tokenizer folder (manifest.json does not name one)")
        tokenizer = Path(stored)
    records = find_records(campaign_dir, key=key, random_n=random_n, seed=seed)
    loaded = load_plain_tokenizer(tokenizer, manifest=manifest)
    if mismatch := check_settings(tokenizer=loaded, manifest=manifest).fingerprint_mismatch:
        warn(f"{mismatch}: the text below is decoded with another model's vocabulary and may be garbage")
    for record in records:
        render_record(record, tokenizer=loaded, prompt_tail=prompt_tail)


@app.command()
def compact(
    campaign_dir: CampaignDirArg,
    shard_mb: Annotated[int, typer.Option(help=HELP["shard_mb"])] = DEFAULT_SHARD_BYTES >> 20,
    min_age: Annotated[float, typer.Option(help=HELP["min_age"])] = DEFAULT_MIN_AGE,
    threads: Annotated[int | None, typer.Option(help=HELP["threads"])] = None,
    as_json: JsonSummaryOpt = False,
) -> None:
    """Merge small batch files into large shards; safe while workers write and if stopped midway."""
    if threads is None:
        threads = DEFAULT_THREADS

    def progress(path: Path, records: int) -> None:
        if not as_json:
            typer.echo(f"wrote {path.name}: {records} records")

    with output_errors(campaign_dir, what="the campaign folder"):
        result = run_compact(
            campaign_dir, shard_bytes=shard_mb << 20, min_age=min_age, threads=threads, on_shard=progress
        )
    if as_json:
        print(json.dumps(result.to_dict()))
        return
    saved = (
        f", {result.bytes_before / 2**20:.1f} MiB -> {result.bytes_after / 2**20:.1f} MiB"
        if result.files_compacted
        else ""
    )
    typer.echo(
        f"compacted {result.files_compacted} batch files into {len(result.shards)} shards "
        f"({result.records} records, {result.duplicates_dropped} repeated keys dropped{saved})"
    )
    if result.leftovers_deleted:
        typer.echo(f"deleted {result.leftovers_deleted} batch files an earlier stopped run had already merged")
    if result.young_skipped:
        typer.echo(f"left {result.young_skipped} batch files younger than {min_age:g} s for a later run")
    if result.unverified_shards:
        warn(
            f"deleted {len(result.unverified_shards)} shards that did not read back after writing; "
            "their batch files are kept (check the disk and memory, then run compact again): "
            f"{', '.join(result.unverified_shards[:5])}"
        )
    if result.damaged:
        warn(
            f"left {len(result.damaged)} damaged batch files in place (see `eagle-synth verify`): "
            f"{', '.join(result.damaged[:5])}"
        )


@app.command()
def repair(
    campaign_dir: CampaignDirArg,
    campaign: Annotated[str | None, typer.Option("--campaign", help=HELP["campaign"])] = None,
    dry_run: Annotated[bool, typer.Option(help="Show what would be moved and requeued; change nothing.")] = False,
    force: Annotated[bool, typer.Option(help=HELP["force"])] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan and outcome as one JSON object.")] = False,
    redis: RedisOpt = None,
) -> None:
    """Move damaged record files to DIR/damaged/ and put the prompts they held back on the queue.

    Prompts read back intact are queued again at once; the others are recorded as failures
    `record-damaged`, which a rerun of the campaign's original `enqueue` command re-enqueues.
    Rerun it until it reports nothing; see docs/reliability.md.
    """
    from eagle_synth.cli.options import check_campaign_name
    from eagle_synth.queue import make_celery
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.campaign import Campaign
    from eagle_synth.tools.repair import campaign_name_of, mark_record_damaged, move_aside, plan_repair
    from producer.retry import publish_unfinished, return_lost_records

    name = campaign or campaign_name_of(campaign_dir)
    if not records_dir(campaign_dir).is_dir():
        raise NotACampaignFolder(records_dir(campaign_dir), campaign_dir)
    check_campaign_name(name)
    target = Campaign(redis_client(redis), name)
    settings = broker_settings(redis_url=redis)
    outcome = {"republished_from_outbox": 0, "moved": [], "requeued": 0, "record_damaged": 0}
    with exclusive(records_dir(campaign_dir)):
        plan = plan_repair(campaign_dir, target, force=force)
        if plan.refusal is None and not dry_run:
            celery_app = make_celery(settings)
            # A repair stopped half way may have left prompts in the outbox: publish them first.
            outcome["republished_from_outbox"] = publish_unfinished(target, app=celery_app, queue=settings.queue)
            outcome["moved"] = [str(p) for p in move_aside(plan)]
            outcome["requeued"] = return_lost_records(target, plan.recoverable, app=celery_app, queue=settings.queue)
            outcome["record_damaged"] = mark_record_damaged(target, plan.unrecoverable)
    if as_json:
        print(json.dumps({**plan.to_dict(), "dry_run": dry_run, **outcome}))
    else:
        _print_repair(plan, outcome, dry_run=dry_run)
    if plan.refusal is not None:
        fail(plan.refusal)


def _print_repair(plan, outcome: dict, *, dry_run: bool) -> None:
    live = [d for d in plan.damaged if not d.moved_before]
    typer.echo(
        f"{plan.folder}: {plan.healthy_records} readable records in {plan.healthy_files} files; "
        f"{len(live)} damaged files; {plan.done} keys done in Redis, {len(plan.lost)} of them "
        "without a readable record here"
    )
    if not live and not plan.lost:
        typer.echo("nothing to repair")
        return
    for damaged in plan.damaged if plan.lost else live:
        where = "in damaged/ already" if damaged.moved_before else "to move to damaged/"
        typer.echo(f"  {damaged.path.name} ({where}; {damaged.salvaged} prompts read back intact): {damaged.error}")
    if plan.refusal is not None:
        return
    if dry_run:
        typer.echo(
            f"would requeue {len(plan.recoverable)} prompts read back intact and record "
            f"{len(plan.unrecoverable)} as failed `record-damaged`"
        )
        return
    if outcome["republished_from_outbox"]:
        typer.echo(f"published {outcome['republished_from_outbox']} prompts an earlier stopped run left in the outbox")
    typer.echo(
        f"moved {len(outcome['moved'])} damaged files aside; requeued {outcome['requeued']} prompts; "
        f"recorded {outcome['record_damaged']} as failed `record-damaged`"
    )
    if outcome["record_damaged"]:
        typer.echo(
            "  their prompts could not be read back: rerun the campaign's original `eagle-synth enqueue` "
            "command to enqueue them again (everything else counts as duplicate)"
        )
