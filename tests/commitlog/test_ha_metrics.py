"""Replication's metrics and WARNINGs, in-process: a follower's lag in bytes and in time (how long ago it
last held what the leader had at its previous report), labelled by shard and replica, and a WARNING when
a follower starts lagging (behind for longer than haSendTimeout) and when it catches up again."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.commitlog.ha import ha_metrics
from services.commitlog.ha.group_transfer import GroupTransfer
from services.store.config import load_config

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "mqstore-dashboard.json"
TIMEOUT_S = 0.2
LABELS = {"shard": "shard-m", "replica": "replica-1", "follower": "10.0.0.1:1"}


def _lag() -> tuple[float | None, float | None]:
    return (REGISTRY.get_sample_value("mqstore_commitlog_ha_follower_lag_bytes", LABELS),
            REGISTRY.get_sample_value("mqstore_commitlog_ha_follower_lag_seconds", LABELS))


def test_a_followers_lag_in_bytes_and_time_grows_only_while_it_does_not_catch_up(
        caplog: pytest.LogCaptureFixture) -> None:
    leader_max = [1000]
    transfer = GroupTransfer("shard-m", lambda: leader_max[0], followers_needed=1, timeout_s=TIMEOUT_S,
                             fallbehind_max=1 << 30)
    ha_metrics.bind_followers(transfer, lambda: leader_max[0])
    follower = transfer.add("10.0.0.1:1", "replica-1")
    transfer.acknowledge(follower, 1000)
    assert _lag() == (0, 0)
    leader_max[0] = 5000  # a burst: the follower holds what the leader had at its previous report
    transfer.acknowledge(follower, 2000)
    lag_bytes, lag_s = _lag()
    assert lag_bytes == 3000 and lag_s is not None and lag_s < TIMEOUT_S
    caplog.set_level(logging.WARNING, "services.commitlog.ha.group_transfer")
    time.sleep(TIMEOUT_S * 1.5)
    transfer.acknowledge(follower, 3000)  # still short of 5000, the leader's max at its previous report
    lag_bytes, lag_s = _lag()
    assert lag_bytes == 2000 and lag_s is not None and lag_s >= TIMEOUT_S * 1.5
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "replica-1 is LAGGING: 2000 bytes behind" in caplog.text
    transfer.acknowledge(follower, 5000)
    assert _lag() == (0, 0)
    assert "replica-1 caught up again" in caplog.records[-1].getMessage()


def test_a_replicas_own_metrics_are_labelled_by_shard_and_replica() -> None:
    config = load_config(environ={}, broker_name="shard-m", ha_replica_name="replica-2")
    labels = ha_metrics.replica_labels(config)
    ha_metrics.EPOCH.labels(*labels).set(7)
    ha_metrics.TRUNCATED_BYTES.labels(*labels).inc(64)
    assert REGISTRY.get_sample_value("mqstore_commitlog_ha_epoch", {"shard": "shard-m", "replica": "replica-2"}) == 7
    assert REGISTRY.get_sample_value("mqstore_commitlog_ha_truncated_bytes_total",
                                     {"shard": "shard-m", "replica": "replica-2"}) == 64


def test_the_dashboards_replication_row_shows_series_a_replica_exports_in_their_units() -> None:
    transfer = GroupTransfer("shard-d", lambda: 10, followers_needed=1, timeout_s=TIMEOUT_S, fallbehind_max=1 << 30)
    ha_metrics.bind_followers(transfer, lambda: 10)
    transfer.acknowledge(transfer.add("10.0.0.2:1", "replica-d1"), 5)
    ha_metrics.declare_replica(load_config(environ={}, broker_name="shard-d", ha_replica_name="replica-d0"))
    exported = {s.name for f in text_string_to_metric_families(generate_latest(REGISTRY).decode()) for s in f.samples}
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = [p for p in dashboard["panels"] if any("mqstore_commitlog_ha_" in t["expr"] for t in p.get("targets", []))]
    shown = set()
    for panel in panels:
        names = {n for t in panel["targets"] for n in re.findall(r"\bmqstore_commitlog_ha_[a-z_]+", t["expr"])}
        assert names <= exported, f"{panel['title']}: not exported: {sorted(names - exported)}"
        units = {"bytes" if n.endswith(("_bytes", "_bytes_total")) else "s" if n.endswith("_seconds") else "short"
                 for n in names}
        assert units == {panel["fieldConfig"]["defaults"]["unit"]}, panel["title"]
        shown |= names
    assert shown >= {"mqstore_commitlog_ha_follower_lag_bytes", "mqstore_commitlog_ha_follower_lag_seconds",
                     "mqstore_commitlog_ha_in_sync_replicas", "mqstore_commitlog_ha_epoch",
                     "mqstore_commitlog_ha_leaderships_total", "mqstore_commitlog_ha_truncated_bytes_total"}
