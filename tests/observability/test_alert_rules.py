"""mqstore's Prometheus alerting rules (deploy/prometheus/mqstore-alerts.yml, and the same groups as a
PrometheusRule in deploy/k8s/components/monitoring) are valid, fire in ``promtool test rules`` cases, and
name only series a running ``mqstore up`` exposes.

promtool comes from Debian's prometheus package: ``make test`` installs it (``make promtool``), as it
does Java and Node.js; these tests fail rather than skip without it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.observability.conftest import TracedUp

REPO = Path(__file__).parents[2]
RULES = REPO / "deploy" / "prometheus" / "mqstore-alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "mqstore-alerts.test.yml"
PROMETHEUS_RULE = REPO / "deploy" / "k8s" / "components" / "monitoring" / "prometheus-rule.yaml"
SERVICES = ("commitlog", "indexer", "query", "gateway", "scheduler")
#: What the issue asks alerts for; each must have a rule.
ALERTS = {"MqstoreConsumerLagGrowing", "MqstoreConsumerLagOld", "MqstoreDispatchLag", "MqstoreDiskNearWatermark",
          "MqstoreWritesRefusedDiskFull", "MqstoreProcessDown", "MqstoreDeadLetters"}


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make promtool` installs Debian's prometheus package"
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


def test_the_rules_files_are_valid() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    assert {r["alert"] for g in rules["groups"] for r in g["rules"]} >= ALERTS
    # The PrometheusRule carries the same groups (the operator loads spec.groups as a rules file).
    prometheus_rule = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert prometheus_rule["kind"] == "PrometheusRule"
    assert prometheus_rule["spec"] == rules, "prometheus-rule.yaml and mqstore-alerts.yml differ"
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as spec:
        yaml.safe_dump(prometheus_rule["spec"], spec)
        spec.flush()
        done = _promtool("check", "rules", spec.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_fires_in_a_promtool_case() -> None:
    done = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    cases = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    fired = {t["alertname"] for case in cases["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    assert fired == {r["alert"] for g in rules["groups"] for r in g["rules"]}


def test_the_rules_name_series_a_running_system_exposes(traced_up: TracedUp) -> None:
    exposed = set()
    for service in SERVICES:
        with urllib.request.urlopen(traced_up.metrics_url(service), timeout=5) as response:
            for family in text_string_to_metric_families(response.read().decode()):
                exposed.add(family.name + ("_total" if family.type == "counter" else ""))
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    named = {n for g in rules["groups"] for r in g["rules"] for n in re.findall(r"\bmqstore_[a-z0-9_]+", r["expr"])}
    assert named and not (named - exposed), f"not exposed by any process: {sorted(named - exposed)}"
