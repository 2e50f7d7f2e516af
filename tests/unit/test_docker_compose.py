"""docker-compose.yml agrees with the code: commands exist in the CLI, variables exist in Settings,
Grafana's provisioning paths exist, infrastructure has healthchecks and named volumes.

No Docker engine is needed: the file is parsed as YAML (``docker compose config`` also runs when a
``docker`` client is installed). A service whose command names a CLI command that does not exist
(yet) fails here, so the stack never ships a container that exits with "No such command".
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from entroloop.cli import app
from entroloop.contract.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?][^}]*)?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def entroloop_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services run from the repository's Dockerfile (ENTRYPOINT entroloop)."""
    return {name: s for name, s in services.items() if "build" in s}


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _is_group(command: Any) -> bool:
    # typer vendors its own click (typer._click), so duck-type instead of isinstance(click.Group)
    return hasattr(command, "get_command") and hasattr(command, "list_commands")


def resolve_command(tokens: list[str]) -> Any:
    """The command that ``entroloop TOKENS...`` runs; fails naming the first unknown word or option."""
    command: Any = typer.main.get_command(app)
    ctx = command.context_class(command)
    words = list(tokens)
    path = ["entroloop"]
    while _is_group(command) and words and not words[0].startswith("-"):
        name = words.pop(0)
        sub = command.get_command(ctx, name)
        assert sub is not None, f"`{' '.join(path)} {name}` is not a command (known: {sorted(command.list_commands(ctx))})"
        path.append(name)
        command, ctx = sub, sub.context_class(sub, parent=ctx)
    assert not _is_group(command), f"`{' '.join(path)}` is a group, not a command"
    options = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for word in words:
        if word.startswith("--"):
            assert word.split("=")[0] in options, f"`{' '.join(path)}` has no option {word}"
    return command


def test_compose_parses_and_has_the_stack(services: dict[str, dict[str, Any]]) -> None:
    expected = {"kafka", "clickhouse", "minio", "minio-init", "grafana", "migrate", "worker", "sink-clickhouse",
                "sink-audit", "trainer"}
    assert expected <= set(services), f"missing services: {expected - set(services)}"
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    assert services["trainer"].get("profiles") == ["training"]
    assert services["trainer"]["command"] == ["trainer"]


