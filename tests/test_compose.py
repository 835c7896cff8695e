"""docker-compose.yml and Dockerfile: valid for Compose, and carrying what docs/spec.md §5 asks of them.

There is no container engine on the development machines or in CI, so the file is read with PyYAML (a test
dependency) and checked here the way Compose would resolve it: every service, profile, dependency, health
check, port, volume and environment variable. Compose's own `docker-compose config` validates it too, with
every profile on: `make test` installs Debian's docker-compose for it (`make compose`), and a missing one
fails that test rather than skipping it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from rollout_stream.cli import app

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
README = ROOT / "README.md"
COMPOSE_BIN = shutil.which("docker-compose")

DEFAULT_SERVICES = {"kafka", "topics", "worker"}  # `docker compose up`
CLUSTER_BROKERS = ("kafka-1", "kafka-2", "kafka-3")
PROFILES = {"synth": {"synth"}, "observability": {"prometheus", "grafana"},
            "cluster": {*CLUSTER_BROKERS, "topics-cluster", "worker-cluster"}}
LONG_RUNNING = {"kafka", "worker", "prometheus", "grafana", *CLUSTER_BROKERS, "worker-cluster"}
ONE_SHOT = {"topics", "synth", "topics-cluster"}  # run to completion once
BROKERS = {"kafka", *CLUSTER_BROKERS}
WORKERS = {"worker", "worker-cluster"}
# The worker whose settings each service built here shares (its own profile's), and the bootstrap it uses.
WORKER_OF = {"topics": "worker", "worker": "worker", "synth": "worker",
             "topics-cluster": "worker-cluster", "worker-cluster": "worker-cluster"}
DEPENDENCY_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
RESTART_POLICIES = {"no", "always", "on-failure", "unless-stopped"}
DURATION = re.compile(r"^(\d+(\.\d+)?(us|ms|s|m|h))+$")

MODEL: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())  # anchors and `<<` merges resolved
SERVICES: dict[str, dict[str, Any]] = MODEL["services"]


def services_of(profile: str | None) -> set[str]:
    return {name for name, s in SERVICES.items() if (profile in s.get("profiles", [])
                                                      if profile else not s.get("profiles"))}


def cli_command(argv: list[str]) -> Any:
    """The click command a service's `command:` runs (e.g. ["rollout-stream", "topics", "create", ...])."""
    assert argv[0] == "rollout-stream", argv
    command: Any = typer.main.get_command(app)
    for word in argv[1:]:
        if not hasattr(command, "commands") or word not in command.commands:
            break
        command = command.commands[word]
    assert not hasattr(command, "commands"), f"{argv} names a command group, not a command"
    return command


def envvars_read_by(command: Any) -> set[str]:
    names: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None)
        names.update([envvar] if isinstance(envvar, str) else envvar or [])
    return names


def readme_envvars() -> set[str]:
    """Environment variables the run table names, with its `…_SUFFIX` shorthand for ROLLOUT_STREAM_SUFFIX."""
    text = (ROOT / "docs" / "operations.md").read_text()
    names = set(re.findall(r"`((?:ROLLOUT_STREAM|KAFKA)_[A-Z0-9_]+)`", text))
    names |= {f"ROLLOUT_STREAM_{suffix}" for suffix in re.findall(r"`…_([A-Z0-9_]+)`", text)}
    return names


def dependencies_of(name: str) -> set[str]:
    """Every service `name` waits for, directly or through another."""
    found: set[str] = set()
    todo = list(SERVICES[name].get("depends_on", {}))
    while todo:
        dependency = todo.pop()
        if dependency not in found:
            found.add(dependency)
            todo += list(SERVICES[dependency].get("depends_on", {}))
    return found


def built_here(service: dict[str, Any]) -> bool:
    return service.get("build") == "."


def port_pairs(service: dict[str, Any]) -> list[tuple[int, int]]:
    pairs = []
    for spec in service.get("ports", []):
        host, container = str(spec).split(":")
        pairs.append((int(host), int(container)))
    return pairs


