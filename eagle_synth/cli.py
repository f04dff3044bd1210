"""The `eagle-synth` command: a thin layer over producer/, workers/ and eagle_synth.tools."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from eagle_synth.settings import broker_settings, export_to_environment

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Regenerate prompt sets through a target model served by SGLang or vLLM, keeping exact token ids.",
)

RedisOpt = Annotated[
    Optional[str],
    typer.Option("--redis", help="Redis URL (redis://[user:pass@]host:port/db or rediss://). Default: $REDIS_URL, then redis://127.0.0.1:6379/0."),
]


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def _warn(message: str) -> None:
    typer.secho(f"warning: {message}", err=True, fg=typer.colors.YELLOW)


def _check_campaign_name(name: str) -> None:
    from eagle_synth.campaign import Campaign

    try:
        Campaign(None, name)  # the name check only: no Redis call is made
    except ValueError as exc:
        _fail(f"--campaign: {exc}")


def _stop_token_ids(raw: str | None) -> tuple[int, ...]:
    parts = [part.strip() for part in (raw or "").split(",") if part.strip()]
    bad = [part for part in parts if not part.isdigit()]
    if bad:
        _fail(f"--stop-token-ids: {bad[0]!r} is not a token id; give comma-separated non-negative integers, e.g. 151645,151643")
    return tuple(int(part) for part in parts)


def _client(redis_url: str | None):
    from eagle_synth.redis_client import connect

    return connect(broker_settings(redis_url=redis_url))


@app.command()
def enqueue(
    files: Annotated[list[str], typer.Argument(help="JSONL / JSON / Parquet files, saved HF dataset folders, globs, or - for JSONL on stdin.")],
    campaign: Annotated[str, typer.Option("--campaign", help="Campaign name; records go to OUT/NAME/.")],
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="Tokenizer folder with the model's chat template.")],
    max_new_tokens: Annotated[int, typer.Option(help="Cap on generated tokens per prompt.")] = 2048,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).")] = 0.6,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 0.95,
    top_k: Annotated[int, typer.Option(help="Top-k sampling (-1 = off).")] = -1,
    min_p: Annotated[float, typer.Option(help="Min-p sampling.")] = 0.0,
    repetition_penalty: Annotated[float, typer.Option(help="Repetition penalty (1 = off).")] = 1.0,
    stop_token_ids: Annotated[Optional[str], typer.Option(help="Extra stop ids, comma-separated (EOS always stops).")] = None,
    n: Annotated[int, typer.Option("--n", help="Samples per prompt; each is its own record.")] = 1,
    seed: Annotated[Optional[int], typer.Option(help="Base seed: each sample gets a stable sampling_seed.")] = None,
    batch_size: Annotated[int, typer.Option(help="Prompts per task.")] = 16,
    turns: Annotated[str, typer.Option(help="'last': regenerate the answer to the last user turn; 'all': one prompt per user turn (with --history dataset).")] = "last",
    history: Annotated[str, typer.Option(help="'dataset': prompts on the row's own history; 'own': answer every user turn in order, each on the model's own earlier answers.")] = "dataset",
    max_turns: Annotated[Optional[int], typer.Option(help="With --history own: answer at most this many user turns per conversation.")] = None,
    variants: Annotated[Optional[Path], typer.Option(help="JSON list of {name, weight, sampling, chat_template_kwargs} variants, one per conversation by a stable hash.")] = None,
    system: Annotated[Optional[str], typer.Option(help="Default system prompt for rows without one.")] = None,
    chat_template: Annotated[Optional[Path], typer.Option(help="Jinja chat template file overriding the tokenizer's.")] = None,
    chat_template_kwargs: Annotated[Optional[str], typer.Option(help='Extra template arguments as JSON, e.g. \'{"enable_thinking": false}\'.')] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow tokenizers that ship their own code.")] = False,
    max_prompt_tokens: Annotated[Optional[int], typer.Option(help="Skip prompts longer than this many tokens (0 = no cap). Default: the campaign's, else 131072.")] = None,
    max_prompt_chars: Annotated[int, typer.Option(help="Skip conversations with more characters than this, before templating (0 = no cap).")] = 1_000_000,
    allow_evicting_redis: Annotated[bool, typer.Option(help="Accept a Redis whose maxmemory-policy may evict keys (it can lose or double work).")] = False,
    max_backlog: Annotated[int, typer.Option(help="Wait while more prompts than this are pending (0 = never wait).")] = 200_000,
    strict: Annotated[bool, typer.Option(help="Stop with a nonzero exit at the first skipped row.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Template and count, print a length histogram, enqueue nothing.")] = False,
    processes: Annotated[Optional[int], typer.Option(help="Templating processes (default: all cores).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object.")] = False,
    redis: RedisOpt = None,
) -> None:
    """Template prompt rows with the model's chat template and enqueue their token ids."""
    from eagle_synth.campaign import CampaignMismatch
    from eagle_synth.sampling import SamplingError, SamplingParams
    from eagle_synth.templating import TemplateError
    from producer.enqueue import EnqueueOptions, StrictModeError, enqueue as run_enqueue, print_summary
    from producer.progress import EnqueueProgress
    from producer.sources import InputError, estimate_rows

    _check_campaign_name(campaign)
    if turns not in ("last", "all"):
        _fail("--turns must be 'last' or 'all'")
    if (max_prompt_tokens is not None and max_prompt_tokens < 0) or max_prompt_chars < 0:
        _fail("--max-prompt-tokens and --max-prompt-chars must be 0 (no cap) or positive")
    if history not in ("dataset", "own"):
        _fail("--history must be 'dataset' or 'own'")
    if max_turns is not None and (max_turns < 1 or history != "own"):
        _fail("--max-turns takes a number >= 1 and applies with --history own")
    if history == "own" and trust_remote_code:
        _fail("--history own cannot be used with --trust-remote-code: workers would run tokenizer code taken from Redis")
    try:
        kwargs = json.loads(chat_template_kwargs) if chat_template_kwargs else {}
        if not isinstance(kwargs, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        _fail(f"--chat-template-kwargs must be a JSON object: {exc}")
    stops = _stop_token_ids(stop_token_ids)
    try:
        sampling = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            min_p=min_p, repetition_penalty=repetition_penalty, stop_token_ids=stops, n=n, seed=seed,
        )
    except (SamplingError, ValueError) as exc:
        _fail(str(exc))
    if batch_size < 1:
        _fail("--batch-size must be at least 1")
    loaded_variants: tuple = ()
    if variants is not None:
        from eagle_synth.variants import VariantsError, load_variants

        try:
            loaded_variants = tuple(load_variants(variants, base=sampling))
        except VariantsError as exc:
            _fail(str(exc))
    options = EnqueueOptions(
        inputs=files, campaign=campaign, tokenizer=tokenizer, sampling=sampling, batch_size=batch_size,
        turns=turns, system=system, chat_template=str(chat_template) if chat_template else None,
        chat_template_kwargs=kwargs, trust_remote_code=trust_remote_code,
        max_prompt_tokens=max_prompt_tokens, max_prompt_chars=max_prompt_chars or None,
        max_backlog=max_backlog, strict=strict, dry_run=dry_run, processes=processes,
        allow_evicting_redis=allow_evicting_redis, history=history, max_turns=max_turns, variants=loaded_variants,
    )
    broker = None if dry_run else broker_settings(redis_url=redis)
    total_rows = None
    if not as_json and EnqueueProgress.wanted() and "-" not in files:
        try:
            total_rows = estimate_rows(files)
        except InputError as exc:
            _fail(str(exc))
    progress = EnqueueProgress(enabled=not as_json, total_rows=total_rows)
    try:
        with progress:
            summary = run_enqueue(options, broker=broker, stdin=sys.stdin.buffer,
                                  on_rows=progress.update, on_wait=progress.waiting, on_warning=_warn)
    except (CampaignMismatch, InputError, TemplateError, StrictModeError) as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(summary.to_dict()))
    else:
        print_summary(summary)
    if not summary.accounted:
        _fail("internal error: rows read != enqueued + duplicate + skipped", code=3)