def test_every_entroloop_command_exists_in_the_cli(services: dict[str, dict[str, Any]]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["entroloop"\]', dockerfile, re.M), "the image's entrypoint must be the CLI"
    ours = entroloop_services(services)
    assert {"migrate", "worker", "sink-clickhouse", "sink-audit", "trainer"} <= set(ours)
    for name, service in ours.items():
        command = service.get("command")
        assert isinstance(command, list) and command, f"{name}: command must be a list of CLI words"
        resolve_command(command)


def test_resolve_command_rejects_unknown_commands() -> None:
    with pytest.raises(AssertionError, match="not a command"):
        resolve_command(["no-such-command"])
    with pytest.raises(AssertionError, match="no option"):
        resolve_command(["sink", "audit", "--no-such-option"])
    resolve_command(["sink", "audit", "--until-empty"])


def compose_variables(text: str) -> set[str]:
    return set(INTERPOLATION.findall(text))


def env_example() -> dict[str, str]:
    pairs = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example: {line!r} is not KEY=VALUE"
            pairs[key] = value
    return pairs


def test_every_entroloop_variable_is_a_setting(services: dict[str, dict[str, Any]]) -> None:
    names: set[str] = set(env_example()) | compose_variables(COMPOSE.read_text())
    for service in services.values():
        names |= set(environment(service))
    ours = {n for n in names if n.startswith(ENV_PREFIX)}
    assert len(ours) > 10
    unknown = sorted(n for n in ours if n[len(ENV_PREFIX):].lower() not in Settings.model_fields)
    assert not unknown, f"not settings (entroloop/contract/settings.py): {unknown}; non-settings must not use the ENTROLOOP_ prefix"


def test_env_example_defines_every_interpolated_variable(compose: dict[str, Any]) -> None:
    defined = set(env_example())
    used = compose_variables(COMPOSE.read_text())
    assert not used - defined, f"used in docker-compose.yml, missing from .env.example: {sorted(used - defined)}"
    required = set(re.findall(r"\$\{([A-Za-z0-9_]+):\?", COMPOSE.read_text()))
    assert {"CLICKHOUSE_PASSWORD", "MINIO_ROOT_PASSWORD", "GRAFANA_ADMIN_PASSWORD"} <= required


def test_entroloop_services_reach_the_stack(services: dict[str, dict[str, Any]]) -> None:
    for name, service in entroloop_services(services).items():
        env = environment(service)
        assert env["ENTROLOOP_KAFKA_BOOTSTRAP"] == "kafka:9092", name
        assert env["ENTROLOOP_CLICKHOUSE_DSN"] == "http://clickhouse:8123", name
    audit = environment(services["sink-audit"])
    assert audit["ENTROLOOP_AUDIT_STORE"] == "s3" and audit["ENTROLOOP_S3_ENDPOINT"] == "http://minio:9000"
    init = " ".join(services["minio-init"]["command"])
    assert "--with-lock" in init, "the audit bucket needs Object Lock, which only bucket creation can enable"
    assert services["minio-init"]["environment"]["AUDIT_BUCKET"] == audit["ENTROLOOP_S3_BUCKET"]


def test_workers_scale(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker, "`--scale worker=N` needs no fixed name or port"


def test_grafana_provisioning(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    env = environment(grafana)
    assert "grafana-clickhouse-datasource" in env["GF_INSTALL_PLUGINS"]
    assert "CLICKHOUSE_PASSWORD" in env, "the datasource provisioning file reads $CLICKHOUSE_PASSWORD"
    mounts = {}
    for volume in grafana["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[target] = source
    assert (ROOT / mounts["/etc/grafana/provisioning"]).resolve() == ROOT / "dashboards" / "provisioning"
    assert (ROOT / mounts["/var/lib/grafana/dashboards/entroloop"]).resolve() == ROOT / "dashboards" / "json"
    for target, source in mounts.items():
        if source.startswith("."):
            assert (ROOT / source).is_dir(), f"{source} (mounted at {target}) does not exist"
    provider = yaml.safe_load((ROOT / "dashboards/provisioning/dashboards/entroloop.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/entroloop"
    datasource = yaml.safe_load((ROOT / "dashboards/provisioning/datasources/clickhouse.yaml").read_text())
    host = datasource["datasources"][0]["jsonData"]["host"]
    assert host in services and datasource["datasources"][0]["jsonData"]["port"] == 8123
    assert list((ROOT / "dashboards/json").glob("*.json")), "no dashboards to provision"


def test_healthchecks_and_named_volumes(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    for name in ("kafka", "clickhouse", "minio", "grafana"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name, service in services.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if rule.get("condition") == "service_healthy":
                assert services[dependency].get("healthcheck"), f"{name} waits for {dependency}, which has no healthcheck"
            if rule.get("condition") == "service_completed_successfully":
                assert services[dependency].get("restart") == "no", f"{dependency} must be a one-shot service"
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0]
            if not source.startswith((".", "/", "$")):
                assert source in declared, f"{name}: volume {source} is not declared"
    for name in ("kafka", "clickhouse", "minio", "grafana"):
        assert any(v.split(":")[0] in declared for v in services[name]["volumes"]), f"{name} keeps no data volume"


def test_docker_compose_config_when_a_client_exists(tmp_path: Path) -> None:
    """The Docker client's own validation, where one is installed (it needs no engine)."""
    docker = shutil.which("docker")
    has_compose = docker is not None and subprocess.run(
        [docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0
    if not has_compose:
        # no compose client on the test machines: the YAML checks above are the test
        assert yaml.safe_load(COMPOSE.read_text())["services"]
        return
    env = tmp_path / ".env"
    env.write_text(ENV_EXAMPLE.read_text())
    result = subprocess.run([docker, "compose", "-f", str(COMPOSE), "--env-file", str(env), "--profile", "training",
                             "--profile", "demo", "config", "--quiet"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
