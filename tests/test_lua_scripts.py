"""The state modules' Lua runs by EVALSHA (eagle_synth/state/lua): the text crosses the network
once per server, a server that lost its scripts (restart, SCRIPT FLUSH, a promoted replica) gets
them again without an error, in a transaction pipeline too; and no product module sends Lua text
with EVAL."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from eagle_synth.errors import LeaseLost
from eagle_synth.settings import broker_settings
from eagle_synth.state.fence import Fence
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.redis_client import connect

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eagle_synth", "producer", "workers")
RENEW = LuaScript("renew")


def _calls_named(name: str) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_product_module_sends_lua_text():
    assert _calls_named("eval") == []


def test_a_server_that_lost_its_scripts_gets_them_again(redis_server):
    client = connect(broker_settings(redis_url=redis_server.url))
    client.set("lease", "me", px=60_000)
    assert RENEW(client, ("lease",), ("me", 60_000)) == 1
    assert client.script_exists(RENEW._on(client).sha) == [True]
    client.script_flush()
    assert RENEW(client, ("lease",), ("me", 30_000)) == 1
    assert 0 < client.pttl("lease") <= 30_000
    assert RENEW(client, ("lease",), ("someone else", 60_000)) == 0


def test_a_fenced_script_after_a_flush_runs_in_its_transaction(redis_server):
    client = connect(broker_settings(redis_url=redis_server.url))
    fence = Fence("lease", "me", 60_000, "claims", "receipts")
    client.set("lease", "me", px=60_000)
    client.script_flush()
    assert fence.run_script(client, RENEW, ("lease",), ("me", 45_000)) == 1
    assert 0 < client.pttl("lease") <= 45_000
    assert client.hget("receipts", "me")  # the script ran inside the fenced transaction
    client.set("lease", "another")
    with pytest.raises(LeaseLost):
        fence.run_script(client, RENEW, ("lease",), ("me", 45_000))
    assert client.get("lease") == b"another"
