"""deploy/k8s without a cluster: every manifest parses, the kustomization lists every one, each object
is valid against the Kubernetes API schemas (kubernetes-validate, strict: unknown fields are errors),
and the topology holds together: one shard pod whose commitlog, indexer and query containers share
the store volume (readers read-only, each writing only its own subdirectory), a gateway Deployment
whose workers' metrics ports match --workers, every container's arguments accepted by the real
``mqstore`` command line, and every name a Service, probe or the gateway's settings use defined."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.settings import load_gateway_settings
from services.cli import build_parser

K8S = Path(__file__).parents[1] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"  # the oldest version the manifests target (gRPC probes are GA since 1.27)


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is not None:
                found.append((path.name, document))
    return found


def _object(kind: str, name: str) -> dict[str, Any]:
    matches = [d for _, d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def _containers(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}


def _env(container: dict[str, Any], name: str) -> Any:
    return next(e for e in container["env"] if e["name"] == name)


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_kustomization_lists_every_manifest_and_nothing_else() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert len(set(listed)) == len(listed) and kustomization["namespace"] == "mqstore"


@pytest.mark.parametrize(("file", "document"), _documents(),
                         ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in _documents()])
def test_each_object_is_valid_against_the_kubernetes_schemas(file: str, document: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{file}: {document['kind']}/{document['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_every_container_runs_a_command_line_the_mqstore_command_accepts() -> None:
    """A flag renamed or removed in services/cli.py (e.g. the query service's --store-root) fails here,
    not in a pod that crash-loops."""
    parser = build_parser()
    for _, document in _documents():
        if document["kind"] not in ("StatefulSet", "Deployment"):
            continue
        for container in _containers(document).values():
            parser.parse_args(container["args"])  # SystemExit(2) on an unknown flag or value


def test_one_pod_per_shard_shares_the_store_volume_and_only_the_commitlog_writes_its_files() -> None:
    shard = _object("StatefulSet", "shard")
    spec = shard["spec"]["template"]["spec"]
    containers = _containers(shard)
    assert set(containers) == {"commitlog", "indexer", "query", "scheduler"}
    assert [t["metadata"]["name"] for t in shard["spec"]["volumeClaimTemplates"]] == ["store"]
    mounts = {name: {m["mountPath"]: m for m in c["volumeMounts"] if m["name"] == "store"}
              for name, c in containers.items()}
    assert mounts["commitlog"]["/store"].get("readOnly") is not True
    assert _flag(containers["commitlog"]["args"], "--store") == "/store"
    for reader in ("indexer", "query", "scheduler"):
        assert mounts[reader]["/store"]["readOnly"] is True, f"{reader} must not be able to write the commitlog"
        own = mounts[reader][f"/store/{reader}"]
        assert own["subPath"] == reader and own.get("readOnly") is not True
        assert _flag(containers[reader]["args"], "--store") == f"/store/{reader}"
    query_args = containers["query"]["args"]
    assert _flag(query_args, "--store-root") == "/store"  # reads the files, not the other containers' RPCs
    # The init container creates the readers' subdirectories before they are mounted.
    layout = spec["initContainers"][0]
    assert all(f"/store/{reader}" in " ".join(layout["command"]) for reader in ("indexer", "query", "scheduler"))
    # One network: the readers reach the commitlog (and the query the indexer) on loopback.
    assert _flag(containers["indexer"]["args"], "--commitlog") == "127.0.0.1:9901"
    assert _flag(query_args, "--commitlog") == "127.0.0.1:9901"
    assert _flag(query_args, "--indexer") == "127.0.0.1:9902"
    scheduler_args = containers["scheduler"]["args"]
    assert _flag(scheduler_args, "--store-root") == "/store"
    assert _flag(scheduler_args, "--commitlog") == "127.0.0.1:9901"
    assert _flag(scheduler_args, "--indexer") == "127.0.0.1:9902"
    _check_ports_and_probes(shard)


def _check_ports_and_probes(workload: dict[str, Any]) -> None:
    """Container ports unique in the pod (one network), names at most 15 characters (IANA_SVC_NAME),
    every container's metrics port its MQSTORE_METRICS_PORT, probes on its own gRPC port, and every
    container given the service credential."""
    ports: dict[str, int] = {}
    for container in _containers(workload).values():
        for port in container["ports"]:
            assert port["name"] not in ports and port["containerPort"] not in ports.values()
            assert len(port["name"]) <= 15, port["name"]
            ports[port["name"]] = port["containerPort"]
        own = {p["containerPort"] for p in container["ports"]}
        assert int(_env(container, "MQSTORE_METRICS_PORT")["value"]) in own
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] in own
        token = _env(container, "MQSTORE_SERVICE_TOKEN")["valueFrom"]["secretKeyRef"]
        assert token == {"name": "mqstore-service-token", "key": "token"}
    service = _object("Service", workload["spec"].get("serviceName", workload["metadata"]["name"]))
    assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports, f"Service port {port['name']} targets no container port"
        assert ports[port["targetPort"]] == port["port"]


def test_the_gateway_runs_workers_each_with_its_metrics_port() -> None:
    gateway = _object("Deployment", "gateway")
    container = _containers(gateway)["gateway"]
    workers = int(_flag(container["args"], "--workers"))
    base = int(_env(container, "MQSTORE_METRICS_PORT")["value"])
    assert workers >= 2
    metrics = sorted(p["containerPort"] for p in container["ports"] if p["name"].startswith("metrics"))
    assert metrics == [base + i for i in range(workers)]  # worker i serves /metrics on base + i
    assert float(container["resources"]["requests"]["cpu"]) >= workers / 2
    _check_ports_and_probes(gateway)


def test_the_gateway_settings_name_every_shard_pod_by_its_stable_address(tmp_path: Path) -> None:
    config_map = _object("ConfigMap", "gateway-settings")
    path = tmp_path / "gateway.yaml"
    path.write_text(config_map["data"]["gateway.yaml"])
    settings = load_gateway_settings(path)
    assert settings.listen == "0.0.0.0:9876" and settings.auth_file and settings.queue_selection == "latency"
    shard = _object("StatefulSet", "shard")
    replicas, service = shard["spec"]["replicas"], shard["spec"]["serviceName"]
    ports = {p["name"]: p["containerPort"] for c in _containers(shard).values() for p in c["ports"]}
    assert [(s.commitlog, s.query) for s in settings.shards] == [
        (f"shard-{i}.{service}:{ports['commitlog']}", f"shard-{i}.{service}:{ports['query']}") for i in range(replicas)]
    gateway = _containers(_object("Deployment", "gateway"))["gateway"]
    mounted = {m["mountPath"] for m in gateway["volumeMounts"]}
    assert settings.auth_file is not None and str(Path(settings.auth_file).parent) in mounted
