"""The Kubernetes manifests (deploy/kubernetes): valid against the Kubernetes API schemas, and
holding what a broker needs from its pod, checked on every overlay without a cluster.

The overlays are rendered here by a loader that knows the three kustomization fields they use
(``resources``, ``replicas``, ``images``) and refuses any other, so a new field cannot be
silently ignored; where kubectl is installed, its ``kubectl kustomize`` must render the same.
``manifest_problems`` names every broken invariant; the mutation tests show it names a shared
spool volume and a mesh port opened to everyone.
"""

from __future__ import annotations

import copy
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from sanic.config import DEFAULT_CONFIG

from broker.core.config import VARIABLES, load_settings

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBE / "overlays").iterdir() if p.is_dir())
# The oldest Kubernetes release still common in managed clusters, and the newest schemas the
# library ships: the manifests must be valid for both.
KUBE_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())

Doc = dict[str, Any]

# Not a broker variable: the statefulset's start line reads it to build QUEEN_MESH_PEERS.
WRAPPER_VARIABLES = {"MESH_MEMBERS"}


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------

KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "replicas", "images"}


def render(directory: Path) -> list[Doc]:
    """The documents ``kubectl kustomize directory`` prints, for the fields the overlays use."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KUSTOMIZATION_FIELDS
    assert not unknown, f"{directory}: the test's renderer does not know {sorted(unknown)}"
    docs: list[Doc] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            docs.extend(render(path))
        else:
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for rule in kustomization.get("replicas", []):
        targets = [d for d in docs if d["metadata"]["name"] == rule["name"]
                   and "replicas" in d.get("spec", {})]
        assert targets, f"{directory}: replicas names {rule['name']}, which is not rendered"
        for doc in targets:
            doc["spec"]["replicas"] = rule["count"]
    for rule in kustomization.get("images", []):
        for container in _all_containers(docs):
            name, _, tag = container["image"].partition(":")
            if name == rule["name"]:
                container["image"] = (f"{rule.get('newName', name)}:"
                                      f"{rule.get('newTag', tag or 'latest')}")
    return docs


def _all_containers(docs: list[Doc]) -> list[Doc]:
    return [c for d in docs if d["kind"] == "StatefulSet"
            for c in d["spec"]["template"]["spec"]["containers"]]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, list[Doc]]:
    return request.param, render(KUBE / "overlays" / request.param)


# --------------------------------------------------------------------------------------------
# The invariants
# --------------------------------------------------------------------------------------------

def _one(docs: list[Doc], kind: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _selects(match_labels: dict[str, str] | None, labels: dict[str, str]) -> bool:
    return bool(match_labels) and all(labels.get(k) == v for k, v in match_labels.items())


def _env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def _port_number(container: Doc, port: int | str) -> int | None:
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    return None


def manifest_problems(docs: list[Doc]) -> list[str]:
    """Every invariant the rendered manifests break, in words; empty when all hold."""
    problems: list[str] = []
    sts = _one(docs, "StatefulSet")
    pod = sts["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    spec = pod["spec"]
    broker = spec["containers"][0]
    env = _env(broker)
    replicas = sts["spec"]["replicas"]
    if not 1 <= replicas <= 3:
        problems.append(f"replicas {replicas}: the mesh is designed for one to three brokers")

    # Each broker pod has a spool volume of its own: FILE_BUFFER_DIR is mounted from a
    # volumeClaimTemplate (one claim per pod), never from a claim or host path all pods share.
    spool_dir = env.get("FILE_BUFFER_DIR", {}).get("value")
    mounts = {m["mountPath"]: m["name"] for m in broker.get("volumeMounts", [])}
    templates = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    pod_volumes = {v["name"]: v for v in spec.get("volumes", [])}
    if spool_dir is None:
        problems.append("FILE_BUFFER_DIR is not set to a path in the container")
    elif spool_dir not in mounts:
        problems.append(f"FILE_BUFFER_DIR {spool_dir} is not a mounted volume")
    elif mounts[spool_dir] not in templates:
        problems.append(f"FILE_BUFFER_DIR {spool_dir} is on volume {mounts[spool_dir]!r}, "
                        "not on a volumeClaimTemplate: the pods would share one spool")
    for name, volume in pod_volumes.items():
        if "persistentVolumeClaim" in volume or "hostPath" in volume:
            problems.append(f"pod volume {name!r} is one claim or host path for every pod")

    # The server id is the pod's stable name.
    field_path = env.get("QUEEN_SERVER_ID", {}).get("valueFrom", {}).get("fieldRef", {})
    if field_path.get("fieldPath") != "metadata.name":
        problems.append("QUEEN_SERVER_ID does not come from the pod's name (metadata.name)")

    # Secrets come from the Secret defined here, by keys it has.
    secrets = {d["metadata"]["name"]: {**d.get("data", {}), **d.get("stringData", {})}
               for d in docs if d["kind"] == "Secret"}
    for name in ("QUEEN_SYNC_SECRET", "PG_PASSWORD"):
        if "secretKeyRef" not in env.get(name, {}).get("valueFrom", {}):
            problems.append(f"{name} is not read from a Secret")
    config_maps = {d["metadata"]["name"]: d.get("data", {})
                   for d in docs if d["kind"] == "ConfigMap"}
    for name, entry in env.items():
        source = entry.get("valueFrom", {})
        for ref_kind, defined in (("secretKeyRef", secrets), ("configMapKeyRef", config_maps)):
            if ref_kind in source:
                ref = source[ref_kind]
                if ref["name"] not in defined:
                    problems.append(f"{name}: {ref_kind} names {ref['name']!r}, not defined")
                elif ref["key"] not in defined[ref["name"]]:
                    problems.append(f"{name}: {ref['name']!r} has no key {ref['key']!r}")
    for source in broker.get("envFrom", []):
        if source.get("configMapRef", {}).get("name") not in config_maps:
            problems.append(f"envFrom names an undefined ConfigMap: {source}")

    # Probes: readiness on /health/ready, liveness (and startup) on /health/live.
    for probe, path in (("readinessProbe", "/health/ready"), ("livenessProbe", "/health/live"),
                        ("startupProbe", "/health/live")):
        got = broker.get(probe, {}).get("httpGet", {})
        if got.get("path") != path or _port_number(broker, got.get("port", "")) != 6632:
            problems.append(f"{probe} is not GET {path} on the HTTP port")

    # The graceful stop fits in the grace period: preStop, then Sanic's graceful stop for the
    # requests in flight, then some seconds for the subsystems (the spool's last sync).
    pre_stop = broker.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_stop_s = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
    needed = pre_stop_s + DEFAULT_CONFIG["GRACEFUL_SHUTDOWN_TIMEOUT"] + 10
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < needed:
        problems.append(f"terminationGracePeriodSeconds {grace} < {needed:g} s needed to stop")
    if not spec.get("securityContext", {}).get("runAsNonRoot"):
        problems.append("the pod may run as root")

    # Services select the broker pods; the headless one is the StatefulSet's.
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    headless = services.get(sts["spec"]["serviceName"])
    if headless is None or headless["spec"].get("clusterIP") != "None":
        problems.append("the StatefulSet's serviceName is not a headless Service")
    for name, service in services.items():
        if not _selects(service["spec"].get("selector"), pod_labels):
            problems.append(f"Service {name} does not select the broker pods")
    if not any(p["port"] == 6632 for s in services.values() for p in s["spec"]["ports"]):
        problems.append("no Service for the HTTP API (6632)")

    # The mesh: every pod of the set, by its stable DNS name, on the mesh port.
    mesh_port = _port_number(broker, "mesh")
    port_var = env.get("QUEEN_MESH_PORT", {}).get("value")
    if mesh_port is None or str(mesh_port) != port_var:
        problems.append(f"container port 'mesh' {mesh_port} is not QUEEN_MESH_PORT {port_var}")
    ref = env.get("MESH_MEMBERS", {}).get("valueFrom", {}).get("configMapKeyRef", {})
    members = config_maps.get(ref.get("name"), {}).get(ref.get("key"), "")
    expected = [f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}:{mesh_port}"
                for i in range(replicas)]
    if members.split(",") != expected:
        problems.append(f"MESH_MEMBERS {members!r} is not the {replicas} pod(s) {expected}")

    # The NetworkPolicy: covers the broker pods; the mesh port only from them; HTTP from all.
    policy = _one(docs, "NetworkPolicy")
    if not _selects(policy["spec"].get("podSelector", {}).get("matchLabels"), pod_labels):
        problems.append("the NetworkPolicy does not select the broker pods")
    mesh_rules = http_open = 0
    for rule in policy["spec"].get("ingress", []):
        ports = [_port_number(broker, p["port"]) for p in rule.get("ports", [])]
        everyone = not rule.get("from")
        if not rule.get("ports") or mesh_port in ports:
            mesh_rules += bool(rule.get("ports"))
            if everyone:
                problems.append("the NetworkPolicy admits the mesh port from everyone")
            for peer in rule.get("from", []):
                if set(peer) != {"podSelector"} or not _selects(
                        peer["podSelector"].get("matchLabels"), pod_labels) or (
                        peer["podSelector"]["matchLabels"] != policy["spec"]["podSelector"][
                            "matchLabels"]):
                    problems.append(f"the mesh port admits more than the broker pods: {peer}")
        if everyone and 6632 in ports:
            http_open += 1
    if not mesh_rules:
        problems.append("no NetworkPolicy rule names the mesh port")
    if not http_open:
        problems.append("the NetworkPolicy does not admit the HTTP port from everyone")

    # The PodDisruptionBudget covers the broker pods.
    if not _selects(_one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
                    pod_labels):
        problems.append("the PodDisruptionBudget does not select the broker pods")
    return problems


# --------------------------------------------------------------------------------------------
# Tests on the manifests as shipped
# --------------------------------------------------------------------------------------------

def test_there_are_overlays_for_one_two_and_three_brokers():
    replicas = sorted(_one(render(KUBE / "overlays" / o), "StatefulSet")["spec"]["replicas"]
                      for o in OVERLAYS)
    assert replicas == [1, 2, 3]


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(overlay, version):
    _, docs = overlay
    for doc in docs:
        # strict: a misspelt or misplaced field is an error, not silently dropped by the API.
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_rejects_a_misplaced_field(overlay):
    # Guards the test above: the library really checks the documents it is given.
    _, docs = overlay
    broken = copy.deepcopy(_one(docs, "StatefulSet"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[-1], strict=True)


def test_every_invariant_holds(overlay):
    _, docs = overlay
    assert manifest_problems(docs) == []


def test_the_container_environment_is_a_valid_broker_configuration(overlay, tmp_path):
    """Every variable the pod sets is one the broker declares, and load_settings takes the
    environment the pod would get (secrets filled in, the pod's name as its server id)."""
    _, docs = overlay
    broker = _all_containers(docs)[0]
    config_maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    declared = {v.name for v in VARIABLES}
    environ: dict[str, str] = {}
    for source in broker["envFrom"]:
        environ.update(config_maps[source["configMapRef"]["name"]])
    for entry in broker["env"]:
        source = entry.get("valueFrom", {})
        if "fieldRef" in source:
            environ[entry["name"]] = "queen-broker-0"
        elif "secretKeyRef" in source:
            environ[entry["name"]] = "0123456789abcdef"
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            environ[entry["name"]] = config_maps[ref["name"]][ref["key"]]
        else:  # Kubernetes expands $(VAR) from the variables defined before it
            value = entry["value"]
            for name, known in environ.items():
                value = value.replace(f"$({name})", known)
            environ[entry["name"]] = value
    assert set(environ) - declared - WRAPPER_VARIABLES == set()
    environ["QUEEN_MESH_PEERS"] = _peers_seen_by(broker, environ, tmp_path)
    settings = load_settings(environ)
    assert settings.queen_server_id == "queen-broker-0"
    assert str(settings.file_buffer_dir) == environ["FILE_BUFFER_DIR"]
    assert settings.queen_advertise_url == "http://queen-broker-0.queen-broker-mesh:6632"


def _peers_seen_by(container: Doc, environ: dict[str, str], bin_dir: Path) -> str:
    """QUEEN_MESH_PEERS as the container's start line computes it, run by /bin/sh with a
    stand-in queen-broker (in bin_dir) that prints it."""
    stand_in = bin_dir / "queen-broker"
    stand_in.write_text('#!/bin/sh\nprintf %s "$QUEEN_MESH_PEERS"\n')
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    assert container["command"] == ["/bin/sh", "-c"]
    out = subprocess.run(
        ["/bin/sh", "-c", container["args"][0]], capture_output=True, text=True, check=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", **environ}, timeout=10)
    return out.stdout


def test_each_pod_dials_every_other_broker_and_not_itself(overlay, tmp_path):
    _, docs = overlay
    sts = _one(docs, "StatefulSet")
    broker = _all_containers(docs)[0]
    ref = _env(broker)["MESH_MEMBERS"]["valueFrom"]["configMapKeyRef"]
    members = next(d for d in docs if d["kind"] == "ConfigMap"
                   and d["metadata"]["name"] == ref["name"])["data"][ref["key"]]
    for i in range(sts["spec"]["replicas"]):
        pod = f"queen-broker-{i}"
        peers = _peers_seen_by(broker, {"MESH_MEMBERS": members, "QUEEN_SERVER_ID": pod},
                               tmp_path)
        others = [m for m in members.split(",") if not m.startswith(f"{pod}.")]
        assert (peers.split(",") if peers else []) == others, pod
        assert len(others) == sts["spec"]["replicas"] - 1


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_what_the_test_checks(overlay):
    name, docs = overlay
    out = subprocess.run(["kubectl", "kustomize", str(KUBE / "overlays" / name)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    rendered = [d for d in yaml.safe_load_all(out) if d]

    def key(doc: Doc) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]
    # kubectl drops empty stringData values' quotes and sorts keys: compare as data.
    assert sorted(rendered, key=key) == sorted(docs, key=key)


# --------------------------------------------------------------------------------------------
# The checker catches what it must (a loaded copy, broken on purpose)
# --------------------------------------------------------------------------------------------

def _pod_spec(docs: list[Doc]) -> Doc:
    return _one(docs, "StatefulSet")["spec"]["template"]["spec"]


def _share_the_spool(docs: list[Doc]) -> None:
    _one(docs, "StatefulSet")["spec"].pop("volumeClaimTemplates")
    _pod_spec(docs)["volumes"].append(
        {"name": "spool", "persistentVolumeClaim": {"claimName": "queen-spool"}})


def _open_mesh_to_everyone(docs: list[Doc]) -> None:
    for rule in _one(docs, "NetworkPolicy")["spec"]["ingress"]:
        rule.pop("from", None)


def _open_mesh_to_every_namespace(docs: list[Doc]) -> None:
    for rule in _one(docs, "NetworkPolicy")["spec"]["ingress"]:
        for peer in rule.get("from", []):
            peer["namespaceSelector"] = {}


def _open_every_port(docs: list[Doc]) -> None:
    _one(docs, "NetworkPolicy")["spec"]["ingress"].append({})


def _secret_renamed(docs: list[Doc]) -> None:
    _one(docs, "Secret")["metadata"]["name"] = "queen-broker-secrets"


def _fixed_server_id(docs: list[Doc]) -> None:
    _env(_pod_spec(docs)["containers"][0])["QUEEN_SERVER_ID"].update(
        {"value": "queen", "valueFrom": {}})


def _probes_on_health(docs: list[Doc]) -> None:
    _pod_spec(docs)["containers"][0]["readinessProbe"]["httpGet"]["path"] = "/health"


def _short_grace(docs: list[Doc]) -> None:
    _pod_spec(docs)["terminationGracePeriodSeconds"] = 10


@pytest.mark.parametrize("breakage, complaint", [
    (_share_the_spool, "not on a volumeClaimTemplate"),
    (_open_mesh_to_everyone, "admits the mesh port from everyone"),
    (_open_mesh_to_every_namespace, "the mesh port admits more than the broker pods"),
    (_open_every_port, "admits the mesh port from everyone"),
    (_secret_renamed, "secretKeyRef names 'queen-broker', not defined"),
    (_fixed_server_id, "QUEEN_SERVER_ID does not come from the pod's name"),
    (_probes_on_health, "readinessProbe is not GET /health/ready"),
    (_short_grace, "terminationGracePeriodSeconds 10"),
])
def test_the_checker_reports_a_broken_invariant(overlay, breakage: Callable[[list[Doc]], None],
                                                complaint: str):
    _, docs = overlay
    broken = copy.deepcopy(docs)
    breakage(broken)
    problems = manifest_problems(broken)
    assert any(complaint in p for p in problems), problems
