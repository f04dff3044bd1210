"""docker-compose.yml, .env.example and the Dockerfile, checked for structure with a YAML parser
(no Docker engine here): the services and their health checks, no parser flags on SGLang, no
password anywhere but .env, and every variable the compose file uses present in .env.example.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES = COMPOSE["services"]
ENV_EXAMPLE = (ROOT / ".env.example").read_text()
# Flags that make SGLang rewrite or drop the raw token ids that eagle-synth keeps.
FORBIDDEN_SGLANG_FLAGS = ("--reasoning-parser", "--tool-call-parser", "--skip-tokenizer-init")
PLACEHOLDER = "change-me"
# ${NAME}, ${NAME:?msg}, ${NAME?msg}, ${NAME:-default}; $$ escapes are not variables.
VARIABLE = re.compile(r"(?<!\$)\$\{([A-Z0-9_]+)(?:(:?[?-])([^}]*))?\}")


def _env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f".env.example line is not NAME=value: {line!r}"
            values[name] = value
    return values


def _command(service: str) -> str:
    command = SERVICES[service]["command"]
    return command if isinstance(command, str) else " ".join(command)


# Services a plain `docker compose up` starts.
ALWAYS_STARTED = ("redis", "flower", "worker", "sglang", "exporter", "prometheus")
# The placeholder checks of the services that refuse `change-me` (the check names it, by design).
PLACEHOLDER_CHECKS = ("$$REDIS_PASSWORD", "$$GF_SECURITY_ADMIN_PASSWORD")
# The optional Sentinel deployment (`--profile sentinel`): a replica and three sentinels.
SENTINEL_SERVICES = {"redis-replica", "redis-sentinel-1", "redis-sentinel-2", "redis-sentinel-3"}


def test_services_and_profiles() -> None:
    assert set(SERVICES) == {*ALWAYS_STARTED, "producer", "grafana"} | SENTINEL_SERVICES
    assert all(SERVICES[s]["profiles"] == ["sentinel"] for s in SENTINEL_SERVICES)
    assert SERVICES["producer"]["profiles"] == ["producer"]
    assert SERVICES["producer"]["restart"] == "no"
    assert SERVICES["grafana"]["profiles"] == ["grafana"]
    # Everything else starts with a plain `docker compose up`.
    assert all("profiles" not in SERVICES[s] for s in ALWAYS_STARTED)


def test_every_long_running_service_but_the_worker_has_a_health_check() -> None:
    for name in ("redis", "flower", "sglang", "exporter", "prometheus", "grafana"):
        check = SERVICES[name]["healthcheck"]
        assert check["test"] and check["interval"] and check["retries"] >= 3, name


def test_redis_is_durable_password_protected_and_never_evicts() -> None:
    redis = SERVICES["redis"]
    assert redis["image"].startswith("${REDIS_IMAGE")
    assert "redis:7" in _env_example()["REDIS_IMAGE"]
    command = _command("redis")
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command
    assert '--requirepass "$$REDIS_PASSWORD"' in command
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    assert "redis-data:/data" in redis["volumes"] and "redis-data" in COMPOSE["volumes"]


def test_flower_requires_auth_and_waits_for_redis() -> None:
    flower = SERVICES["flower"]
    assert flower["command"][0] == "flower" and "--no-auth" not in flower["command"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")
    assert flower["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "/healthcheck" in " ".join(flower["healthcheck"]["test"])


def test_worker_is_built_here_and_points_at_sglang() -> None:
    worker = SERVICES["worker"]
    assert worker["build"]["context"] == "."
    command = _command("worker")
    assert command.startswith("worker ") and "--server http://sglang:30000" in command and "--out /data/out" in command
    assert "sglang" in worker["depends_on"]
    # Longer than the worker's soft shutdown, so SIGTERM puts unfinished batches back.
    from eagle_synth.settings import DEFAULT_SOFT_SHUTDOWN

    assert int(worker["stop_grace_period"].rstrip("s")) > DEFAULT_SOFT_SHUTDOWN
    assert worker["environment"]["REDIS_URL"].startswith("${REDIS_URL:?")


def test_sglang_official_image_gpu_and_patient_health_check() -> None:
    sglang = SERVICES["sglang"]
    assert _env_example()["SGLANG_IMAGE"].startswith("lmsysorg/sglang:")
    launch = " ".join(sglang["entrypoint"]) + " " + _command("sglang")
    assert "sglang.launch_server" in launch and "--port 30000" in launch and "--host 0.0.0.0" in launch
    devices = sglang["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    check = sglang["healthcheck"]
    assert "/health" in " ".join(check["test"])
    assert check["start_period"].startswith("${SGLANG_START_PERIOD")
    period = _env_example()["SGLANG_START_PERIOD"]
    assert period.endswith("m") and int(period[:-1]) >= 20, "weights can take many minutes to load"


@pytest.mark.parametrize("flag", FORBIDDEN_SGLANG_FLAGS)
def test_no_parser_flags(flag: str) -> None:
    assert flag not in _command("sglang")
    assert flag not in _env_example()["SGLANG_EXTRA_ARGS"]
    # Comments may name them (to warn); no configured value may use them.
    code = "\n".join(line.split("#", 1)[0] for line in COMPOSE_TEXT.splitlines())
    assert flag not in code


def test_prometheus_scrapes_the_workers_and_the_exporter_on_the_ports_they_serve() -> None:
    from eagle_synth.cli.ops import EXPORTER_PORT

    worker_port = int(re.search(r"--metrics-port (\d+)", _command("worker"))[1])
    assert SERVICES["worker"]["ports"][0].endswith(f":{worker_port}")
    exporter = SERVICES["exporter"]["command"]
    assert exporter[0] == "exporter" and exporter[exporter.index("--port") + 1] == str(EXPORTER_PORT)
    assert SERVICES["exporter"]["depends_on"]["redis"]["condition"] == "service_healthy"
    prometheus = SERVICES["prometheus"]
    mount = next(v for v in prometheus["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro"))
    config = yaml.safe_load((ROOT / mount.split(":")[0]).read_text())
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets == {
        "eagle-synth-workers": [f"worker:{worker_port}"],
        "eagle-synth-exporter": [f"exporter:{EXPORTER_PORT}"],
    }
    assert "prometheus-data" in COMPOSE["volumes"]


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    grafana = SERVICES["grafana"]
    mounts = {v.split(":")[1]: ROOT / v.split(":")[0] for v in grafana["volumes"] if v.startswith("./")}
    assert mounts["/var/lib/grafana/dashboards/eagle-synth.json"] == ROOT / "docs/grafana/eagle-synth.json"
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards/eagle-synth.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    # The placeholder is refused before Grafana's own start script runs.
    assert "= change-me ]" in grafana["command"][0] and grafana["command"][0].rstrip().endswith("exec /run.sh")


def test_producer_is_one_shot_enqueue() -> None:
    command = _command("producer")
    assert command.startswith("enqueue ") and "--campaign" in command and "--tokenizer /data/tokenizer" in command


def test_no_password_in_the_compose_file() -> None:
    for name, value in _walk(COMPOSE):
        text = str(value)
        assert PLACEHOLDER not in text or any(c in text for c in PLACEHOLDER_CHECKS), f"{name} holds the placeholder"
        if re.search(r"pass|auth|secret|token", name, re.I):
            # Secrets come only from required variables, never inline or with a default.
            assert re.fullmatch(r"\$\{[A-Z0-9_]+:?\?[^}]*\}", text), f"{name} = {text!r}"
    for name, operator, _ in VARIABLE.findall(COMPOSE_TEXT):
        if re.search(r"PASSWORD|AUTH|TOKEN|SECRET", name):
            assert operator in ("?", ":?"), f"{name} must be required, not defaulted"
    assert "redis://:" not in COMPOSE_TEXT.replace("${", "")  # no URL with inline credentials


def test_every_setting_comes_from_env_example() -> None:
    used = {name for name, _, _ in VARIABLE.findall(COMPOSE_TEXT)}
    example = _env_example()
    assert used <= set(example), f"missing from .env.example: {sorted(used - set(example))}"
    # Nothing silently falls back to a default written in the compose file.
    assert all(op in ("?", ":?") for _, op, _ in VARIABLE.findall(COMPOSE_TEXT))
    unused = set(example) - used - {"REDIS_PASSWORD"}
    assert not unused, f".env.example settings the compose file ignores: {sorted(unused)}"


def test_env_example_secrets_are_placeholders() -> None:
    example = _env_example()
    assert example["REDIS_PASSWORD"] == PLACEHOLDER
    assert example["FLOWER_BASIC_AUTH"].endswith(":" + PLACEHOLDER)
    assert example["GRAFANA_ADMIN_PASSWORD"] == PLACEHOLDER
    assert example["HF_TOKEN"] == ""
    assert "${REDIS_PASSWORD}" in example["REDIS_URL"]


def test_dockerfile_installs_the_project_with_eagle_synth_entrypoint() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\s*$", dockerfile, re.M)
    assert "pip install" in dockerfile
    assert re.search(r'^ENTRYPOINT \["eagle-synth"\]\s*$', dockerfile, re.M)
    assert re.search(r"^USER \w+", dockerfile, re.M), "run unprivileged"
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ".env" in ignored and ".git" in ignored


def _walk(node, path: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}[{index}]")
    else:
        yield path, node


def test_the_sentinel_profile_replicates_durably_and_watches_the_master_by_name() -> None:
    replica = _command("redis-replica")
    assert "--replicaof redis 6379" in replica and "--appendonly yes" in replica
    assert "--maxmemory-policy noeviction" in replica and '--masterauth "$$REDIS_PASSWORD"' in replica
    sentinel = _command("redis-sentinel-1")
    assert "sentinel monitor campaign redis 6379 2" in sentinel and "auth-pass campaign" in sentinel
    assert "redis-replica-data" in COMPOSE["volumes"]
