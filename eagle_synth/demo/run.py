"""`eagle-synth demo`: a whole `--history own` campaign on this machine (private Redis,
devserver, one Celery worker, bundled prompts, a tokenizer trained on the spot), then its
status and a later turn decoded; everything stays under one folder for a look."""

from __future__ import annotations

import shutil
import sys
import time
from importlib import resources
from pathlib import Path

from eagle_synth.testing.harness import Stack, wait_for

# Devserver pace: slow enough to watch the worker's progress, fast enough to finish in seconds.
DEMO_TOKEN_LATENCY = "0.002"
DEMO_MEAN_OUTPUT_TOKENS = "120"
DEMO_CAMPAIGN = "demo"
# Seconds the demo waits for its campaign before it gives up and shows the logs.
DEMO_TIMEOUT = 300
# Seconds its processes get to exit after SIGTERM (a worker's soft shutdown) before SIGKILL.
DEMO_STOP_TIMEOUT = 20


def run_demo(folder: Path) -> int:
    from rich.console import Console

    from eagle_synth.demo.tokenizer import build_demo_tokenizer
    from eagle_synth.records import iter_records
    from eagle_synth.sampling import SamplingParams
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.campaign import Campaign
    from eagle_synth.state.conversation_store import ConversationStore
    from eagle_synth.state.redis_client import connect
    from eagle_synth.templating import load_tokenizer
    from eagle_synth.tools.inspect import render_record
    from eagle_synth.tools.status import campaign_status
    from eagle_synth.tools.status_view import render_status
    from producer.enqueue import EnqueueOptions, enqueue, print_summary

    console = Console()
    prompts = Path(str(resources.files("eagle_synth.demo") / "prompts.jsonl"))
    folder = Path(folder).resolve()
    console.rule("eagle-synth demo")
    console.print(f"working folder: {folder}")
    tokenizer = build_demo_tokenizer(folder / "tokenizer")
    console.print(f"1. tokenizer with a reasoning chat template: {tokenizer}")

    with Stack(folder, tokenizer=tokenizer, stop_timeout=DEMO_STOP_TIMEOUT) as stack:
        redis_server = stack.redis()
        console.print(f"2. private redis-server: {redis_server.url}")
        _, url = stack.devserver("--token-latency", DEMO_TOKEN_LATENCY, "--mean-output-tokens", DEMO_MEAN_OUTPUT_TOKENS)
        console.print(f"3. devserver (SGLang's /generate contract, no GPU): {url}")

        broker = broker_settings(redis_url=redis_server.url)
        options = EnqueueOptions(
            inputs=[str(prompts)],
            campaign=DEMO_CAMPAIGN,
            tokenizer=str(tokenizer),
            sampling=SamplingParams(max_new_tokens=256, temperature=0.7, top_p=0.95),
            batch_size=8,
            history="own",
        )
        console.print(f"4. eagle-synth enqueue {prompts.name} --campaign {DEMO_CAMPAIGN} --history own ...")
        summary = enqueue(options, broker=broker)
        print_summary(summary)

        out = folder / "out"
        worker = stack.worker(servers=[url], out=out, redis_url=redis_server.url, args=["--render-processes", "1"])
        console.print(f"5. eagle-synth worker --server {url} --out {out} (a real Celery worker)")
        campaign = Campaign(connect(broker), DEMO_CAMPAIGN)
        conversations = ConversationStore(campaign)
        started = time.monotonic()
        with console.status("generating...") as spinner:

            def finished() -> bool:
                progress = campaign.progress()
                counts = conversations.counts()
                spinner.update(
                    f"generating... {progress.done} records; conversations {counts['total']}: "
                    f"{counts['in_progress']} in progress"
                )
                return (
                    not counts["in_progress"] and not counts["followups_waiting"] and not progress.pending
                ) or not worker.alive()

            try:
                wait_for(finished, timeout=DEMO_TIMEOUT, interval=0.25, what="the demo campaign")
            except TimeoutError:
                console.print(f"[red]the campaign did not finish; worker log:[/red]\n{worker.log()[-3000:]}")
                return 1
        console.print(f"   finished in {time.monotonic() - started:.1f} s")

        console.rule("eagle-synth status demo")
        render_status(campaign_status(campaign.client, DEMO_CAMPAIGN), console=console)

        record = max(iter_records(out / DEMO_CAMPAIGN), key=lambda r: (r.turn, r.key))
        console.rule(
            f"turn {record.turn} of conversation {(record.conversation or '')[:12]}..., decoded (eagle-synth inspect)"
        )
        holds = "its prompt holds the model's own earlier answers"
        if record.tool_calls is not None:
            holds += ", its own tool calls among them, each answered by the dataset's tool result"
        console.print(f"{holds}; the output is this turn's answer")
        render_record(record, tokenizer=load_tokenizer(tokenizer), console=console)
        console.rule()
        command, activate = runnable_command()
        records_at = shown_path(out / DEMO_CAMPAIGN)

        # Printed as the user's shell can run them (eagle-synth is on PATH only in an activated
        # venv), each on one line however narrow the terminal, so a copy runs as it is.
        def hint(line: str) -> None:
            console.print(line, highlight=False, soft_wrap=True)

        hint(f"records: {records_at}")
        hint("next, in this shell:")
        hint(f"  {command} export {records_at} --out {shown_path(folder / 'train.jsonl')}")
        hint(f"  {command} inspect {records_at} --random 1")
        if activate:
            hint(f"  (or `{activate}` first: it puts eagle-synth on PATH in this shell)")
        return 0


def shown_path(path: Path) -> str:
    """A path as the user's shell takes it: relative to the current folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def runnable_command() -> tuple[str, str | None]:
    """(how this shell runs eagle-synth, the line putting it on PATH or None): `make demo` runs
    .venv/bin/eagle-synth unactivated, where a bare `eagle-synth` is "command not found"."""
    script = Path(sys.executable).parent / "eagle-synth"
    found = shutil.which("eagle-synth")
    if found and script.exists() and Path(found).resolve() == script.resolve():
        return "eagle-synth", None
    if not script.exists():
        return f"{shown_path(Path(sys.executable))} -m eagle_synth", None
    activate = Path(sys.prefix) / "bin" / "activate"
    in_venv = sys.prefix != sys.base_prefix and activate.exists()
    return shown_path(script), (f". {shown_path(activate)}" if in_venv else None)