# ---- the file as a whole ------------------------------------------------------------------------------
def docker_compose_services() -> set[str]:
    """The services `docker-compose config` lists with every profile on, after its own validation."""
    args = [COMPOSE_BIN, "-f", str(COMPOSE), *[a for p in PROFILES for a in ("--profile", p)]]
    result = subprocess.run([*args, "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    listed = subprocess.run([*args, "config", "--services"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    return set(listed.stdout.split())


SERVICE_KEYS = {  # the Compose specification's service attributes this project may use
    "build", "image", "command", "entrypoint", "environment", "env_file", "ports", "volumes",
    "depends_on", "healthcheck", "restart", "profiles", "hostname", "stop_grace_period", "stop_signal",
    "labels", "networks", "user", "working_dir", "ulimits", "mem_limit", "cpus", "logging", "init", "tmpfs",
    "expose", "deploy",
}


def test_top_level_and_service_keys_are_compose_keys_or_extension_fields():
    allowed = {"services", "volumes", "networks", "configs", "secrets", "name"}
    assert {k for k in MODEL if not k.startswith("x-")} <= allowed, MODEL.keys()
    for name, service in SERVICES.items():  # a misspelt key (`heathcheck:`) is otherwise silently ignored
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        for key in ("environment", "depends_on"):
            assert isinstance(service.get(key, {}), dict), (name, key)  # the mapping form, checked below


def test_services_and_profiles():
    assert services_of(None) == DEFAULT_SERVICES
    for profile, members in PROFILES.items():
        assert services_of(profile) == members, profile
    assert set(SERVICES) == DEFAULT_SERVICES.union(*PROFILES.values())
    header = COMPOSE.read_text().split("\n\n", 1)[0]
    readme = README.read_text()
    for profile in PROFILES:  # every profile is documented where a user looks for how to start it
        assert f"--profile {profile}" in header, profile
        assert f"--profile {profile}" in readme, profile


def test_docker_compose_config_accepts_every_profile():
    """Compose's own validation (its schema, merges, profiles, dependency conditions) of the whole file."""
    if COMPOSE_BIN is None:
        pytest.fail("docker-compose is not installed: `make compose` installs Debian's package (make test "
                    "does)" + (" -- CI runs this check, it never skips" if os.environ.get("CI") else ""))
    assert docker_compose_services() == set(SERVICES)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_pinned_image_a_command_form_and_a_restart_policy(name):
    service = SERVICES[name]
    image = service.get("image")
    assert image, f"{name}: no image"
    if built_here(service):
        assert image == "rollout-stream:local", name  # built once from the Dockerfile, shared
        assert isinstance(service["command"], list) and service["command"][0] == "rollout-stream", name
    else:
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest" and re.search(r"\d", tag), f"{name}: unpinned {image}"
    for key in ("command", "entrypoint"):
        if key in service:
            assert isinstance(service[key], list), (name, key)
            assert all(isinstance(a, str) for a in service[key]), (name, key)
    assert service.get("restart") in RESTART_POLICIES, name
    expected = "unless-stopped" if name in LONG_RUNNING else "no"
    assert service["restart"] == expected, name
    assert set(service.get("profiles", [])) <= set(PROFILES), name


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_dependencies_exist_and_their_conditions_can_be_met(name):
    service = SERVICES[name]
    for dependency, spec in service.get("depends_on", {}).items():
        assert dependency in SERVICES, (name, dependency)
        condition = spec["condition"]
        assert condition in DEPENDENCY_CONDITIONS, (name, dependency, condition)
        if condition == "service_healthy":
            assert "healthcheck" in SERVICES[dependency], f"{name} waits for {dependency}'s health: no check"
        if condition == "service_completed_successfully":
            assert dependency in ONE_SHOT, f"{name} waits for {dependency} to complete: it runs forever"
        # A service started without profiles cannot wait for one that only a profile starts.
        if not service.get("profiles"):
            assert not SERVICES[dependency].get("profiles"), (name, dependency)


@pytest.mark.parametrize("name", sorted(LONG_RUNNING))
def test_every_long_running_service_has_a_health_check_that_asks_its_own_port(name):
    check = SERVICES[name]["healthcheck"]
    test = check["test"]
    assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, (name, test)
    for key in ("interval", "timeout", "start_period"):
        assert DURATION.match(str(check[key])), (name, key, check[key])
    assert isinstance(check["retries"], int) and check["retries"] >= 1, name
    command = " ".join(test[1:])
    ports = {int(p) for p in re.findall(r"(?:localhost|127\.0\.0\.1):(\d+)", command)}
    assert len(ports) == 1, (name, command)
    port = ports.pop()
    if name in BROKERS:
        listeners = SERVICES[name]["environment"]["KAFKA_LISTENERS"]
        assert f"PLAINTEXT://:{port}" in listeners, (port, listeners)
    elif name in WORKERS:
        assert int(SERVICES[name]["environment"]["ROLLOUT_STREAM_METRICS_PORT"]) == port
        replicas = SERVICES[name].get("deploy", {}).get("replicas", 1)
        # one replica publishes its metrics port; several cannot share the host's (Prometheus asks each)
        assert ((port, port) in port_pairs(SERVICES[name])) == (replicas == 1), name
        assert "/healthz" in command
    else:
        assert (port, port) in port_pairs(SERVICES[name]), (name, port)


def test_published_ports_do_not_collide_and_volumes_are_declared_or_in_the_repository():
    host_ports = [host for s in SERVICES.values() for host, _ in port_pairs(s)]
    assert len(host_ports) == len(set(host_ports)), host_ports
    declared = set(MODEL.get("volumes") or {})
    used = set()
    for name, service in SERVICES.items():
        for spec in service.get("volumes", []):
            source, target, *mode = spec.split(":")
            assert target.startswith("/"), (name, spec)
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
                assert mode == ["ro"], f"{name}: mount {source} read-only"
            else:
                assert source in declared, (name, source)
                used.add(source)
    assert used == declared, declared - used


# ---- environment variables ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(n for n, s in SERVICES.items() if built_here(s)))
def test_the_stage_environment_is_read_by_the_worker_documented_and_shared(name):
    """Every variable given to a rollout-stream container is an option of `run` (so the worker's settings
    are the stack's settings), documented in docs/operations.md (run table), overridable from the host under
    its own name. Where another command reads it too (topic names for `topics create` and `synth`), it gets
    the worker's value."""
    env = SERVICES[name]["environment"]
    run_reads = envvars_read_by(cli_command(["rollout-stream", "run"]))
    command_reads = envvars_read_by(cli_command(SERVICES[name]["command"]))
    documented = readme_envvars()
    worker = WORKER_OF[name]
    worker_env = SERVICES[worker]["environment"]
    for var, value in env.items():
        assert var in run_reads, f"{name}: {var} is not an option of `rollout-stream run`"
        assert var in documented, f"{name}: {var} is not in the README"
        if isinstance(value, str) and value.startswith("${"):
            assert re.fullmatch(rf"\$\{{{var}(:-[^}}]*)?\}}", value), f"{name}: {var} reads another variable"
        if var in command_reads:
            assert value == worker_env.get(var), f"{name} and the worker disagree on {var}"
    if name != worker:
        assert set(env) <= set(worker_env), set(env) - set(worker_env)
    brokers = ["kafka"] if worker == "worker" else list(CLUSTER_BROKERS)
    assert env.get("KAFKA_BOOTSTRAP_SERVERS") == ",".join(f"{b}:9092" for b in brokers), name
    assert dependencies_of(name) >= set(brokers), name  # waits (at least indirectly) for the brokers it names


@pytest.mark.parametrize("name", sorted(BROKERS))
def test_the_kafka_listeners_agree_with_each_other_and_the_published_port(name):
    env = SERVICES[name]["environment"]
    listeners = dict(re.findall(r"(\w+)://[^:,]*:(\d+)", env["KAFKA_LISTENERS"]))
    advertised = dict(re.findall(r"(\w+)://([^,]+)", env["KAFKA_ADVERTISED_LISTENERS"]))
    protocols = dict(pair.split(":") for pair in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) <= set(protocols), (listeners, protocols)
    assert set(advertised) <= set(listeners) - {env["KAFKA_CONTROLLER_LISTENER_NAMES"]}
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    voters = dict(v.split("@") for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","))
    assert voters[str(env["KAFKA_NODE_ID"])] == f"{SERVICES[name]['hostname']}:{listeners['CONTROLLER']}"
    assert advertised["PLAINTEXT"] == f"{SERVICES[name]['hostname']}:{listeners['PLAINTEXT']}"
    [(host_port, container_port)] = port_pairs(SERVICES[name])
    assert container_port == int(listeners["EXTERNAL"])
    assert advertised["EXTERNAL"] == f"localhost:{host_port}"  # what the header comment tells the host
    assert f"localhost:{host_port}" in COMPOSE.read_text().split("\n\n", 1)[0] or name != "kafka"
    worker = "worker" if name == "kafka" else "worker-cluster"
    assert advertised["PLAINTEXT"] in SERVICES[worker]["environment"]["KAFKA_BOOTSTRAP_SERVERS"].split(",")


def test_the_cluster_profile_is_three_voters_with_three_replicas_two_in_sync_and_two_workers():
    envs = [SERVICES[b]["environment"] for b in CLUSTER_BROKERS]
    assert sorted(int(e["KAFKA_NODE_ID"]) for e in envs) == [1, 2, 3]
    for key in ("CLUSTER_ID", "KAFKA_CONTROLLER_QUORUM_VOTERS", "KAFKA_PROCESS_ROLES"):
        assert len({str(e[key]) for e in envs}) == 1, key  # one cluster, one quorum, every node a voter
    assert len(envs[0]["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")) == 3
    for env in envs:
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        for key in ("DEFAULT_REPLICATION_FACTOR", "OFFSETS_TOPIC_REPLICATION_FACTOR",
                    "TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
            assert int(env[f"KAFKA_{key}"]) == 3, key
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) == 2
        assert int(env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == 2
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
    topics = SERVICES["topics-cluster"]["command"]
    assert topics[:3] == ["rollout-stream", "topics", "create"]
    assert topics[topics.index("--replication-factor") + 1] == "3"
    assert topics[topics.index("--min-insync-replicas") + 1] == "2"
    assert SERVICES["worker-cluster"]["deploy"]["replicas"] == 2
    assert SERVICES["worker-cluster"]["command"] == ["rollout-stream", "run"]
    assert "ROLLOUT_STREAM_INSTANCE_ID" not in SERVICES["worker-cluster"]["environment"]  # one id per replica


# ---- the observability profile ------------------------------------------------------------------------
def _mount(service: str, repo_dir: str) -> str:
    """Where `service` mounts the repository directory `repo_dir`."""
    for spec in SERVICES[service]["volumes"]:
        source, target, *_ = spec.split(":")
        if source == f"./{repo_dir}":
            return target
    raise AssertionError(f"{service} does not mount ./{repo_dir}")


def test_prometheus_scrapes_the_worker_and_loads_the_rules_it_is_given():
    config_dir = _mount("prometheus", "deploy/prometheus")
    command = SERVICES["prometheus"]["command"]
    assert f"--config.file={config_dir}/prometheus.yml" in command
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    for rule_file in config["rule_files"]:
        assert (ROOT / "deploy/prometheus" / rule_file).is_file(), rule_file
    [job] = config["scrape_configs"]
    assert job["job_name"] == "rollout-stream"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    metrics_port = SERVICES["worker"]["environment"]["ROLLOUT_STREAM_METRICS_PORT"]
    assert targets == [f"worker:{metrics_port}"]


def test_grafana_reads_the_provisioned_prometheus_and_the_dashboard_directory():
    provisioning = _mount("grafana", "deploy/grafana/provisioning")
    dashboards = _mount("grafana", "deploy/grafana/dashboards")
    assert provisioning == "/etc/grafana/provisioning"  # where Grafana looks
    datasources = ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml"
    [source] = yaml.safe_load(datasources.read_text())["datasources"]
    prometheus_port = port_pairs(SERVICES["prometheus"])[0][1]
    assert source["url"] == f"http://prometheus:{prometheus_port}" and source["type"] == "prometheus"
    providers = ROOT / "deploy/grafana/provisioning/dashboards/rollout-stream.yml"
    [provider] = yaml.safe_load(providers.read_text())["providers"]
    assert provider["options"]["path"] == dashboards
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dashboards + "/")
    assert (ROOT / "deploy/grafana/dashboards" / home.removeprefix(dashboards + "/")).is_file()


# ---- text docs/spec.md §5 asks for (unchanged since the first compose file) ---------------------------
def test_compose_pins_a_single_node_kraft_broker_fit_for_transactions_and_large_records():
    text = COMPOSE.read_text()
    for needle in [
        "image: apache/kafka:4.1.1",
        "KAFKA_PROCESS_ROLES: broker,controller",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR: 1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR: 1",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR: 1",
        "KAFKA_MESSAGE_MAX_BYTES: 67108864",
        "/opt/kafka/bin/kafka-broker-api-versions.sh",
    ]:
        assert needle in text, needle


def test_compose_runs_topics_once_then_a_restarting_worker_with_a_liveness_check():
    assert SERVICES["topics"]["command"][:3] == ["rollout-stream", "topics", "create"]
    assert SERVICES["worker"]["command"] == ["rollout-stream", "run"]
    assert SERVICES["worker"]["depends_on"] == {"kafka": {"condition": "service_healthy"},
                                                "topics": {"condition": "service_completed_successfully"}}
    assert SERVICES["worker"]["stop_grace_period"] == "30s"
    synth = SERVICES["synth"]["command"]
    assert synth[:2] == ["rollout-stream", "synth"] and synth[synth.index("--groups") + 1] == "1000"
    assert "rollout-stream health" not in COMPOSE.read_text()  # the liveness check asks /healthz


def test_dockerfile_installs_the_package_on_python_311_with_cpu_torch():
    text = DOCKERFILE.read_text()
    assert "FROM python:3.11-slim AS base" in text
    assert "https://download.pytorch.org/whl/cpu" in text
    for package in ("core", "codec", "stream"):
        assert f"COPY {package} ./{package}" in text
    assert "pip install" in text and "rollout-stream --help" in text


def test_the_image_runs_the_c_extensions_built_in_a_stage_of_its_own():
    """The worker in compose runs what the benchmarks measured: the package's wheel with its C extensions,
    built with a compiler that does not reach the image, and checked to be in use there."""
    stages = re.split(r"^FROM ", DOCKERFILE.read_text(), flags=re.M)[1:]
    assert [s.split("\n", 1)[0] for s in stages] == ["python:3.11-slim AS base", "base AS build", "base"]
    build, image = stages[1], stages[2]
    assert "apt-get install -y --no-install-recommends gcc" in build
    assert "COPY pyproject.toml setup.py" in build and "pip wheel --no-deps --wheel-dir /wheels ." in build
    assert "COPY --from=build /wheels /wheels" in image and "pip install" in image
    assert "/wheels/*.whl" in image
    assert 'compiled.status().describe())" | grep -x "C extensions"' in image and "gcc" not in image
    assert image.index("COPY --from=build") < image.index("USER rollout")
