"""The gateway's Prometheus metrics: calls by method and outcome, their latency, traffic."""

from __future__ import annotations

from services.server.metrics import Counter, Histogram

CALLS = Counter("mqstore_gateway_calls", "Gateway RPCs by method and status code", ["method", "code"])
CALL_LATENCY = Histogram(
    "mqstore_gateway_call_latency_seconds", "Gateway RPC duration by method (backend calls included)", ["method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
SENT_MESSAGES = Counter("mqstore_gateway_sent_messages", "Messages acknowledged to producers")
PULLED_BYTES = Counter("mqstore_gateway_pulled_bytes", "Serialized pull answers relayed to consumers")

_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}


def observe_call(method: str, code: str, elapsed_s: float) -> None:
    pair = _children.get((method, code))
    if pair is None:
        pair = _children[(method, code)] = (CALLS.labels(method=method, code=code), CALL_LATENCY.labels(method=method))
    pair[0].inc()
    pair[1].observe(elapsed_s)
FOLLOWER_READS = Counter(
    "mqstore_gateway_follower_reads",
    "Reads a replicated shard's follower answered (slaveReadEnable): reason cold (the leader's pull read far "
    "behind the log's end) or leader_unreachable", ["shard", "replica", "reason"])
