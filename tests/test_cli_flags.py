"""The bridge from flags to settings (eagle_synth/cli/flags.py): a flag's value reaches the field
that declares it, parsed as the field wants it; an environment-backed model takes only the flags
given, so a variable is never overridden by a flag left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from eagle_synth.cli.flags import field_flags, settings_flags, settings_from
from eagle_synth.devserver.config import DevServerConfig
from eagle_synth.sampling import SamplingParams
from eagle_synth.tools.filters import ExportFilters
from producer.options import EnqueueOptions
from workers.config import WorkerConfig


def _run(model: type, args: list[str], **given: Any) -> Any:
    """The settings object a command taking `model`'s flags builds from `args`."""
    built: list[Any] = []
    app = typer.Typer()

    @app.command()
    @settings_flags(model)
    def probe(ctx: typer.Context) -> None:
        built.append(settings_from(model, ctx, **given))

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return built[0]


def test_enqueue_flags_reach_their_fields_parsed():
    options = _run(
        EnqueueOptions,
        [
            "--campaign",
            "c1",
            "--tokenizer",
            "tok",
            "--max-new-tokens",
            "7",
            "--stop-token-ids",
            "151645, 2",
            "--max-prompt-chars",
            "0",
            "--chat-template",
            "t.jinja",
            "--chat-template-kwargs",
            '{"enable_thinking": false}',
            "--n",
            "3",
        ],
        inputs=["-"],
    )
    assert options.campaign == "c1" and options.inputs == ["-"]
    assert options.sampling == SamplingParams(max_new_tokens=7, stop_token_ids=(151645, 2), n=3)
    assert options.max_prompt_chars is None  # 0: no cap
    assert options.chat_template == "t.jinja"
    assert options.chat_template_kwargs == {"enable_thinking": False}
    assert options.variants == ()


def test_worker_flags_win_and_flags_left_out_leave_the_environment(monkeypatch):
    monkeypatch.setenv("EAGLE_SYNTH_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("EAGLE_SYNTH_ALLOW_SERVER_PARSERS", "1")
    monkeypatch.setenv("EAGLE_SYNTH_PROBE_TIMEOUT", "7")
    config = _run(WorkerConfig, ["--server", "http://a:1/", "--out", "o", "--max-attempts", "4"])
    assert config.servers == ("http://a:1",) and config.out == Path("o")
    assert config.max_attempts == 4  # the flag given wins
    assert config.probe_timeout == 7.0 and config.allow_server_parsers is True  # left out: the environment's
    assert config.render_processes == 2  # neither: the default


def test_export_filters_and_devserver_flags_reach_their_fields():
    filters = _run(ExportFilters, ["--drop-truncated", "--split", "test=0.25", "--max-length", "9"])
    assert filters == ExportFilters(drop_truncated=True, splits=(("test", 0.25),), max_length=9)
    config = _run(DevServerConfig, ["--tokenizer", "tok", "--max-running", "5", "--charge-prefill"])
    assert (config.slots, config.charge_prefill, config.port) == (5, True, 30000)


@pytest.mark.parametrize("model", [EnqueueOptions, WorkerConfig, DevServerConfig, ExportFilters])
def test_each_flag_is_declared_once(model):
    names = [f.option_name for f in field_flags(model)]
    assert len(names) == len(set(names)), names
    assert all(f.flag.help for f in field_flags(model))
