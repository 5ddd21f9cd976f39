"""Every service's Prometheus endpoint (MQSTORE_METRICS_PORT) exposes the put/get, flush, disk,
dispatch and pull metrics, and they move with traffic."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from mqstore.v1 import commitlog_pb2, query_pb2
from tests.observability.conftest import Observed
from tests.query.query_process import message, wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} is not exposed; have {sorted({n for n, _ in samples})}"
    return samples[key]


def test_every_service_exposes_metrics_that_move_with_traffic(observed: Observed) -> None:
    system, ports = observed.system, observed.metrics_ports
    results = system.append([message("MetricsTopic", q, b"m" * 100, KEYS="metrics-key") for q in (0, 1)])
    system.commitlog.stub.Append(commitlog_pb2.AppendRequest(message=message("MetricsTopic", 0, b"one")), timeout=10)
    system.commitlog.stub.Read(commitlog_pb2.ReadRequest(offset=results[0].commitlog_offset,
                                                         size=results[0].wrote_bytes), timeout=5)
    system.wait_dispatched()
    pulled = system.query.stub.PullMessage(query_pb2.PullMessageRequest(topic="MetricsTopic", queue_id=0), timeout=10)
    assert len(pulled.messages) == 2
    empty = system.query.stub.PullMessage(query_pb2.PullMessageRequest(topic="MetricsTopic", queue_id=0,
                                                                       queue_offset=2), timeout=10)
    assert not empty.messages
    system.query.stub.ViewMessage(query_pb2.ViewMessageRequest(msg_id=results[1].msg_id), timeout=10)

    commitlog = scrape(ports["commitlog"])
    assert value(commitlog, "mqstore_commitlog_puts_total", status="PUT_OK") >= 3
    assert value(commitlog, "mqstore_commitlog_appended_bytes_total") > 200
    assert value(commitlog, "mqstore_commitlog_put_latency_seconds_count") >= 2
    assert value(commitlog, "mqstore_commitlog_flush_latency_seconds_count") >= 1  # SYNC_FLUSH: a group commit
    assert value(commitlog, "mqstore_commitlog_reads_total", method="Read") >= 1
    assert value(commitlog, "mqstore_commitlog_read_bytes_total", method="Read") >= results[0].wrote_bytes
    assert value(commitlog, "mqstore_commitlog_reads_total", method="ReadBatch") >= 1
    assert value(commitlog, "mqstore_commitlog_read_bytes_total", method="ReadBatch") > 0
    # The indexer's reput reads the commitlog's files itself and follows the positions-only Tail.
    assert value(commitlog, "mqstore_commitlog_tail_chunks_total", kind="position") >= 1
    max_offset = value(commitlog, "mqstore_commitlog_max_offset_bytes")
    assert max_offset > 0 and value(commitlog, "mqstore_commitlog_flushed_offset_bytes") == max_offset
    assert value(commitlog, "mqstore_commitlog_min_offset_bytes") == 0
    assert value(commitlog, "mqstore_commitlog_files") >= 1
    assert value(commitlog, "mqstore_commitlog_files_bytes") >= 1024 * 1024
    assert 0 < value(commitlog, "mqstore_commitlog_disk_used_ratio") < 1
    assert 0 < value(commitlog, "mqstore_commitlog_disk_used_bytes") < value(commitlog,
                                                                              "mqstore_commitlog_disk_total_bytes")
    assert value(commitlog, "mqstore_commitlog_disk_full") == 0

    indexer = scrape(ports["indexer"])
    assert value(indexer, "mqstore_indexer_dispatched_records_total") >= 3
    assert value(indexer, "mqstore_indexer_dispatch_behind_bytes") == 0
    assert value(indexer, "mqstore_indexer_reput_offset_bytes") == max_offset
    assert value(indexer, "mqstore_indexer_commitlog_read_bytes_total", source="files") >= max_offset
    assert value(indexer, "mqstore_indexer_consume_queues") >= 2
    assert value(indexer, "mqstore_indexer_index_files") >= 1
    assert value(indexer, "mqstore_indexer_index_entries") >= 2  # the KEYS of the two messages
    assert value(indexer, "mqstore_indexer_queue_entry_reads_total") >= 2
    assert value(indexer, "mqstore_indexer_queue_units_served_total") >= 2
    assert value(indexer, "mqstore_indexer_commitlog_connected") == 1

    query = scrape(ports["query"])
    assert value(query, "mqstore_query_pulls_total", status="FOUND") >= 1
    assert value(query, "mqstore_query_pulls_total", status="OFFSET_OVERFLOW_ONE") >= 1
    assert value(query, "mqstore_query_pulled_messages_total") >= 2
    assert value(query, "mqstore_query_pulled_bytes_total") >= 2 * 100
    assert value(query, "mqstore_query_pull_latency_seconds_count") >= 2
    assert value(query, "mqstore_query_lookups_total", method="ViewMessage") >= 1
    assert value(query, "mqstore_query_lookup_messages_total") >= 1
    assert value(query, "mqstore_query_long_polls_waiting") == 0
    wait_until(lambda: value(scrape(ports["query"]), "mqstore_query_arrivals_connected") == 1)


def test_a_long_poll_shows_as_waiting(observed: Observed) -> None:
    import threading

    system, port = observed.system, observed.metrics_ports["query"]
    request = query_pb2.PullMessageRequest(topic="MetricsLongPoll", queue_id=0, long_poll_ms=10_000)
    answer: list[query_pb2.PullMessageResponse] = []
    waiter = threading.Thread(target=lambda: answer.append(system.query.stub.PullMessage(request, timeout=15)))
    waiter.start()
    try:
        wait_until(lambda: value(scrape(port), "mqstore_query_long_polls_waiting") == 1)
        system.append([message("MetricsLongPoll", 0, b"wake")])
    finally:
        waiter.join(15)
    assert [m.body for m in answer[0].messages] == [b"wake"]
    assert value(scrape(port), "mqstore_query_long_polls_waiting") == 0
