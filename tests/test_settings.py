"""The settings family: arguments, then the environment, then defaults; each variable's name as
before; a child process reads back exactly what its parent resolved."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle_synth.errors import ConfigError, SettingsError, UserError
from eagle_synth.settings import BrokerSettings, Timings, broker_settings
from workers.config import WorkerConfig


def test_broker_settings_take_arguments_then_environment_then_defaults(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("EAGLE_SYNTH_QUEUE", raising=False)
    assert broker_settings().redis_url == "redis://127.0.0.1:6379/0"
    monkeypatch.setenv("REDIS_URL", "redis://env:6379/1")
    monkeypatch.setenv("EAGLE_SYNTH_QUEUE", "q-env")
    monkeypatch.setenv("EAGLE_SYNTH_VISIBILITY_TIMEOUT", "")  # empty: unset
    monkeypatch.setenv("EAGLE_SYNTH_REDIS_CA", "/ca.pem")
    settings = broker_settings()
    assert (settings.redis_url, settings.queue, settings.ssl_ca) == ("redis://env:6379/1", "q-env", "/ca.pem")
    assert settings.visibility_timeout == 6 * 3600
    assert broker_settings(redis_url="redis://flag:1/0", queue="q-flag").redis_url == "redis://flag:1/0"
    env = settings.to_env()
    assert env["REDIS_URL"] == "redis://env:6379/1" and env["EAGLE_SYNTH_SOFT_SHUTDOWN_TIMEOUT"] == "30"
    assert env["EAGLE_SYNTH_REDIS_CA"] == "/ca.pem" and env["EAGLE_SYNTH_REDIS_CERT"] == ""


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("REDIS_URL", "http://host", "must start with redis://"),
        ("EAGLE_SYNTH_RESTORE_INTERVAL", "soon", "EAGLE_SYNTH_RESTORE_INTERVAL 'soon'"),
        ("EAGLE_SYNTH_SOFT_SHUTDOWN_TIMEOUT", "0", "greater than 0"),
    ],
)
def test_bad_broker_values_name_their_variable(monkeypatch, name, value, says):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=says):
        broker_settings()


def test_timings_read_their_variables(monkeypatch):
    monkeypatch.setenv("EAGLE_SYNTH_LEASE_TTL", "4")
    monkeypatch.setenv("EAGLE_SYNTH_RESTART_BACKOFF_MAX", "2")
    timings = Timings.load()
    assert (timings.lease_ttl, timings.restart_backoff_max, timings.reap_after) == (4.0, 2.0, 120.0)


def test_worker_config_is_one_hop_and_reads_back_in_the_child(monkeypatch):
    monkeypatch.setenv("EAGLE_SYNTH_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("EAGLE_SYNTH_INFLIGHT", "7")
    config = WorkerConfig.load(servers=("http://a/", "http://b"), inflight=9, backoff_max=None, out=Path("o"))
    assert config.servers == ("http://a", "http://b") and config.inflight == 9 and config.max_attempts == 3
    assert config.backoff_max == 30.0
    for name in list(WorkerConfig.model_fields):
        monkeypatch.delenv(WorkerConfig.env_name(name), raising=False)
    for name, value in config.to_env().items():
        monkeypatch.setenv(name, value)
    assert WorkerConfig.from_env() == config
    monkeypatch.setenv("EAGLE_SYNTH_ALLOW_SERVER_SETTINGS", " allow_auto_truncate , is_generation")
    assert WorkerConfig.from_env().allow_server_settings == ("allow_auto_truncate", "is_generation")


def test_worker_config_refusals_name_the_setting(monkeypatch):
    monkeypatch.delenv("EAGLE_SYNTH_SERVERS", raising=False)
    with pytest.raises(ConfigError, match="no server configured: set EAGLE_SYNTH_SERVERS"):
        WorkerConfig.from_env()
    with pytest.raises(ConfigError, match="max_attempts 0: must be at least 1"):
        WorkerConfig.load(servers=("http://a",), max_attempts=0)
    monkeypatch.setenv("EAGLE_SYNTH_PROBE_TIMEOUT", "slow")
    with pytest.raises(ConfigError, match="EAGLE_SYNTH_PROBE_TIMEOUT 'slow'"):
        WorkerConfig.load(servers=("http://a",))
    assert issubclass(ConfigError, UserError) and BrokerSettings.env_name("queue") == "EAGLE_SYNTH_QUEUE"


def test_a_sentinel_url_gives_every_client_the_sentinels_the_master_and_its_credentials(monkeypatch):
    from eagle_synth.queue import celery_config

    monkeypatch.setenv("REDIS_URL", "sentinel://eagle:s%40cret@s1:26380/2;sentinel://s2;sentinel://s3:26381")
    monkeypatch.setenv("EAGLE_SYNTH_SENTINEL_MASTER", "campaign")
    monkeypatch.setenv("EAGLE_SYNTH_SENTINEL_PASSWORD", "sentinel-secret")
    settings = broker_settings()
    assert settings.uses_sentinel and not settings.uses_tls
    assert settings.sentinel_addresses == [("s1", 26380), ("s2", 26379), ("s3", 26381)]
    assert settings.sentinel_master_auth == {"db": "2", "username": "eagle", "password": "s@cret"}
    assert settings.sentinel_kwargs()["password"] == "sentinel-secret"
    config = celery_config(settings)
    assert config["broker_url"] == settings.redis_url
    assert config["broker_transport_options"]["master_name"] == "campaign"
    # The worker's child process reads the same back.
    assert settings.to_env()["EAGLE_SYNTH_SENTINEL_MASTER"] == "campaign"
    monkeypatch.setenv("EAGLE_SYNTH_SENTINEL_TLS", "1")
    tls = broker_settings()
    assert tls.uses_tls and tls.ssl_options() and tls.sentinel_kwargs()["ssl"] is True
    assert celery_config(tls)["broker_use_ssl"] == tls.ssl_options()


@pytest.mark.parametrize(
    ("url", "master", "says"),
    [
        ("sentinel://s1:26379;sentinel://s2", None, "set EAGLE_SYNTH_SENTINEL_MASTER"),
        ("sentinel://s1:26379;redis://s2", "campaign", "every part"),
    ],
)
def test_a_sentinel_url_without_a_master_name_or_with_a_foreign_part_is_one_line(monkeypatch, url, master, says):
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.delenv("EAGLE_SYNTH_SENTINEL_MASTER", raising=False)
    if master:
        monkeypatch.setenv("EAGLE_SYNTH_SENTINEL_MASTER", master)
    with pytest.raises(SettingsError, match=says) as raised:
        broker_settings()
    assert "\n" not in str(raised.value)