def _worker_option(name: str, *flags: str):
    """A typer option for one WorkerConfig setting: its help comes from workers/config.py."""
    from workers.config import option_help

    return typer.Option(*flags, help=option_help(name))


@app.command()
def worker(
    server: Annotated[list[str], _worker_option("servers", "--server")],
    out: Annotated[Path, _worker_option("out", "--out")],
    backend: Annotated[Optional[list[str]], _worker_option("backend", "--backend")] = None,
    inflight: Annotated[Optional[int], _worker_option("inflight")] = None,
    concurrency: Annotated[Optional[int], typer.Option(help="Batches held open at once (batch threads). Default: 8 x inflight x servers / 16.")] = None,
    allow_server_parsers: Annotated[bool, _worker_option("allow_server_parsers", "--allow-server-parsers")] = False,
    allow_server_setting: Annotated[Optional[list[str]], _worker_option("allow_server_settings", "--allow-server-setting")] = None,
    max_attempts: Annotated[Optional[int], _worker_option("max_attempts")] = None,
    timeout_base: Annotated[Optional[float], _worker_option("timeout_base")] = None,
    timeout_per_token: Annotated[Optional[float], _worker_option("timeout_per_token")] = None,
    backoff_max: Annotated[Optional[float], _worker_option("backoff_max")] = None,
    probe_timeout: Annotated[Optional[float], _worker_option("probe_timeout")] = None,
    render_processes: Annotated[Optional[int], _worker_option("render_processes")] = None,
    name: Annotated[Optional[str], typer.Option(help="Celery node name (default eagle-synth-<random>@<host>).")] = None,
    task_events: Annotated[bool, typer.Option(help="Send Celery task events (Flower's task views need them; they cost about 0.25 ms of CPU per record).")] = True,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    allow_evicting_redis: Annotated[bool, typer.Option(help="Accept a Redis whose maxmemory-policy may evict keys (it can lose or double work).")] = False,
    redis: RedisOpt = None,
) -> None:
    """Run a Celery worker that generates queued batches on SGLang or vLLM servers and writes records."""
    from eagle_synth.redis_policy import check_redis_ready

    settings = broker_settings(redis_url=redis)
    # Celery would retry a wrong password or an unreachable Redis forever: check once, say why.
    warning = check_redis_ready(_client(redis), allow_evicting=allow_evicting_redis)
    if warning:
        _warn(warning)
    export_to_environment(settings)
    import dataclasses
    import os

    from workers.backends import REFUSABLE_SETTINGS, preflight_server
    from workers.client import SGLangClient, ServerDown, TransientError
    from workers.config import ConfigError, WorkerConfig, auto_inflight, default_concurrency, env_name
    from workers.disk import probe_folder
    from workers.preflight import PreflightError

    problem = probe_folder(out)
    if problem:
        _fail(f"--out cannot take records: {problem}")
    # Flags given override the environment (EAGLE_SYNTH_*), which overrides the defaults.
    given = {"allow_server_parsers": allow_server_parsers or None, "max_attempts": max_attempts, "timeout_base": timeout_base,
             "timeout_per_token": timeout_per_token, "backoff_max": backoff_max, "probe_timeout": probe_timeout,
             "inflight": inflight, "allow_server_settings": tuple(allow_server_setting) if allow_server_setting else None,
             "backend": tuple(backend) if backend else None, "render_processes": render_processes}
    os.environ[env_name("servers")] = ",".join(s.rstrip("/") for s in server)
    os.environ[env_name("out")] = str(out)
    try:
        config = dataclasses.replace(WorkerConfig.from_env(), **{k: v for k, v in given.items() if v is not None})
    except ConfigError as exc:
        _fail(str(exc).replace("_", "-"))
    servers = config.servers
    unknown = sorted(set(config.allow_server_settings) - set(REFUSABLE_SETTINGS))
    if unknown:
        _fail(f"--allow-server-setting {', '.join(unknown)}: not a setting preflight refuses "
              f"(known: {', '.join(REFUSABLE_SETTINGS)})")
    allow_server_parsers = config.allow_server_parsers
    # Preflight the servers that already answer; the others are checked when they come up.
    refused = []
    capacities = []
    for url in servers:
        try:
            checked = preflight_server(SGLangClient(url), forced=config.backend_for(url),
                                       allow_server_parsers=allow_server_parsers,
                                       allowed_settings=config.allow_server_settings)
            typer.echo(f"server {url}: {checked.kind} {checked.facts.version or ''} (kind from {checked.how})")
            capacities.append(checked.facts.max_running_requests)
        except PreflightError as exc:
            refused.append(str(exc))
        except (ServerDown, TransientError) as exc:
            typer.echo(f"server {url} not answering yet ({exc}); the worker will wait for it")
    if refused and len(refused) == len(servers):
        _fail("\n".join(refused))
    for message in refused:
        typer.secho(message, err=True, fg=typer.colors.YELLOW)
    # Batch threads are sized once, at start: from --inflight, else from the largest capacity
    # a server reports now (a server still loading gets the default until it answers).
    sizing = config.inflight or max([auto_inflight(c if isinstance(c, int) else None) for c in capacities] or
                             [auto_inflight(None)])
    from workers.app import run_worker

    run_worker(
        config=config,
        concurrency=concurrency or default_concurrency(inflight=sizing, servers=len(servers)),
        loglevel=loglevel, name=name, task_events=task_events,
    )


