"""Every process of ``mqstore up`` exports only its own metrics, the way Prometheus expects them, and the
Grafana dashboard (deploy/grafana) and the PodMonitors (deploy/k8s/components/monitoring) name what
really exists.

- a process's ``mqstore_*`` series all carry its own prefix (the gateway used to export every
  ``mqstore_commitlog_*`` series at 0, because they lived in the shared server layer);
- no ``*_created`` series; every counter's samples end in ``_total``; nothing counted "since start"
  is a gauge;
- every metric name in a dashboard expression appears in a scrape of the running system.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from mqstore.client import Producer, PullConsumer
from tests.deploy.render import K8S, kubectl, render
from tests.observability.conftest import TracedUp

REPO = Path(__file__).parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "mqstore-dashboard.json"
SERVICES = ("commitlog", "indexer", "query", "gateway", "scheduler")
#: prometheus_client's own collectors, standard in every Python exporter.
STANDARD_PREFIXES = ("process_", "python_")


def _families(url: str) -> list[Metric]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return list(text_string_to_metric_families(response.read().decode()))


@pytest.fixture(scope="module")
def scrapes(traced_up: TracedUp) -> dict[str, list[Metric]]:
    """Every process scraped after traffic that touches every series the dashboard shows: sends (one
    delayed, so the scheduler delivers), a batch, pulls."""
    address = traced_up.up.gateway
    with Producer(address) as producer:
        producer.send("HygieneTopic", b"one", tags="a")
        producer.send_batch("HygieneTopic", [b"two", b"three"])
        producer.send("HygieneTopic", b"later", delay_level=1)  # 1 s
    with PullConsumer("hygiene-group", "HygieneTopic", address, rebalance=False, long_poll_ms=1000) as consumer:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 4 and time.monotonic() < deadline:
            got += [m.body for m in consumer.poll(timeout=1)]
    assert sorted(got) == [b"later", b"one", b"three", b"two"]
    return {service: _families(traced_up.metrics_url(service)) for service in SERVICES}


def test_each_process_exports_only_its_own_series(scrapes: dict[str, list[Metric]]) -> None:
    for service, families in scrapes.items():
        names = [f.name for f in families]
        own = [n for n in names if n.startswith(f"mqstore_{service}_")]
        foreign = [n for n in names if not n.startswith((f"mqstore_{service}_", *STANDARD_PREFIXES))]
        assert own, f"{service} exports none of its own series: {names}"
        assert not foreign, f"{service} exports series of others: {foreign}"


def test_no_created_series_and_counters_are_totals(scrapes: dict[str, list[Metric]]) -> None:
    for service, families in scrapes.items():
        for family in families:
            samples = [s.name for s in family.samples]
            assert not [s for s in samples if s.endswith("_created")], (service, family.name, samples)
            if family.type == "counter":
                assert all(s == f"{family.name}_total" for s in samples), (service, family.name, samples)
            if family.type == "gauge":
                assert "since start" not in family.documentation, \
                    f"{service}: {family.name} only grows ({family.documentation!r}): make it a counter"
                assert not family.name.endswith("_total"), (service, family.name)


def _expressions(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [str(node["expr"])] if "expr" in node else []
        query = node.get("query")
        if isinstance(query, dict) and "query" in query:
            found.append(str(query["query"]))
        return found + [e for value in node.values() for e in _expressions(value)]
    if isinstance(node, list):
        return [e for value in node for e in _expressions(value)]
    return []


def test_every_dashboard_expression_names_metrics_that_exist(scrapes: dict[str, list[Metric]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exposed = {s.name for families in scrapes.values() for f in families for s in f.samples}
    expressions = _expressions(dashboard["panels"]) + _expressions(dashboard["templating"])
    assert len(expressions) >= 15
    used = {name for expr in expressions for name in re.findall(r"\bmqstore_[a-z0-9_]+", expr)}
    assert used - {"mqstore_"} and not (used - exposed), f"not exposed by any process: {sorted(used - exposed)}"
    signals = " ".join(expressions)
    for signal in ("mqstore_commitlog_puts_total", "mqstore_query_pulled_messages_total",
                   "mqstore_commitlog_put_latency_seconds_bucket", "mqstore_query_pull_latency_seconds_bucket",
                   "mqstore_indexer_dispatch_behind_bytes", "mqstore_commitlog_disk_used_ratio",
                   "mqstore_commitlog_flush_latency_seconds_bucket", "mqstore_commitlog_flushed_offset"):
        assert signal in signals, f"the dashboard shows no {signal}"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_pod_monitors_scrape_every_metrics_port_the_pods_declare() -> None:
    """The optional monitoring component renders on top of an overlay; its PodMonitors (a CRD, so not
    validated against the Kubernetes schemas) select the shard and gateway pods and name every
    metrics-* port they declare."""
    with tempfile.TemporaryDirectory(prefix="mqstore-monitoring-") as tmp:
        tree = Path(tmp) / "k8s"
        shutil.copytree(K8S, tree)
        # What the component's kustomization.yaml tells a user to do: list it in the overlay.
        dev = tree / "overlays" / "dev" / "kustomization.yaml"
        spec = yaml.safe_load(dev.read_text(encoding="utf-8"))
        dev.write_text(yaml.safe_dump({**spec, "components": ["../../components/monitoring"]}), encoding="utf-8")
        done = subprocess.run([kubectl(), "kustomize", str(dev.parent)], capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, done.stderr
    objects = [o for o in yaml.safe_load_all(done.stdout) if o]
    monitors = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PodMonitor"}
    assert set(monitors) == {"mqstore-shard", "mqstore-gateway"}
    base = {(o["kind"], o["metadata"]["name"]): o for o in render("overlays/dev")}
    for monitor in monitors.values():
        assert monitor["metadata"]["namespace"] == "mqstore"
        labels = monitor["spec"]["selector"]["matchLabels"]
        workload = next(o for (kind, _), o in base.items() if kind in ("StatefulSet", "Deployment")
                        and o["spec"]["template"]["metadata"]["labels"].items() >= labels.items())
        declared = {p["name"] for c in workload["spec"]["template"]["spec"]["containers"]
                    for p in c.get("ports", []) if p["name"].startswith("metrics")}
        scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
        assert declared <= scraped, (monitor["metadata"]["name"], declared - scraped)
