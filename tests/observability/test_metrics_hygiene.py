"""Every process of ``mqstore up`` exports only its own metrics, the way Prometheus expects them, and the
Grafana dashboard (deploy/grafana) and the PodMonitors (deploy/k8s/components/monitoring) name what
really exists.

- a process's ``mqstore_*`` series all carry its own prefix (the gateway used to export every
  ``mqstore_commitlog_*`` series at 0, because they lived in the shared server layer);
- no ``*_created`` series; every counter's samples end in ``_total``; nothing counted "since start"
  is a gauge;
- every metric name in a dashboard expression appears in a scrape of the running system, and each
  panel's unit is the unit of every series it plots (no 0/1 state drawn as seconds or as a percentage,
  no messages beside calls).
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
#: Series only a replicated shard fills in (`mqstore up --replicas`): the dashboard's replication row is
#: checked against them in tests/commitlog/test_ha_metrics.py.
REPLICATION_PREFIX = "mqstore_commitlog_ha_"


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
    # The group's lag series appear at the query service's next lag refresh (every second here).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        query = _families(traced_up.metrics_url("query"))
        if any(s.name == "mqstore_query_group_lag_seconds" for f in query for s in f.samples):
            break
        time.sleep(0.3)
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
    used = {name for expr in expressions for name in re.findall(r"\bmqstore_[a-z0-9_]+", expr)
            if not name.startswith(REPLICATION_PREFIX)}
    assert used - {"mqstore_"} and not (used - exposed), f"not exposed by any process: {sorted(used - exposed)}"
    signals = " ".join(expressions)
    for signal in ("mqstore_commitlog_puts_total", "mqstore_query_pulled_messages_total",
                   "mqstore_commitlog_put_latency_seconds_bucket", "mqstore_query_pull_latency_seconds_bucket",
                   "mqstore_indexer_dispatch_behind_bytes", "mqstore_commitlog_disk_used_ratio",
                   "mqstore_commitlog_flush_latency_seconds_bucket", "mqstore_commitlog_flushed_offset_bytes",
                   "mqstore_query_group_lag_messages", "mqstore_query_group_lag_seconds",
                   "mqstore_commitlog_topic_put_messages_total"):
        assert signal in signals, f"the dashboard shows no {signal}"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


#: What a counter counts, by the end of its name: its rate is messages/s (Grafana "ops") or calls/s ("reqps").
COUNTED = {"messages": ("_messages_total", "_puts_total", "_delivered_total"),
           "calls": ("_calls_total", "_pulls_total", "_reads_total", "_lookups_total", "_errors_total")}
#: The Grafana unit of each quantity.
UNITS = {"seconds": "s", "bytes": "bytes", "bytes/s": "Bps", "ratio": "percentunit", "state": "bool",
         "messages/s": "ops", "calls/s": "reqps", "count": "short"}


def _quantity(expr: str, families: dict[str, Metric]) -> str:
    """What ``expr`` measures, from the names (and, for 0/1 gauges, the HELP) of the series it reads."""
    names = set(re.findall(r"\b(?:mqstore_[a-z0-9_]+|up)\b(?=\{|\s|\)|$)", expr))
    assert names, expr
    found = set()
    for name in names:
        if name == "up":
            found.add("state")
        elif name.endswith("_seconds_bucket") and "histogram_quantile" in expr:
            found.add("seconds")
        elif name.endswith("_bytes_total"):
            assert "rate(" in expr, expr
            found.add("bytes/s")
        elif name.endswith("_total"):
            assert "rate(" in expr, expr
            kinds = [kind for kind, ends in COUNTED.items() if name.endswith(ends)]
            assert len(kinds) == 1, f"say in COUNTED what {name} counts"
            found.add(f"{kinds[0]}/s")
        else:
            family = families[name]
            assert family.type == "gauge", (name, family.type)
            if family.documentation.startswith("1 while"):
                found.add("state")
            elif name.endswith("_seconds"):
                found.add("seconds")
            elif name.endswith("_bytes"):
                found.add("bytes")
            elif name.endswith("_ratio"):
                found.add("ratio")
            else:
                found.add("count")
    return " + ".join(sorted(found))  # more than one: the expression mixes quantities


def test_every_dashboard_panel_has_the_unit_of_its_series(scrapes: dict[str, list[Metric]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    families = {f.name + ("_total" if f.type == "counter" else ""): f for fs in scrapes.values() for f in fs}
    families.update({f"{f.name}_bucket": f for fs in scrapes.values() for f in fs if f.type == "histogram"})
    wrong = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row" or any(REPLICATION_PREFIX in t["expr"] for t in panel["targets"]):
            continue
        unit = panel["fieldConfig"]["defaults"]["unit"]
        quantities = sorted({_quantity(t["expr"], families) for t in panel["targets"]})
        if len(quantities) != 1 or UNITS.get(quantities[0]) != unit:
            wrong.append(f"{panel['title']!r} ({unit}): {quantities}")
    assert not wrong, "panels whose unit is not their series': " + "; ".join(wrong)


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
