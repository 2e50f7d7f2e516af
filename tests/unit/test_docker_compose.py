"""docker-compose.yml agrees with the code: commands exist in the CLI, variables exist in Settings,
Grafana's provisioning paths exist, infrastructure has healthchecks and named volumes, every
long-running entroloop service is health-checked on the port it serves /metrics on, the gateway
fronts the vLLM service of the cpu or gpu profile, and Kafka advertises a configurable address.

No Docker engine is needed: the file is parsed as YAML (``docker compose config`` also runs when a
``docker`` client is installed). A service whose command names a CLI command that does not exist
(yet) fails here, so the stack never ships a container that exits with "No such command".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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


def dockerfile(service: dict[str, Any]) -> str | None:
    build = service.get("build")
    if build is None:
        return None
    return "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")


def entroloop_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services run from the repository's Dockerfile (ENTRYPOINT entroloop)."""
    return {name: s for name, s in services.items() if dockerfile(s) == "Dockerfile"}


def serving_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """vLLM with entroloop's serving install (Dockerfile.serving; ENTRYPOINT vllm serve)."""
    return {name: s for name, s in services.items() if dockerfile(s) == "Dockerfile.serving"}


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
                "sink-audit", "trainer", "actions", "gateway", "vllm-cpu", "vllm-gpu"}
    assert set(entroloop_services(services)) | set(serving_services(services)) == {
        name for name, s in services.items() if "build" in s}, "a built service from an unknown Dockerfile"
    assert expected <= set(services), f"missing services: {expected - set(services)}"
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    assert services["trainer"].get("profiles") == ["training"]
    assert services["trainer"]["command"] == ["trainer"]
    # the action runner: its own service (a slow webhook never holds up the workers), state in a volume
    assert services["actions"]["command"][0] == "actions" and "profiles" not in services["actions"]
    assert any(v.startswith("actions-data:") for v in services["actions"]["volumes"])


