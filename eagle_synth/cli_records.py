"""CLI commands over record folders: export, verify, inspect, compact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from eagle_synth.cli import _fail, app

CampaignDirArg = Annotated[Path, typer.Argument(help="Campaign folder: OUT/<campaign>.")]


@app.command()
def export(
    campaign_dir: CampaignDirArg,
    out: Annotated[Path, typer.Option("--out", help="Output file (.jsonl, .jsonl.gz or .parquet); with --shard-rows a name to number or a folder.")],
    format: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
    drop_truncated: Annotated[bool, typer.Option(help="Skip records that hit max_new_tokens.")] = False,
    min_output_tokens: Annotated[int, typer.Option(help="Skip records with fewer output ids.")] = 0,
    max_length: Annotated[Optional[int], typer.Option(help="Skip records longer than this (prompt + output).")] = None,
    shard_rows: Annotated[Optional[int], typer.Option(help="Rows per output file: out-00000.parquet, ... (default: one file).")] = None,
    turns: Annotated[str, typer.Option(help="--history own campaigns: 'all' turns of each conversation, or only its 'last' one.")] = "all",
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object.")] = False,
) -> None:
    """Export records as training rows: input_ids, loss_mask (0 prompt, 1 output) and provenance."""
    from eagle_synth.records import RecordFormatError
    from eagle_synth.tools.export import ExportFilters, export_records

    filters = ExportFilters(drop_truncated=drop_truncated, min_output_tokens=min_output_tokens, max_length=max_length)
    try:
        written = export_records(campaign_dir, out, format=format, filters=filters, shard_rows=shard_rows,
                                 turns=turns)
    except RecordFormatError as exc:
        _fail(f"{exc}\nRun `eagle-synth verify {campaign_dir}` to list damaged files; move them aside to export the rest.")
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    summary = {"rows": written.rows, "tokens": written.tokens, "dropped": written.dropped,
               "paths": [str(p) for p in written.paths], "seconds": round(written.seconds, 3),
               "tokens_per_s": round(written.tokens_per_s)}
    if as_json:
        print(json.dumps(summary))
        return
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(written.dropped.items())) or "none"
    typer.echo(f"exported {written.rows} rows ({written.tokens} tokens, {written.tokens_per_s:,.0f} tokens/s; "
               f"dropped: {dropped}) to {', '.join(str(p) for p in written.paths)}")


@app.command()
def verify(
    campaign_dir: CampaignDirArg,
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", help="The campaign's tokenizer folder (default: the settings in manifest.json).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    strict: Annotated[bool, typer.Option(help="Exit nonzero on warnings too.")] = False,
) -> None:
    """Check records: repeated keys, ids outside the vocabulary, counts, EOS, empty outputs, reasoning structure.

    Exit 0 when there is no hard error, 1 when there is (or a warning, with --strict), 2 when it cannot run.
    """
    from rich.console import Console

    from eagle_synth.tools.verify import VerifyError, format_report, verify_campaign

    try:
        report = verify_campaign(campaign_dir, tokenizer=tokenizer)
    except (VerifyError, FileNotFoundError) as exc:
        _fail(str(exc))
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
    key: Annotated[Optional[str], typer.Argument(help="A record key, or a unique prefix of one.")] = None,
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", help="The campaign's tokenizer folder (default: tokenizer_path in manifest.json).")] = None,
    random_n: Annotated[Optional[int], typer.Option("--random", help="Show N records drawn at random instead.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed for --random.")] = None,
    prompt_tail: Annotated[Optional[int], typer.Option(help="Show only the last N prompt tokens.")] = None,
) -> None:
    """Show a record decoded, special tokens highlighted, the prompt/output boundary marked."""
    from rich.console import Console

    from eagle_synth.records import read_manifest
    from eagle_synth.tools.inspect import InspectError, find_records, render_record
    from eagle_synth.tools.verify import VerifyError, load_plain_tokenizer

    if tokenizer is None:
        stored = ((read_manifest(campaign_dir) or {}).get("settings") or {}).get("tokenizer_path")
        if not stored:
            _fail("pass --tokenizer with the campaign's tokenizer folder (manifest.json does not name one)")
        tokenizer = Path(stored)
    try:
        records = find_records(campaign_dir, key=key, random_n=random_n, seed=seed)
        loaded = load_plain_tokenizer(tokenizer)
    except (InspectError, VerifyError, FileNotFoundError) as exc:
        _fail(str(exc))
    console = Console()
    for record in records:
        render_record(record, tokenizer=loaded, console=console, prompt_tail=prompt_tail)


@app.command()
def compact(
    campaign_dir: CampaignDirArg,
    shard_mb: Annotated[int, typer.Option(help="MiB of batch files merged into each shard.")] = 256,
    min_age: Annotated[float, typer.Option(help="Only merge batch files at least this many seconds old.")] = 300.0,
    threads: Annotated[int, typer.Option(help="zstd compression threads (0 = one).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object.")] = False,
) -> None:
    """Merge small batch files into large shards; safe while workers write and if stopped midway."""
    from eagle_synth.tools.compact import CompactBusy
    from eagle_synth.tools.compact import compact as run_compact

    def progress(path: Path, records: int) -> None:
        if not as_json:
            typer.echo(f"wrote {path.name}: {records} records")

    try:
        result = run_compact(campaign_dir, shard_bytes=shard_mb << 20, min_age=min_age, threads=threads,
                             on_shard=progress)
    except (CompactBusy, FileNotFoundError) as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(result.to_dict()))
        return
    saved = (f", {result.bytes_before / 2**20:.1f} MiB -> {result.bytes_after / 2**20:.1f} MiB"
             if result.files_compacted else "")
    typer.echo(f"compacted {result.files_compacted} batch files into {len(result.shards)} shards "
               f"({result.records} records, {result.duplicates_dropped} repeated keys dropped{saved})")
    if result.leftovers_deleted:
        typer.echo(f"deleted {result.leftovers_deleted} batch files an earlier stopped run had already merged")
    if result.young_skipped:
        typer.echo(f"left {result.young_skipped} batch files younger than {min_age:g} s for a later run")
    if result.damaged:
        typer.secho(f"left {len(result.damaged)} damaged batch files in place (see `eagle-synth verify`): "
                    f"{', '.join(result.damaged[:5])}", err=True, fg=typer.colors.YELLOW)
