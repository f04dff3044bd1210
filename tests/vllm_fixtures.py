"""Fixtures of the real vLLM server (tests/vllm_server.py), imported by conftest.

One server per test session (`real_vllm`), started by the first test that asks for it and
shared by the rest: a start costs 20 s to 3 minutes of 2 cores. Every test that uses it is
marked `real_vllm` (pytest.mark.xdist_group): `make test` runs with `--dist loadgroup`, so they
all run in one xdist process and only one server starts. Tests that kill a server start
their own (`own_vllm`).
"""

from __future__ import annotations

import time

import pytest

from tests.vllm_server import VllmServer, build_model

# The xdist group of every test on the shared server (one process, one server).
GROUP = "real-vllm"
# Seconds a real-server test may take, start-up of the shared server included.
TIMEOUT = 900
# Marks for a module of real-server tests.
MARKS = [pytest.mark.xdist_group(GROUP), pytest.mark.timeout(TIMEOUT)]


@pytest.fixture(scope="session")
def vllm_model(tokenizer_path):
    """The tiny Qwen3 checkpoint around the test tokenizer (built once, cached beside the venv)."""
    return build_model(tokenizer_path)


@pytest.fixture(scope="session")
def real_vllm(vllm_model, tmp_path_factory):
    """The session's vLLM server, ready (GET /health 200)."""
    started = time.monotonic()
    server = VllmServer(model=vllm_model, logdir=tmp_path_factory.mktemp("real-vllm")).start()
    print(f"\nvLLM ready in {time.monotonic() - started:.0f} s at {server.url}")
    yield server
    server.stop()


@pytest.fixture
def own_vllm(vllm_model, tmp_path):
    """Starts servers of this test's own (which it may kill); all stopped afterwards."""
    servers: list[VllmServer] = []

    def start(*, port: int = 0, wait: bool = True, extra: tuple[str, ...] = ()) -> VllmServer:
        server = VllmServer(model=vllm_model, logdir=tmp_path / "vllm", port=port, extra=list(extra))
        servers.append(server.start(wait=wait))
        return server

    yield start
    for server in servers:
        server.kill()
