"""workers/servers/: the health gate and the batch threads share one Fleet in the process (one
client per server, states, suspects, successes), and both HTTP libraries fail and authenticate
the same way (workers/servers/transport.py)."""

from __future__ import annotations

import time

import aiohttp
import pytest
import requests

from eagle_synth.errors import ServerDown, TransientError
from eagle_synth.settings import broker_settings
from eagle_synth.state.node_state import HEALTHY, LOADING, REFUSED, UNHEALTHY, NodeState, ServerState
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import free_port
from workers.config import WorkerConfig
from workers.servers.fleet import Fleet
from workers.servers.health import HealthGate
from workers.servers.model_check import REFUSE_PREFIX, ModelCheck
from workers.servers.routing import CampaignRouter
from workers.servers.transport import auth_headers, transport_error

A = "http://a:1"
B = "http://b:2"


def healthy(since: float, backend: str | None = "sglang") -> ServerState:
    return ServerState(state=HEALTHY, since=since, backend=backend)


def test_routable_servers_are_healthy_of_a_known_kind_and_not_suspected_since():
    fleet = Fleet([A, B])
    since = time.time() - 10
    fleet.publish({A: healthy(since), B: healthy(since, backend=None)})
    assert set(fleet.routable([A, B])) == {A}, "a server whose kind preflight has not found takes nothing"
    fleet.suspect(A, "reset by peer")
    assert fleet.routable([A, B]) == {}
    taken = fleet.take_suspects()
    assert taken[A].detail == "reset by peer"
    assert set(fleet.routable([A, B])) == {A}, "the gate took the report: its probe decides now"
    fleet.publish({A: ServerState(state=UNHEALTHY, since=time.time(), backend="sglang")})
    assert fleet.routable([A]) == {}


def test_published_states_are_copies_the_gate_may_go_on_changing():
    fleet = Fleet([A])
    mine = healthy(1.0)
    fleet.publish({A: mine})
    mine.state = LOADING
    assert fleet.state(A) == healthy(1.0)
    assert fleet.state(B) is None


def test_a_success_is_remembered_for_the_gate():
    fleet = Fleet([A])
    assert fleet.last_ok(A) == 0.0
    before = time.time()
    fleet.generated_ok(A)
    assert before <= fleet.last_ok(A) <= time.time()


def test_a_dead_server_is_down_once_checked_and_reported_to_the_gate():
    dead = f"http://127.0.0.1:{free_port()}"
    fleet = Fleet([dead])
    assert fleet.server_down(dead, "connection reset") is True
    suspect = fleet.take_suspects()[dead]
    assert suspect.detail.startswith("connection reset; health: ") and "connection refused" in suspect.detail
    # Within QUICK_HEALTH_REUSE the answer is reused: no second probe, no second report.
    assert fleet.server_down(dead, "again") is True
    assert fleet.take_suspects() == {}


@pytest.mark.integration
def test_the_gate_and_the_batches_share_one_client_and_the_reports(redis_server):
    dead = f"http://127.0.0.1:{free_port()}"
    node = NodeState(connect(broker_settings(redis_url=redis_server.url)), "fleet@here")
    fleet = Fleet([dead])
    router = CampaignRouter(client=node.client, base_queue="eagle-synth", check=ModelCheck(fleet.clients))
    config = WorkerConfig(servers=(dead,))
    gate = HealthGate(config=config, node_state=node, router=router, on_consume=print, on_stop=print, fleet=fleet)
    assert gate.tracked[dead].client is fleet.clients[dead] is router.check.clients[dead]
    gate.tick()
    assert fleet.state(dead).state == LOADING
    fleet.suspect(dead, f"{REFUSE_PREFIX}it serves another model")  # as a batch reports it
    gate.tick()
    assert fleet.state(dead).state == REFUSED
    assert fleet.state(dead).detail == "it serves another model"
    assert node.states()[dead].state == REFUSED, "status reads it from Redis"
    assert node.snapshot().keys().isdisjoint({f"suspect:{dead}", f"ok:{dead}"}), "reports stay in the process"


def test_both_http_libraries_map_a_refused_connection_and_a_timeout_alike():
    url = f"http://127.0.0.1:{free_port()}"
    refused = requests.ConnectionError("Failed to establish a new connection: [Errno 111] Connection refused")
    assert str(transport_error(refused, url=url, path="/health", timeout=5)) == f"{url}: connection refused"
    for slow in (requests.Timeout("read timed out"), TimeoutError()):
        error = transport_error(slow, url=url, path="/generate", timeout=30)
        assert isinstance(error, TransientError)
        assert str(error) == f"{url}/generate: no answer within 30 s"
    reset = transport_error(aiohttp.ServerDisconnectedError(), url=url, path="/generate", timeout=30)
    assert isinstance(reset, TransientError) and "connection error" in str(reset)
    with pytest.raises(ServerDown):
        Fleet([url]).clients[url].health(timeout=5)


def test_the_api_key_is_added_in_one_place():
    assert auth_headers(None) == {}
    assert auth_headers("sk-1") == {"Authorization": "Bearer sk-1"}
    fleet = Fleet([A], api_key="sk-1")
    assert fleet.clients[A].session.headers["Authorization"] == "Bearer sk-1"
    assert "Authorization" not in Fleet([A]).clients[A].session.headers
