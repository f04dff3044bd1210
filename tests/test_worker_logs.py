"""What a worker's log says: a worker whose servers are all down says so again at growing
intervals (not once and then nothing), and routine events are INFO, problems WARNING."""

from __future__ import annotations

import logging
import time

import pytest

from eagle_synth.settings import broker_settings
from eagle_synth.state.node_state import NodeState
from eagle_synth.state.redis_client import connect
from eagle_synth.testing.harness import free_port
from workers.config import WorkerConfig
from workers.servers import health
from workers.servers.health import HealthGate
from workers.servers.model_check import ModelCheck
from workers.servers.routing import CampaignRouter


@pytest.mark.integration
def test_a_dead_server_is_said_again_at_growing_intervals(redis_server, monkeypatch, caplog):
    monkeypatch.setattr(health, "STILL_CLOSED_FIRST", 0.2)
    monkeypatch.setattr(health, "STILL_CLOSED_MAX", 0.8)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    node = NodeState(connect(broker_settings(redis_url=redis_server.url)), "dead@here")
    router = CampaignRouter(client=node.client, base_queue="eagle-synth", check=ModelCheck({}))
    gate = HealthGate(
        config=WorkerConfig(servers=(dead,)), node_state=node, router=router, on_consume=print, on_stop=print
    )
    caplog.set_level(logging.INFO, logger="eagle_synth")

    def reminders() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("still not taking batches")]

    deadline = time.monotonic() + 20
    while len(reminders()) < 3:
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        gate.tick()
        time.sleep(0.02)
    said = reminders()
    assert all(r.levelno == logging.WARNING for r in said)
    assert dead in said[0].getMessage() and "loading since" in said[0].getMessage()
    first_gap = said[1].created - said[0].created
    second_gap = said[2].created - said[1].created
    assert second_gap > first_gap * 1.5, (first_gap, second_gap)
    went_down = [r for r in caplog.records if "unknown -> loading" in r.getMessage()]
    assert len(went_down) == 1 and went_down[0].levelno == logging.WARNING
