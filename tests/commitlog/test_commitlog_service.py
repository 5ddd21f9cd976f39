"""The commitlog service as a real process: appends, reads, tails, restarts, the store lock, health,
reflection and metrics. Records are checked by decoding the bytes the service returns."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from mqstore.v1 import commitlog_pb2 as pb
from mqstore.v1 import common_pb2
from services.commitlog.servicer import MAX_STREAMS
from services.store.formats.message_id import decode_message_id
from services.store.formats.record import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, SIZE_AND_MAGIC, body_crc, decode_record
from tests.commitlog.commitlog_process import (
    SERVICE_NAME,
    CommitLogProcess,
    StartCommitLog,
    commitlog_env,
    free_port,
    mqstore_command,
    stop_cleanly,
)

MIB = 1024 * 1024
FILE_SIZE = 1 * MIB
STORE_HOST = "127.0.0.1:10911"
OK = pb.PUT_MESSAGE_STATUS_PUT_OK


def msg(topic: str, body: bytes, queue_id: int = 0, **fields: object) -> common_pb2.Message:
    return common_pb2.Message(topic=topic, queue_id=queue_id, body=body, **fields)


def store_info(server: CommitLogProcess) -> pb.StoreInfo:
    return server.stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10)


def read_record_bytes(server: CommitLogProcess, result: pb.AppendResult) -> bytes:
    return bytes(server.stub.Read(pb.ReadRequest(offset=result.commitlog_offset, size=result.wrote_bytes)).data)


def fill_past_file_boundary(server: CommitLogProcess, topic: str, body_size: int = 20_000,
                            extra: int = 3) -> list[pb.AppendResult]:
    """One AppendBatch that starts in the current file and ends ``extra`` records into the next one."""
    max_offset = store_info(server).max_offset
    left = FILE_SIZE - max_offset % FILE_SIZE
    record_size = len(read_record_bytes(server, server.stub.Append(
        pb.AppendRequest(message=msg(topic, b"p" * body_size)))))
    count = (left // record_size) + extra
    response = server.stub.AppendBatch(pb.AppendBatchRequest(
        messages=[msg(topic, i.to_bytes(4, "big") * (body_size // 4)) for i in range(count)]), timeout=30)
    return list(response.results)


# -- append and read -----------------------------------------------------------------------------

def test_append_read_round_trip_decodes_every_field(module_commitlog: CommitLogProcess) -> None:
    server = module_commitlog
    properties = {"KEYS": "order-1 order-2", "TAGS": "tagA", "UNIQ_KEY": "0A0B0C0D0000AAAA0000000000000001",
                  "custom": "value ü"}
    sent = msg("RoundTrip", b"\x00\x01binary body\xff", queue_id=3, flag=7, properties=properties,
               born_timestamp=1_700_000_000_123, born_host="10.1.2.3:4567", sys_flag=0, reconsume_times=2,
               prepared_transaction_offset=99)
    before = int(time.time() * 1000)
    result = server.stub.Append(pb.AppendRequest(message=sent), timeout=10)
    assert result.status == OK
    assert (result.topic, result.queue_id) == ("RoundTrip", 3)
    assert decode_message_id(result.msg_id) == (STORE_HOST, result.commitlog_offset)

    record = decode_record(read_record_bytes(server, result))
    assert record.store_size == result.wrote_bytes
    assert record.magic == MESSAGE_MAGIC_CODE
    assert record.body_crc == body_crc(sent.body)
    assert (record.topic, record.queue_id, record.body) == ("RoundTrip", 3, sent.body)
    assert record.flag == 7
    assert record.queue_offset == result.queue_offset == 0
    assert record.commitlog_offset == result.commitlog_offset
    assert record.sys_flag == 0
    assert record.born_timestamp == 1_700_000_000_123
    assert record.born_host == "10.1.2.3:4567"
    assert record.store_timestamp == result.store_timestamp >= before
    assert record.store_host == STORE_HOST
    assert record.reconsume_times == 2
    assert record.prepared_transaction_offset == 99
    assert record.properties == properties


def test_empty_born_host_and_timestamp_are_filled_by_the_store(module_commitlog: CommitLogProcess) -> None:
    before = int(time.time() * 1000)
    result = module_commitlog.stub.Append(pb.AppendRequest(message=msg("RoundTrip", b"defaults")), timeout=10)
    record = decode_record(read_record_bytes(module_commitlog, result))
    host, _, port = record.born_host.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0  # the caller's address, from context.peer()
    assert before <= record.born_timestamp <= record.store_timestamp


def test_append_batch_across_a_file_roll(module_commitlog: CommitLogProcess) -> None:
    server = module_commitlog
    results = fill_past_file_boundary(server, "Rolling")
    assert all(r.status == OK for r in results)
    assert [r.queue_offset for r in results] == list(range(results[0].queue_offset,
                                                           results[0].queue_offset + len(results)))
    rolls = 0
    for prev, cur in zip(results, results[1:], strict=False):
        end = prev.commitlog_offset + prev.wrote_bytes
        if cur.commitlog_offset == end:
            continue
        rolls += 1
        # The rest of the old file is one BLANK record; the batch continues at the next file's start.
        assert cur.commitlog_offset % FILE_SIZE == 0 and cur.commitlog_offset == end - end % FILE_SIZE + FILE_SIZE
        blank = bytes(server.stub.Read(pb.ReadRequest(offset=end, size=8)).data)
        assert SIZE_AND_MAGIC.unpack(blank) == (cur.commitlog_offset - end, BLANK_MAGIC_CODE)
    assert rolls == 1
    for r in results:
        assert decode_message_id(r.msg_id) == (STORE_HOST, r.commitlog_offset)
    last = decode_record(read_record_bytes(server, results[-1]))
    assert last.commitlog_offset == results[-1].commitlog_offset and last.queue_offset == results[-1].queue_offset
    assert store_info(server).mapped_file_count >= 2


def test_append_stream_keeps_order_over_500_messages(module_commitlog: CommitLogProcess) -> None:
    server = module_commitlog
    count = 500

    def requests() -> Iterator[pb.AppendRequest]:
        for i in range(count):
            yield pb.AppendRequest(message=msg("Streamed", f"msg-{i}".encode(), queue_id=1))

    results = list(server.stub.AppendStream(requests(), timeout=60))
    assert len(results) == count and all(r.status == OK for r in results)
    first = results[0].queue_offset
    assert [r.queue_offset for r in results] == list(range(first, first + count))
    offsets = [r.commitlog_offset for r in results]
    assert offsets == sorted(offsets) and len(set(offsets)) == count
    ranges = [pb.ByteRange(offset=r.commitlog_offset, size=r.wrote_bytes) for r in results]
    data = server.stub.ReadBatch(pb.ReadBatchRequest(ranges=ranges), timeout=30).data
    assert [decode_record(d).body for d in data] == [f"msg-{i}".encode() for i in range(count)]


def test_append_stream_acks_before_a_bad_message_then_fails_naming_it(module_commitlog: CommitLogProcess) -> None:
    server = module_commitlog
    before = store_info(server).max_offset
    requests = [pb.AppendRequest(message=msg("Streamed", b"ok-0")), pb.AppendRequest(message=msg("Streamed", b"ok-1")),
                pb.AppendRequest(message=msg("bad topic!", b"x")), pb.AppendRequest(message=msg("Streamed", b"never"))]
    acks: list[pb.AppendResult] = []
    with pytest.raises(grpc.RpcError) as failure:
        for ack in server.stub.AppendStream(iter(requests), timeout=30):
            acks.append(ack)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "message #2 of the stream" in failure.value.details()
    assert len(acks) == 2
    assert store_info(server).max_offset == before + sum(a.wrote_bytes for a in acks)


# -- tail ----------------------------------------------------------------------------------------

def records_of(chunk: pb.TailChunk) -> list[tuple[int, int]]:
    """(commitlog offset, size) of every record of a chunk, checking each decodes at its offset."""
    found, pos = [], 0
    while pos < len(chunk.data):
        record = decode_record(chunk.data, pos)
        assert record.commitlog_offset == chunk.start_offset + pos
        found.append((record.commitlog_offset, record.store_size))
        pos += record.store_size
    assert len(found) == chunk.record_count and chunk.start_offset + pos <= chunk.next_offset
    return found


def test_tail_from_zero_reads_every_record_then_long_polls(module_commitlog: CommitLogProcess) -> None:
    server = module_commitlog
    appended = fill_past_file_boundary(server, "Tailed", body_size=30_000)
    info = store_info(server)
    assert info.min_offset == 0 and info.max_offset > FILE_SIZE

    stream = server.stub.Tail(pb.TailRequest(from_offset=0, max_chunk_bytes=64 * 1024, poll_wait_ms=200), timeout=60)
    seen: list[tuple[int, int]] = []
    expected_next = 0
    for chunk in stream:
        assert chunk.incarnation == info.incarnation
        if chunk.record_count == 0:  # heartbeat: we are at the end
            assert chunk.next_offset == chunk.start_offset == chunk.max_offset == expected_next
            break
        assert chunk.start_offset == expected_next
        seen += records_of(chunk)
        expected_next = chunk.next_offset
    # Contiguous, except where the rest of a file is BLANK and the log continues at the next file.
    for (offset, size), (next_offset, _) in zip(seen, seen[1:], strict=False):
        assert next_offset == offset + size or (next_offset % FILE_SIZE == 0 and next_offset > offset + size)
    assert seen[0][0] == 0 and expected_next == info.max_offset
    assert {r.commitlog_offset for r in appended} <= {offset for offset, _ in seen}

    # Now at the end: a record appended later arrives on the same stream.
    later: list[pb.AppendResult] = []
    timer = threading.Timer(0.3, lambda: later.append(
        server.stub.Append(pb.AppendRequest(message=msg("Tailed", b"late")), timeout=10)))
    timer.start()
    started = time.monotonic()
    try:
        for chunk in stream:
            if chunk.record_count:
                break
            assert chunk.max_offset == expected_next  # heartbeats carry the max offset
        assert time.monotonic() - started < 10
    finally:
        timer.join()
        stream.cancel()
    assert chunk.start_offset == later[0].commitlog_offset == expected_next
    assert decode_record(chunk.data).body == b"late"


@pytest.mark.parametrize(("request_fields", "code"), [
    ({"from_offset": 1}, grpc.StatusCode.INVALID_ARGUMENT),
    ({"from_offset": -5}, grpc.StatusCode.INVALID_ARGUMENT),
    ({"from_offset": 0, "max_chunk_bytes": -1}, grpc.StatusCode.INVALID_ARGUMENT),
    ({"from_offset": 0, "max_chunk_bytes": 64 * MIB + 1}, grpc.StatusCode.INVALID_ARGUMENT),
    ({"from_offset": 0, "poll_wait_ms": -1}, grpc.StatusCode.INVALID_ARGUMENT),
    ({"from_offset": 0, "poll_wait_ms": 60_001}, grpc.StatusCode.INVALID_ARGUMENT),
])
def test_tail_rejects_bad_requests(module_commitlog: CommitLogProcess, request_fields: dict[str, int],
                                   code: grpc.StatusCode) -> None:
    module_commitlog.stub.Append(pb.AppendRequest(message=msg("TailErrors", b"so offset 1 is inside a record")))
    with pytest.raises(grpc.RpcError) as failure:
        next(module_commitlog.stub.Tail(pb.TailRequest(**request_fields), timeout=10))
    assert failure.value.code() == code


def test_tail_beyond_max_offset_is_out_of_range(module_commitlog: CommitLogProcess) -> None:
    max_offset = store_info(module_commitlog).max_offset
    with pytest.raises(grpc.RpcError) as failure:
        next(module_commitlog.stub.Tail(pb.TailRequest(from_offset=max_offset + 1000), timeout=10))
    assert failure.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert str(max_offset + 1000) in failure.value.details() and str(max_offset) in failure.value.details()


# -- process life ----------------------------------------------------------------------------------

def test_restart_keeps_queue_offsets_and_min_offset_errors(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = start_commitlog(store)
    filled = fill_past_file_boundary(first, "Restarted", body_size=40_000)
    before = first.stub.Append(pb.AppendRequest(message=msg("Restarted", b"before restart")))
    first_info = store_info(first)
    stop_cleanly(first)

    second = start_commitlog(store)
    after = second.stub.Append(pb.AppendRequest(message=msg("Restarted", b"after restart")))
    assert after.queue_offset == before.queue_offset + 1
    assert after.commitlog_offset == first_info.max_offset
    assert store_info(second).incarnation != first_info.incarnation
    assert decode_record(read_record_bytes(second, before)).body == b"before restart"
    assert decode_record(read_record_bytes(second, filled[-1])).queue_offset == filled[-1].queue_offset
    stop_cleanly(second)

    # With the first file gone (as after retention), offsets below the new min are OUT_OF_RANGE.
    (store / "commitlog" / f"{0:020d}").unlink()
    third = start_commitlog(store)
    assert store_info(third).min_offset == FILE_SIZE
    with pytest.raises(grpc.RpcError) as failure:
        next(third.stub.Tail(pb.TailRequest(from_offset=0), timeout=10))
    assert failure.value.code() == grpc.StatusCode.OUT_OF_RANGE and str(FILE_SIZE) in failure.value.details()
    with pytest.raises(grpc.RpcError) as failure:
        third.stub.Read(pb.ReadRequest(offset=0, size=8), timeout=10)
    assert failure.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert third.stub.Append(pb.AppendRequest(message=msg("Restarted", b"third"))).queue_offset == \
        after.queue_offset + 1


def test_kill9_leaves_abort_file_and_restart_recovers(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = start_commitlog(store)
    result = first.stub.Append(pb.AppendRequest(message=msg("Crashed", b"survives a process crash")))
    first.kill9()
    assert (store / "abort").exists()
    second = start_commitlog(store)
    assert decode_record(read_record_bytes(second, result)).body == b"survives a process crash"
    assert any("recovering abnormally" in r.get("msg", "") for r in second.log_records())


def test_second_process_on_the_same_store_exits_3_naming_the_holder(module_commitlog: CommitLogProcess,
                                                                    tmp_path: Path) -> None:
    command = [*mqstore_command(), "commitlog", "--store", str(module_commitlog.store_dir),
               "--listen", f"127.0.0.1:{free_port()}"]
    second = subprocess.run(command, env=commitlog_env(), capture_output=True, timeout=60, check=False)
    assert second.returncode == 3, second.stderr.decode()
    assert f'\\"pid\\": {module_commitlog.pid}' in second.stderr.decode()
    assert module_commitlog.running
    assert store_info(module_commitlog).max_offset >= 0  # the first process is unaffected


def test_health_and_reflection(module_commitlog: CommitLogProcess) -> None:
    health = module_commitlog.health
    for service in ("", SERVICE_NAME):
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as failure:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert failure.value.code() == grpc.StatusCode.NOT_FOUND

    database = ProtoReflectionDescriptorDatabase(module_commitlog.channel)
    assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= \
        set(database.get_services())
    file_descriptor = database.FindFileContainingSymbol(SERVICE_NAME)
    methods = {m.name for s in file_descriptor.service for m in s.method}
    assert {"Append", "AppendBatch", "AppendStream", "Read", "ReadBatch", "Tail", "GetStoreInfo",
            "CreateTopic", "UpdateTopic", "ListTopics"} <= methods


def test_metrics_endpoint_counts_puts(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    port = free_port()
    server = start_commitlog(tmp_path / "store", {"MQSTORE_METRICS_PORT": str(port)})
    server.stub.AppendBatch(pb.AppendBatchRequest(messages=[msg("Metered", b"m")] * 3))
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'mqstore_commitlog_puts_total{status="PUT_OK"} 3.0' in text
    assert "mqstore_commitlog_put_latency_seconds_count 1.0" in text


def test_stream_limit_and_sigterm_end_open_streams_promptly(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    server = start_commitlog(tmp_path / "store")
    max_streams = MAX_STREAMS
    release = threading.Event()

    def producer() -> Iterator[pb.AppendRequest]:
        yield pb.AppendRequest(message=msg("Streams", b"acked"))
        release.wait(30)  # an idle producer that keeps its stream open

    try:
        appends = server.stub.AppendStream(producer(), timeout=60)
        assert next(appends).status == OK
        tails = [server.stub.Tail(pb.TailRequest(from_offset=0, poll_wait_ms=60_000), timeout=60)
                 for _ in range(max_streams - 1)]
        for tail in tails:
            assert next(tail).record_count == 1  # each holds a stream slot now, waiting at the end
        with pytest.raises(grpc.RpcError) as failure:
            next(server.stub.Tail(pb.TailRequest(from_offset=0), timeout=10))
        assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(max_streams) in failure.value.details()

        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        for stream in [*tails, appends]:
            with pytest.raises(grpc.RpcError) as failure:
                next(stream)
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "resume the tail from offset" in tails[0].details()
        assert "message #1 of the stream" in appends.details()
        server.channel.close()  # an idle open channel would delay the server's GOAWAY (see CommitLogProcess.stop)
        assert server.proc.wait(30) == 0
        assert time.monotonic() - started < 3, "open streams must not hold the shutdown for the whole grace period"
        assert not (server.store_dir / "abort").exists()
    finally:
        release.set()