def test_every_entroloop_command_exists_in_the_cli(services: dict[str, dict[str, Any]]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["entroloop"\]', dockerfile, re.M), "the image's entrypoint must be the CLI"
    ours = entroloop_services(services)
    assert {"migrate", "worker", "sink-clickhouse", "sink-audit", "trainer", "actions", "gateway"} <= set(ours)
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
    # ENTROLOOP_<SECRET>_FILE names a file holding a secret setting (entroloop/contract/secret_files.py)
    ours = {n.removesuffix("_FILE") if n.endswith("_FILE") else n for n in names if n.startswith(ENV_PREFIX)}
    assert len(ours) > 10
    unknown = sorted(n for n in ours if n[len(ENV_PREFIX):].lower() not in Settings.model_fields)
    assert not unknown, f"not settings (entroloop/contract/settings.py): {unknown}; non-settings must not use the ENTROLOOP_ prefix"


def test_env_example_defines_every_interpolated_variable(compose: dict[str, Any]) -> None:
    defined = set(env_example())
    used = compose_variables(COMPOSE.read_text())
    assert not used - defined, f"used in docker-compose.yml, missing from .env.example: {sorted(used - defined)}"
    required = set(re.findall(r"\$\{([A-Za-z0-9_]+):\?", COMPOSE.read_text()))
    assert set(PASSWORDS) <= required, f"passwords without ${{VAR:?}}: {sorted(set(PASSWORDS) - required)}"


def test_entroloop_services_reach_the_stack(services: dict[str, dict[str, Any]]) -> None:
    for name, service in entroloop_services(services).items():
        env = environment(service)
        assert env["ENTROLOOP_KAFKA_BOOTSTRAP"] == "kafka:9092", name
        assert env["ENTROLOOP_CLICKHOUSE_DSN"] == "http://clickhouse:8123", name
    audit = environment(services["sink-audit"])
    assert audit["ENTROLOOP_AUDIT_STORE"] == "s3" and audit["ENTROLOOP_S3_ENDPOINT"] == "http://minio:9000"
    init = (ROOT / "scripts/compose/minio-init.sh").read_text()
    assert "--with-lock" in init, "the audit bucket needs Object Lock, which only bucket creation can enable"
    assert services["minio-init"]["environment"]["AUDIT_BUCKET"] == audit["ENTROLOOP_S3_BUCKET"]


def test_workers_scale(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker, "`--scale worker=N` needs no fixed name or port"


def test_grafana_provisioning(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    env = environment(grafana)
    assert "grafana-clickhouse-datasource" in env["GF_INSTALL_PLUGINS"]
    assert "CLICKHOUSE_GRAFANA_PASSWORD" in env, "the datasource provisioning file reads $CLICKHOUSE_GRAFANA_PASSWORD"
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
    values = {**env_example(), **random_passwords()}  # .env.example leaves the passwords empty on purpose
    env.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    result = subprocess.run([docker, "compose", "-f", str(COMPOSE), "--env-file", str(env), "--profile", "training",
                             "--profile", "demo", "config", "--quiet"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# --- deployment secrets (issue 12, finding 8) ------------------------------------------------------
# The stack used to accept the `change-me-*` passwords of .env.example, and the audit sink wrote
# with MinIO's root credentials. The shell scripts of scripts/compose/ run here for real (POSIX sh,
# with a recording stand-in for `mc`), so what the containers would do is checked, not just grepped.

SCRIPTS = ROOT / "scripts" / "compose"
PASSWORDS = ("CLICKHOUSE_PASSWORD", "CLICKHOUSE_GRAFANA_PASSWORD", "MINIO_ROOT_PASSWORD", "MINIO_AUDIT_WRITER_PASSWORD",
             "MINIO_AUDIT_READER_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "ENTROLOOP_PII_HASH_KEY")
ROOT_CREDENTIALS = ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD")
# the only services that may see MinIO's root credentials
MINIO_ADMINS = {"minio", "minio-init", "check-secrets"}
OLD_PLACEHOLDERS = {"CLICKHOUSE_PASSWORD": "change-me-clickhouse", "MINIO_ROOT_PASSWORD": "change-me-minio-at-least-8-chars",
                    "GRAFANA_ADMIN_PASSWORD": "change-me-grafana", "ENTROLOOP_PII_HASH_KEY": "change-me-pii-hash-key"}


def random_passwords() -> dict[str, str]:
    import secrets

    return {name: secrets.token_urlsafe(24) for name in PASSWORDS}


def interpolate(value: str, env: dict[str, str]) -> str:
    """docker compose's interpolation of one value: ${X}, ${X:-default}, ${X:?error}, $$."""
    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2) or "", match.group(3) or ""
        current = env.get(name, "")
        if op == ":?" and not current:
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        if op == ":-" and not current:
            return arg
        return current

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:[-?])?([^}]*)\}", one, value).replace("$$", "$")


def resolved_environment(service: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    return {k: interpolate(v, env) for k, v in environment(service).items()}


def references(value: str) -> set[str]:
    return set(INTERPOLATION.findall(value))


def test_env_example_ships_no_usable_password() -> None:
    example = env_example()
    for name in PASSWORDS:
        assert name in example, f".env.example does not list {name}"
        assert example[name] == "", f".env.example sets {name}: a shipped password is a known password; leave it empty"


def test_empty_passwords_stop_compose_before_anything_starts(services: dict[str, dict[str, Any]]) -> None:
    """`cp .env.example .env && docker compose up` fails at interpolation, naming the variable."""
    env = env_example()
    with pytest.raises(ValueError, match="CLICKHOUSE_PASSWORD|MINIO_|GRAFANA_|ENTROLOOP_PII_HASH_KEY"):
        resolved_environment(services["check-secrets"], env)


def run_check_secrets(services: dict[str, dict[str, Any]], values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    service = services["check-secrets"]
    assert service["entrypoint"] == ["/bin/sh", "/scripts/check-secrets.sh"]
    assert "./scripts/compose:/scripts:ro" in service["volumes"]
    env = {**env_example(), **values}
    container_env = resolved_environment(service, env)
    return subprocess.run(["sh", str(SCRIPTS / "check-secrets.sh")], env={"PATH": "/usr/bin:/bin", **container_env},
                          capture_output=True, text=True, timeout=30, check=False)


def test_check_secrets_refuses_the_old_placeholders(services: dict[str, dict[str, Any]]) -> None:
    values = {**random_passwords(), **OLD_PLACEHOLDERS}
    result = run_check_secrets(services, values)
    assert result.returncode != 0
    for name, value in OLD_PLACEHOLDERS.items():
        assert f"{name} is a placeholder" in result.stderr
        assert value not in result.stderr + result.stdout
    for value in ("changeme", "Password123456789", "minioadmin", "CHANGE_ME_PLEASE_1234"):
        refused = run_check_secrets(services, {**random_passwords(), "MINIO_ROOT_PASSWORD": value})
        assert refused.returncode != 0 and "MINIO_ROOT_PASSWORD is a placeholder" in refused.stderr, value
    short = run_check_secrets(services, {**random_passwords(), "GRAFANA_ADMIN_PASSWORD": "x7Qp2"})
    assert short.returncode != 0 and "GRAFANA_ADMIN_PASSWORD is shorter than 16" in short.stderr
    same = run_check_secrets(services, {**random_passwords(), "MINIO_AUDIT_WRITER_USER": "entroloop-root"})
    assert same.returncode != 0 and "MINIO_AUDIT_WRITER_USER equals MINIO_ROOT_USER" in same.stderr


def test_check_secrets_passes_real_passwords(services: dict[str, dict[str, Any]]) -> None:
    values = random_passwords()
    result = run_check_secrets(services, values)
    assert result.returncode == 0, result.stderr
    assert not any(v in result.stdout + result.stderr for v in values.values())


def test_every_password_holder_waits_for_check_secrets(services: dict[str, dict[str, Any]]) -> None:
    checked = set(environment(services["check-secrets"])["CHECK_SECRETS"].split())
    assert set(PASSWORDS) <= checked
    for name in ("kafka", "clickhouse", "minio", "grafana"):
        rule = (services[name].get("depends_on") or {}).get("check-secrets")
        assert rule == {"condition": "service_completed_successfully"}, f"{name} starts without the secrets check"
    assert services["check-secrets"].get("network_mode") == "none"


def test_no_root_credentials_reach_entroloop_services(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if name in MINIO_ADMINS:
            continue
        used = set().union(*(references(v) for v in environment(service).values()))
        leaked = used & set(ROOT_CREDENTIALS)
        assert not leaked, f"{name} gets MinIO's root credentials {sorted(leaked)}; give it a limited user"


def test_audit_sink_writes_with_the_limited_user(services: dict[str, dict[str, Any]]) -> None:
    env = {**env_example(), **random_passwords()}
    audit = resolved_environment(services["sink-audit"], env)
    minio = resolved_environment(services["minio"], env)
    init = resolved_environment(services["minio-init"], env)
    assert audit["ENTROLOOP_S3_ACCESS_KEY"] == init["MINIO_AUDIT_WRITER_USER"] == "entroloop-audit-writer"
    assert audit["ENTROLOOP_S3_SECRET_KEY"] == env["MINIO_AUDIT_WRITER_PASSWORD"]
    assert audit["ENTROLOOP_S3_ACCESS_KEY"] != minio["MINIO_ROOT_USER"]
    assert audit["ENTROLOOP_S3_SECRET_KEY"] != minio["MINIO_ROOT_PASSWORD"]
    assert audit["ENTROLOOP_AUDIT_LOCK_MODE"] == "COMPLIANCE"
    trainer = resolved_environment(services["trainer"], env)
    assert trainer["ENTROLOOP_S3_ACCESS_KEY"] == init["MINIO_AUDIT_READER_USER"]
    assert trainer["ENTROLOOP_S3_SECRET_KEY"] == env["MINIO_AUDIT_READER_PASSWORD"]


def test_entroloop_services_run_in_production_mode(services: dict[str, dict[str, Any]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from entroloop.contract.settings import SettingsError, load_settings

    env = {**env_example(), **random_passwords()}
    for name, service in {**entroloop_services(services), **serving_services(services)}.items():
        resolved = resolved_environment(service, env)
        assert resolved["ENTROLOOP_MODE"] == "production", name
        # the settings they get load in production mode (nothing missing, no placeholder) ...
        with monkeypatch.context() as patch:
            for variable in [v for v in os.environ if v.startswith(ENV_PREFIX)]:
                patch.delenv(variable)
            for variable, value in resolved.items():
                if variable.startswith(ENV_PREFIX):
                    patch.setenv(variable, value)
            load_settings()
            # ... and the old .env.example values would have been refused
            patch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD", OLD_PLACEHOLDERS["CLICKHOUSE_PASSWORD"])
            with pytest.raises(SettingsError, match="ENTROLOOP_CLICKHOUSE_PASSWORD is a placeholder"):
                load_settings()


MC_STUB = """#!/bin/sh
# stands in for `mc`: records its arguments, keeps a copy of every policy file it is given
printf '%s\\n' "$*" >> "$MC_LOG"
if [ "$1 $2 $3" = "admin policy create" ]; then cp "$6" "$MC_POLICIES/$5.json"; fi
exit 0
"""


def run_minio_init(env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], list[str], dict[str, Any], str]:
    """Run scripts/compose/minio-init.sh as the minio-init service would, ``mc`` replaced by a
    recorder: (the container's environment, mc calls, policies by name, the script's output)."""
    import json

    services = yaml.safe_load(COMPOSE.read_text())["services"]
    service = services["minio-init"]
    assert service["entrypoint"] == ["/bin/sh", "/scripts/minio-init.sh"]
    assert "./scripts/compose:/scripts:ro" in service["volumes"]
    container_env = resolved_environment(service, env)
    bin_dir, policies = tmp_path / "bin", tmp_path / "policies"
    bin_dir.mkdir()
    policies.mkdir()
    (bin_dir / "mc").write_text(MC_STUB)
    (bin_dir / "mc").chmod(0o755)
    log = tmp_path / "mc.log"
    result = subprocess.run(
        ["sh", str(SCRIPTS / "minio-init.sh")], capture_output=True, text=True, timeout=30, check=False,
        env={**container_env, "PATH": f"{bin_dir}:/usr/bin:/bin", "MC_LOG": str(log), "MC_POLICIES": str(policies),
             "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    documents = {f.stem: json.loads(f.read_text()) for f in policies.glob("*.json")}
    return container_env, log.read_text().splitlines(), documents, result.stdout + result.stderr


def test_minio_init_sets_compliance_retention_and_least_privilege(tmp_path: Path) -> None:
    import json

    env = {**env_example(), **random_passwords()}
    container_env, calls, policies, output = run_minio_init(env, tmp_path)
    bucket = container_env["AUDIT_BUCKET"]
    assert f"mb --ignore-existing --with-lock root/{bucket}" in calls
    retention = [c for c in calls if c.startswith("retention set")]
    assert retention == [f"retention set --default compliance {container_env['AUDIT_RETENTION_DAYS']}d root/{bucket}"]

    writer, reader = policies["entroloop-audit-writer"], policies["entroloop-audit-reader"]

    def grants(policy: dict[str, Any]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for statement in policy["Statement"]:
            assert statement["Effect"] == "Allow"
            condition = json.dumps(statement.get("Condition", {}), sort_keys=True)
            for resource in statement["Resource"]:
                out.setdefault(resource, set()).update(
                    f"{a} if {condition}" if statement.get("Condition") else a for a in statement["Action"])
        return out

    bucket_arn, objects_arn = f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"
    compliance_only = json.dumps({"StringEquals": {"s3:object-lock-mode": ["COMPLIANCE"]}}, sort_keys=True)
    assert grants(writer) == {
        bucket_arn: {"s3:ListBucket", "s3:GetBucketObjectLockConfiguration"},
        # PutObjectRetention: MinIO and S3 demand it for a put carrying an Object Lock mode and date;
        # COMPLIANCE only, since in MinIO it alone may shorten a GOVERNANCE retention
        objects_arn: {"s3:PutObject", "s3:GetObject", f"s3:PutObjectRetention if {compliance_only}"},
    }
    assert grants(reader) == {bucket_arn: {"s3:ListBucket"}, objects_arn: {"s3:GetObject"}}

    writer_user, reader_user = container_env["MINIO_AUDIT_WRITER_USER"], container_env["MINIO_AUDIT_READER_USER"]
    assert f"admin policy attach root entroloop-audit-writer --user {writer_user}" in calls
    assert f"admin policy attach root entroloop-audit-reader --user {reader_user}" in calls
    assert any(c.startswith(f"admin user add root {writer_user} ") for c in calls)
    assert writer_user != container_env["MINIO_ROOT_USER"] and reader_user != container_env["MINIO_ROOT_USER"]
    # the script prints no password (its mc calls are not echoed)
    assert not any(env[p] in output for p in PASSWORDS)


def test_grafana_reads_clickhouse_as_a_read_only_user(services: dict[str, dict[str, Any]]) -> None:
    import xml.etree.ElementTree as ET

    datasource = yaml.safe_load((ROOT / "dashboards/provisioning/datasources/clickhouse.yaml").read_text())
    source = datasource["datasources"][0]
    user = source["jsonData"]["username"]
    assert user != "default", "Grafana runs editors' raw SQL: it must not query as `default`"
    password_var = references(source["secureJsonData"]["password"])
    assert password_var == {"CLICKHOUSE_GRAFANA_PASSWORD"}
    grafana_env = environment(services["grafana"])
    assert "CLICKHOUSE_PASSWORD" not in grafana_env, "Grafana must not hold the `default` user's password"

    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["clickhouse"]["volumes"]}
    users_file = ROOT / mounts[f"/etc/clickhouse-server/users.d/{user}.xml"]
    config = ET.parse(users_file).getroot()
    account = config.find(f"users/{user}")
    assert account is not None, f"{users_file} does not define user {user}"
    assert account.find("password").get("from_env") in environment(services["clickhouse"])
    profile = config.find(f"profiles/{account.findtext('profile')}")
    assert profile.findtext("readonly") == "1"
    assert account.findtext("access_management") == "0"
    assert [q.text for q in account.findall("grants/query")] == ["GRANT SELECT ON entroloop.*"]


# --- issue 13 item 5: healthchecks on /metrics, the gateway and vLLM, Kafka for remote nodes -------

METRICS_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/metrics")
# the CLI modules whose long-running commands start entroloop.infra.metrics.serve_metrics
SERVES_METRICS = "serve_metrics(settings.metrics_port)"


def healthcheck_command(service: dict[str, Any]) -> list[str]:
    test = (service.get("healthcheck") or {}).get("test")
    assert isinstance(test, list) and test[0] == "CMD", f"healthcheck must be an exec-form CMD list: {test}"
    return test[1:]


def metrics_port(service: dict[str, Any]) -> int:
    match = METRICS_URL.search(" ".join(healthcheck_command(service)))
    assert match, f"healthcheck does not scrape /metrics: {service.get('healthcheck')}"
    return int(match.group(1))


def test_every_long_running_entroloop_service_is_checked_on_its_metrics_port(
        services: dict[str, dict[str, Any]]) -> None:
    import inspect

    checked = []
    for name, service in entroloop_services(services).items():
        if service.get("restart") == "no":  # one shot (migrate, fleet): no server, no healthcheck
            assert service.get("healthcheck") == {"disable": True}, f"{name}: a one-shot service must disable the healthcheck"
            continue
        env = environment(service)
        command = resolve_command(service["command"])
        port = metrics_port(service)
        if service["command"][0] == "gateway":  # its own route: GET /metrics on the gateway port
            assert port == int(env["ENTROLOOP_GATEWAY_PORT"]), name
            assert env["ENTROLOOP_GATEWAY_HOST"] == "0.0.0.0", "the gateway must listen beyond the container's loopback"
        else:
            assert port == int(env["ENTROLOOP_METRICS_PORT"]) > 0, f"{name}: healthcheck port != ENTROLOOP_METRICS_PORT"
            source = inspect.getsource(inspect.getmodule(command.callback))
            assert SERVES_METRICS in source, f"{name}: `entroloop {' '.join(service['command'])}` serves no /metrics"
        checked.append(name)
    assert {"gateway", "worker", "sink-clickhouse", "sink-audit", "actions", "trainer"} <= set(checked)


def _run_healthcheck(command: list[str], port_from: int, port_to: int) -> subprocess.CompletedProcess[str]:
    program, *args = command
    assert program in ("python", "python3"), "the entroloop image has no curl or wget: use its Python"
    args = [a.replace(f"127.0.0.1:{port_from}/", f"127.0.0.1:{port_to}/") for a in args]
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=30, check=False)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_metrics_healthcheck_passes_on_a_metrics_server_and_fails_without(
        services: dict[str, dict[str, Any]]) -> None:
    """The worker's healthcheck command, run for real: against entroloop's metrics server it exits 0,
    against a closed port it does not (so an unhealthy container is reported)."""
    from prometheus_client import CollectorRegistry

    from entroloop.infra.metrics import serve_metrics

    command = healthcheck_command(services["worker"])
    port = _free_port()
    assert serve_metrics(port, addr="127.0.0.1", registry=CollectorRegistry())
    assert _run_healthcheck(command, 9100, port).returncode == 0
    assert _run_healthcheck(command, 9100, _free_port()).returncode != 0


def test_the_gateway_healthcheck_scrapes_a_real_gateway(services: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """`entroloop gateway` started as compose starts it (API keys set, engine not up yet): its
    healthcheck passes without a key, since /metrics is open and answers while the engine is down."""
    import time

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update({"ENTROLOOP_DATA_DIR": str(tmp_path), "ENTROLOOP_GATEWAY_HOST": "127.0.0.1",
                "ENTROLOOP_GATEWAY_PORT": str(port), "ENTROLOOP_GATEWAY_UPSTREAM": f"http://127.0.0.1:{_free_port()}",
                "ENTROLOOP_GATEWAY_API_KEYS": "acme:0123456789abcdef0123,admin:fedcba9876543210fedc",
                "ENTROLOOP_GATEWAY_ENGINE": "vllm"})
    command = healthcheck_command(services["gateway"])
    gateway = subprocess.Popen([sys.executable, "-m", "entroloop.cli", "gateway", "--log-level", "warning"], cwd=ROOT,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while (result := _run_healthcheck(command, 8080, port)).returncode != 0:
            assert gateway.poll() is None, gateway.stdout.read()[-3000:]
            assert time.monotonic() < deadline, result.stderr[-2000:]
            time.sleep(0.5)
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
    assert _run_healthcheck(command, 8080, port).returncode != 0, "a stopped gateway must fail its healthcheck"


def test_the_gateway_fronts_the_vllm_service_of_either_profile(services: dict[str, dict[str, Any]]) -> None:
    env = {**env_example(), **random_passwords()}
    gateway = resolved_environment(services["gateway"], env)
    assert gateway["ENTROLOOP_GATEWAY_UPSTREAM"] == "http://vllm:8000"
    assert "profiles" not in services["gateway"], "the gateway runs in every profile (or in front of your engine)"
    engines = serving_services(services)
    assert set(engines) == {"vllm-cpu", "vllm-gpu"}
    assert {name: s["profiles"] for name, s in engines.items()} == {"vllm-cpu": ["cpu"], "vllm-gpu": ["gpu"]}
    for name, engine in engines.items():
        assert engine["networks"]["default"]["aliases"] == ["vllm"], f"{name} must answer to the gateway's upstream"
        assert "--port=8000" in engine["command"]
        # the gateway waits for whichever engine runs, and starts without one
        assert services["gateway"]["depends_on"][name] == {"condition": "service_healthy", "required": False}
        check = " ".join(healthcheck_command(engine))
        assert "http://127.0.0.1:8000/health" in check
        resolved = resolved_environment(engine, env)
        assert resolved["ENTROLOOP_KAFKA_BOOTSTRAP"] == "kafka:9092"
        assert resolved["ENTROLOOP_ENTROPY_TAP_ENABLED"] == "true" and resolved["ENTROLOOP_OTEL_SPANS_ENABLED"] == "true"
        assert resolved["ENTROLOOP_NODE_ID"] == name
        assert any(v.endswith(":/var/lib/entroloop") for v in engine["volumes"]), "the publisher's spool needs a volume"
        assert engine["depends_on"]["kafka"] == {"condition": "service_healthy"}
        assert "ENTROLOOP_CLICKHOUSE_PASSWORD" not in resolved and "ENTROLOOP_PII_HASH_KEY" not in resolved, \
            "a serving node holds no store or gateway secret"
    cpu_image = interpolate(services["vllm-cpu"]["build"]["args"]["VLLM_IMAGE"], env)
    gpu_image = interpolate(services["vllm-gpu"]["build"]["args"]["VLLM_IMAGE"], env)
    assert cpu_image.startswith("vllm/vllm-openai-cpu:v") and gpu_image.startswith("vllm/vllm-openai:v")
    assert "VLLM_CPU_KVCACHE_SPACE" in environment(services["vllm-cpu"])
    (device,) = services["vllm-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    # the action runner calls the gateway's admin API
    assert resolved_environment(services["actions"], env)["ENTROLOOP_ACTIONS_GATEWAY_URL"] == "http://gateway:8080"


def test_the_serving_image_is_vllms_with_the_slim_install() -> None:
    text = (ROOT / "Dockerfile.serving").read_text()
    code = re.sub(r"(?m)^\s*#.*$", "", text)
    default = re.search(r"^ARG VLLM_IMAGE=(\S+)$", code, re.M)
    assert default and default.group(1).startswith("vllm/vllm-openai:v")
    assert re.search(r"^FROM \$\{VLLM_IMAGE\}$", code, re.M)
    assert '"/tmp/entroloop-src[serving]"' in code and "store" not in code
    assert "-c /tmp/base-constraints.txt" in code, "the install must not move vLLM's own packages"
    for forbidden in ("chdb", "pyarrow", "pandas", "clickhouse-connect"):
        assert forbidden in code, f"the build must refuse {forbidden} among the added packages"
    assert "vllm.logits_processors" in code and "vllm.general_plugins" in code
    assert not re.search(r"^(ENTRYPOINT|CMD)\b", code, re.M), "keep vLLM's own ENTRYPOINT (vllm serve)"


def test_kafka_advertises_a_configurable_address(services: dict[str, dict[str, Any]]) -> None:
    kafka = services["kafka"]
    env = {**env_example(), **random_passwords()}

    def listeners(values: dict[str, str]) -> tuple[str, list[str]]:
        advertised = interpolate(kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"], values)
        ports = [interpolate(p, values) for p in kafka["ports"]]
        return advertised, ports

    advertised, ports = listeners(env)
    assert advertised == "INTERNAL://kafka:9092,EXTERNAL://localhost:9094"
    assert ports == ["127.0.0.1:9094:9094"], "by default only tools on this host reach Kafka"
    advertised, ports = listeners({k: v for k, v in env.items() if not k.startswith("KAFKA_")})
    assert advertised.endswith("EXTERNAL://localhost:9094") and ports == ["127.0.0.1:9094:9094"], "defaults without .env"
    remote = {**env, "KAFKA_ADVERTISED_HOST": "kafka.example.internal", "KAFKA_BIND_ADDRESS": "0.0.0.0"}
    advertised, ports = listeners(remote)
    assert advertised == "INTERNAL://kafka:9092,EXTERNAL://kafka.example.internal:9094"
    assert ports == ["0.0.0.0:9094:9094"]
    assert "EXTERNAL://0.0.0.0:9094" in kafka["environment"]["KAFKA_LISTENERS"]

    # check-secrets refuses a remote advertised host the loopback binding would make unreachable
    secrets = random_passwords()
    mismatch = run_check_secrets(services, {**secrets, "KAFKA_ADVERTISED_HOST": "10.1.2.3"})
    assert mismatch.returncode != 0
    assert "KAFKA_ADVERTISED_HOST is 10.1.2.3 but KAFKA_BIND_ADDRESS is 127.0.0.1" in mismatch.stderr
    assert "KAFKA_BIND_ADDRESS=0.0.0.0" in mismatch.stderr
    ok = run_check_secrets(services, {**secrets, "KAFKA_ADVERTISED_HOST": "10.1.2.3", "KAFKA_BIND_ADDRESS": "0.0.0.0"})
    assert ok.returncode == 0, ok.stderr


def test_grafana_and_clickhouse_agree_on_the_read_only_user(services: dict[str, dict[str, Any]]) -> None:
    """The datasource's user, password variable and database are those the users.d file defines,
    grants and reads the password of; both containers get the password from one compose variable."""
    import xml.etree.ElementTree as ET

    source = yaml.safe_load((ROOT / "dashboards/provisioning/datasources/clickhouse.yaml").read_text())["datasources"][0]
    user = source["jsonData"]["username"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["clickhouse"]["volumes"]}
    config = ET.parse(ROOT / mounts[f"/etc/clickhouse-server/users.d/{user}.xml"]).getroot()
    account = config.find(f"users/{user}")
    password_env = account.find("password").get("from_env")
    (grafana_var,) = references(source["secureJsonData"]["password"])
    assert references(environment(services["clickhouse"])[password_env]) == \
        references(environment(services["grafana"])[grafana_var]) == {"CLICKHOUSE_GRAFANA_PASSWORD"}
    database = source["jsonData"]["defaultDatabase"]
    assert [q.text for q in account.findall("grants/query")] == [f"GRANT SELECT ON {database}.*"]
    for name, service in entroloop_services(services).items():
        assert environment(service)["ENTROLOOP_CLICKHOUSE_DATABASE"] == database, name
    assert config.findtext(f"profiles/{account.findtext('profile')}/readonly") == "1"