@app.command()
def status(
    campaign: Annotated[str, typer.Argument(help="Campaign name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh a live view until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes with --watch.")] = 2.0,
    redis: RedisOpt = None,
) -> None:
    """Where a campaign stands: enqueued, queued, in flight, stranded, done, failed, throughput, workers."""
    from eagle_synth.tools.status import campaign_status
    from eagle_synth.tools.status_view import render_status, watch_status

    client = _client(redis)
    try:
        data = campaign_status(client, campaign)
    except KeyError as exc:
        _fail(str(exc.args[0]))
    if watch:
        watch_status(client, campaign, interval=interval, as_json=as_json)
    elif as_json:
        print(json.dumps(data))
    else:
        render_status(data)


@app.command()
def campaigns(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    redis: RedisOpt = None,
) -> None:
    """List campaigns with their progress."""
    from eagle_synth.tools.status import campaigns_overview

    rows = campaigns_overview(_client(redis))
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        typer.echo("no campaigns")
    for r in rows:
        typer.echo(f"{r['campaign']:<30} {100 * r['finished_share']:5.1f}%  done {r['done']}  failed {r['failed']}  "
                   f"queued {r['queued']}  in flight {r['inflight']}" + (f"  stranded {r['stranded']}" if r['stranded'] else ""))


