"""Operations commands: the Flower dashboard, the campaign metrics exporter, the SGLang/vLLM stand-in, the local demo."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from eagle_synth.cli.options import RedisOpt, command_group, fail, redis_client

app = command_group()
# `eagle-synth exporter`'s port, next to the worker's metrics port in docker-compose.yml (9810).
EXPORTER_PORT = 9811
# The help of the flags whose declaration would not fit a line.
HELP = {
    "basic_auth": "user:password[,user2:password2]. Default: $FLOWER_BASIC_AUTH (preferred: not shown by ps).",
    "no_auth": "Start without credentials (UI open to anyone who can reach it; API refused).",
    "folder": "Working folder for the demo's Redis, logs, tokenizer and records.",
}


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def flower(
    ctx: typer.Context,
    # Flower's own default port; loopback by default: a dashboard that can revoke tasks is exposed only when asked to.
    port: Annotated[int, typer.Option(help="Port of Flower's web UI and API.")] = 5555,
    address: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 to serve other hosts.")] = "127.0.0.1",
    basic_auth: Annotated[str | None, typer.Option("--basic-auth", help=HELP["basic_auth"])] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help=HELP["no_auth"])] = False,
    redis: RedisOpt = None,
) -> None:
    """Run Flower on the campaign broker, with basic auth. Unknown options go to Flower (e.g. --url_prefix=flower)."""
    from eagle_synth.settings import broker_settings
    from eagle_synth.tools.flower import FlowerOptions, check_port_free, flower_urls, resolve_auth, run_flower

    settings = broker_settings(redis_url=redis)
    credentials = resolve_auth(basic_auth=basic_auth, no_auth=no_auth, environ=os.environ)
    check_port_free(address=address, port=port)
    # Flower would start and show an empty dashboard on a Redis it cannot reach: say it once
    # (main() turns a Redis connection error into one `error: cannot reach Redis` line).
    redis_client(redis).ping()
    options = FlowerOptions(
        credentials=tuple(credentials) if credentials is not None else None,
        port=port,
        address=address,
        extra_args=tuple(ctx.args),
    )
    users = ", ".join(c.split(":", 1)[0] for c in credentials) if credentials else "none (--no-auth)"
    broker_page, queue_api = flower_urls(address=address, port=port)
    typer.echo(f"Flower on queue {settings.queue!r}: {broker_page} (API {queue_api}); basic-auth users: {users}")
    raise typer.Exit(run_flower(settings=settings, options=options))


@app.command()
def exporter(
    port: Annotated[int, typer.Option(help="Port of /metrics.")] = EXPORTER_PORT,
    address: Annotated[str, typer.Option(help="Interface to bind; 127.0.0.1 to keep it on this host.")] = "0.0.0.0",
    redis: RedisOpt = None,
) -> None:
    """Serve every campaign's figures (enqueued, queued, in flight, stranded, done, failed, ETA...) as Prometheus metrics, read from Redis at each scrape."""
    import threading

    from eagle_synth.ports import bind_error
    from eagle_synth.tools.exporter import start_exporter

    if taken := bind_error(address, port):
        fail(f"--port {port}: cannot listen on {address}: {taken.strerror or taken}")
    client = redis_client(redis)
    client.ping()  # an unreachable Redis is said once, here (main() words it), not at every scrape
    start_exporter(client=client, port=port, address=address)
    typer.echo(f"campaign metrics on http://{address}:{port}/metrics")
    threading.Event().wait()  # the server runs in a daemon thread; Ctrl-C or SIGTERM ends the command


@app.command()
def demo(
    folder: Annotated[Path, typer.Option("--dir", help=HELP["folder"])] = Path("demo-run"),
) -> None:
    """Run a whole campaign locally on embedded defaults: Redis, devserver, worker, prompts."""
    from eagle_synth.demo.run import run_demo

    raise typer.Exit(run_demo(folder))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def devserver(ctx: typer.Context) -> None:
    """Run the SGLang stand-in (--api vllm: the vLLM one; no GPU) for tests, the demo and benchmarks. `eagle-synth devserver --help` lists its flags."""
    from eagle_synth.devserver.__main__ import main as devserver_main

    raise typer.Exit(devserver_main(list(ctx.args), prog="eagle-synth devserver") or 0)