@app.command()
def failed(
    campaign: Annotated[str, typer.Argument(help="Campaign name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    limit: Annotated[int, typer.Option(help="Examples shown per reason.")] = 5,
    redis: RedisOpt = None,
) -> None:
    """List a campaign's failed prompts by reason."""
    from eagle_synth.campaign import Campaign

    from eagle_synth.conversation_store import ConversationStore

    state = Campaign(_client(redis), campaign)
    failures = state.failures()
    settings = state.settings()
    stopped = ConversationStore(state).stopped(examples=limit) if settings and settings.history == "own" else {}
    by_reason: dict[str, list] = {}
    for key, failure in sorted(failures.items()):
        by_reason.setdefault(failure.reason, []).append({
            "key": key, "id": failure.item.get("row_id"), "source": failure.item.get("source"),
            "message": failure.message, "at": failure.at, "worker": failure.worker,
        })
    if as_json:
        print(json.dumps({"campaign": campaign, "failed": len(failures),
                          "by_reason": {r: {"count": len(v), "prompts": v} for r, v in by_reason.items()},
                          "conversations_stopped": stopped}))
        return
    typer.echo(f"{len(failures)} failed prompts in {campaign}")
    for reason, entries in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        typer.echo(f"  {reason}: {len(entries)}")
        for entry in entries[:limit]:
            typer.echo(f"    {entry['key']} ({entry['source']}): {entry['message'][:200]}")
    if stopped:
        typer.echo(f"{sum(s['count'] for s in stopped.values())} conversations stopped early (their records are kept; "
                   "failed turns above stop theirs too)")
        for reason, info in sorted(stopped.items(), key=lambda kv: -kv[1]["count"]):
            typer.echo(f"  {reason}: {info['count']}")
            for end in info["examples"]:
                detail = f": {end['message'][:200]}" if end.get("message") else ""
                typer.echo(f"    {end['conversation']} ({end['source']}) after {end['turns']} turns{detail}")


@app.command("retry-failed")
def retry_failed(
    campaign: Annotated[str, typer.Argument(help="Campaign name.")],
    reason: Annotated[Optional[str], typer.Option(help="Only failures with this reason.")] = None,
    redis: RedisOpt = None,
) -> None:
    """Enqueue a campaign's failed prompts again."""
    from eagle_synth.campaign import Campaign
    from eagle_synth.queue import make_celery
    from eagle_synth.tools.repair import RECORD_DAMAGED
    from producer.retry import retry_failed as run_retry

    settings = broker_settings(redis_url=redis)
    client = _client(redis)
    target = Campaign(client, campaign)
    count = run_retry(target, app=make_celery(settings), queue=settings.queue, reason=reason)
    typer.echo(f"re-enqueued {count} failed prompts of {campaign}" + (f" (reason {reason})" if reason else ""))
    damaged = target.failure_counts().get(RECORD_DAMAGED, 0) if reason in (None, RECORD_DAMAGED) else 0
    if damaged:
        typer.echo(f"{damaged} prompts failed `{RECORD_DAMAGED}` have no prompt ids to replay: rerun the campaign's "
                   "original `eagle-synth enqueue` command to enqueue them again")


@app.command()
def demo(
    folder: Annotated[Path, typer.Option("--dir", help="Working folder for the demo's Redis, logs, tokenizer and records.")] = Path("demo-run"),
) -> None:
    """Run a whole campaign locally on embedded defaults: Redis, devserver, worker, prompts."""
    from eagle_synth.demo.run import run_demo

    raise typer.Exit(run_demo(folder))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def devserver(ctx: typer.Context) -> None:
    """Run the SGLang stand-in (--api vllm: the vLLM one; no GPU) for tests, the demo and benchmarks. `eagle-synth devserver --help` lists its flags."""
    from eagle_synth.devserver.__main__ import main as devserver_main

    raise typer.Exit(devserver_main(list(ctx.args)) or 0)


# Command groups that live in their own modules register themselves on `app`.
from eagle_synth import cli_ops, cli_records  # noqa: E402,F401


def main() -> None:
    import redis
    from kombu.exceptions import OperationalError

    from eagle_synth.redis_policy import EvictingRedisError, is_out_of_memory, out_of_memory_message
    from eagle_synth.settings import SettingsError

    def stop(message: str) -> None:
        typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
        raise SystemExit(2) from None

    try:
        app()
    except (redis.RedisError, OperationalError) as exc:
        # Redis full (noeviction) refuses writes: OutOfMemoryError, or wrapped by kombu on publish.
        if is_out_of_memory(exc):
            stop(out_of_memory_message())
        if isinstance(exc, redis.AuthenticationError):
            stop(f"Redis refused the credentials: {exc}. Check the user and password in "
                 "--redis / REDIS_URL (redis://user:password@host:port/db).")
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OperationalError)):
            stop(f"cannot reach Redis: {exc}. Check --redis / REDIS_URL; for TLS use rediss:// "
                 "and EAGLE_SYNTH_REDIS_CA. Rerunning a command is safe: enqueue resumes where it stopped.")
        raise
    except (SettingsError, EvictingRedisError) as exc:
        stop(str(exc))


if __name__ == "__main__":
    # Run through the imported module so commands registered by cli_ops / cli_records are there.
    from eagle_synth.cli import main as _main

    _main()
