"""The query service over the commitlog real RocketMQ 4.9.8 wrote: key queries give the dump's
``queryMessageOffsets``, pulls give every record the dump decoded, ids and store times match.

Every fixture store, recovered by mqstore from the files RocketMQ left (the crashed and the torn one
with their abort file and checkpoint), indexed from scratch and queried, gives the answers of the
real store's dump: the end of the log, every queue's offset range, every record by pull, every key
query and every ``timequery`` row. So does a CRC-damaged copy of the crashed store, less the one
record its recovery quarantined.
"""

from __future__ import annotations

import base64
import shutil
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mqstore.v1 import commitlog_pb2, query_pb2
from tests.query.query_process import System, running_system

FIXTURE_ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(1024 * 1024),
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": "6000",
    "MQSTORE_MAX_HASH_SLOT_NUM": "100",
    "MQSTORE_MAX_INDEX_NUM": "400",
    "MQSTORE_MAX_MESSAGE_SIZE": str(4 * 1024 * 1024),
}
Rows = Callable[..., list[dict[str, Any]]]
#: The damaged copy's victim: a body byte of the crash store's record at this offset flipped.
VICTIM = 1221702
BODY_BYTE = 84 + 4 + 10


@pytest.fixture(scope="module")
def fixture_system(pristine_store: Callable[[str], Path],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    root = tmp_path_factory.mktemp("query-fixture")
    shutil.copytree(pristine_store("normal-raw") / "commitlog", root / "broker" / "commitlog")
    with running_system(root, FIXTURE_ENV) as started:
        started.wait_dispatched()
        yield started


def test_key_queries_give_the_dump_query_message_offsets(fixture_system: System, dump_rows: Rows) -> None:
    rows = dump_rows("normal", "query")
    assert len(rows) > 3000
    stub = fixture_system.query.stub

    def offsets(row: dict[str, Any]) -> list[int]:
        response = stub.QueryMessage(query_pb2.QueryMessageRequest(topic=row["topic"], key=row["key"], max_num=64),
                                     timeout=30)
        return [m.commitlog_offset for m in response.messages]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(offsets, rows))
    wrong = [(r["topic"], r["key"], a, r["queryMessageOffsets"]) for r, a in zip(rows, answers, strict=True)
             if a != r["queryMessageOffsets"]]
    assert not wrong, wrong[:3]
    assert sum(len(a) == 64 for a in answers) == 13  # the keys that hit the cap, as in the dump


def _expected(row: dict[str, Any]) -> dict[str, Any]:
    stored = base64.b64decode(row["body"]) if row["body"] is not None else b""
    return {"topic": row["topic"], "queue_id": row["queueId"], "queue_offset": row["queueOffset"],
            "commitlog_offset": row["commitLogOffset"], "store_size": row["storeSize"], "body_crc": row["bodyCRC"],
            "flag": row["flag"], "sys_flag": row["sysFlag"], "born_timestamp": row["bornTimestamp"],
            "store_timestamp": row["storeTimestamp"], "born_host": row["bornHost"], "store_host": row["storeHost"],
            "reconsume_times": row["reconsumeTimes"],
            "prepared_transaction_offset": row["preparedTransactionOffset"], "msg_id": row["msgId"],
            "properties": row["properties"],
            "body": zlib.decompress(stored) if row["sysFlag"] & 0x1 else stored}


def _actual(m: query_pb2.StoredMessage) -> dict[str, Any]:
    fields = ("topic", "queue_id", "queue_offset", "commitlog_offset", "store_size", "body_crc", "flag", "sys_flag",
              "born_timestamp", "store_timestamp", "born_host", "store_host", "reconsume_times",
              "prepared_transaction_offset", "msg_id", "body")
    return {**{f: getattr(m, f) for f in fields}, "properties": dict(m.properties)}


def test_pulling_every_queue_gives_every_record_of_the_dump(fixture_system: System, dump_rows: Rows) -> None:
    msgs = dump_rows("normal", "msg")
    stub = fixture_system.query.stub
    pulled: list[query_pb2.StoredMessage] = []
    for cq in dump_rows("normal", "cqrange"):
        offset = cq["minOffset"]
        while offset < cq["maxOffset"]:
            response = stub.PullMessage(query_pb2.PullMessageRequest(
                topic=cq["topic"], queue_id=cq["queueId"], queue_offset=offset, max_messages=64), timeout=30)
            assert response.status == query_pb2.GET_MESSAGE_STATUS_FOUND, (cq, offset)
            assert response.max_offset == cq["maxOffset"]
            pulled.extend(response.messages)
            offset = response.next_begin_offset
    by_offset = {m.commitlog_offset: m for m in pulled}
    assert len(by_offset) == len(pulled) == len(msgs) == 3000
    compressed = 0
    for row in msgs:
        assert _actual(by_offset[row["commitLogOffset"]]) == _expected(row), row["commitLogOffset"]
        compressed += row["sysFlag"] & 0x1
    assert compressed == 2


def test_ids_and_store_times_match_the_dump(fixture_system: System, dump_rows: Rows) -> None:
    stub = fixture_system.query.stub
    msgs = dump_rows("normal", "msg")
    for row in msgs[::97]:
        by_offset_id = stub.ViewMessage(query_pb2.ViewMessageRequest(msg_id=row["msgId"]), timeout=10)
        assert _actual(by_offset_id.message) == _expected(row)
        uniq = row["properties"]["UNIQ_KEY"]
        by_uniq = stub.ViewMessage(query_pb2.ViewMessageRequest(msg_id=uniq, kind=query_pb2.MESSAGE_ID_KIND_UNIQ_KEY),
                                   timeout=10)
        assert by_uniq.message.commitlog_offset == row["commitLogOffset"]
    first_by_queue: dict[tuple[str, int], int] = {}
    for row in msgs:
        first_by_queue.setdefault((row["topic"], row["queueId"]), row["storeTimestamp"])
    for (topic, queue_id), stamp in first_by_queue.items():
        earliest = stub.GetEarliestMsgStoreTime(query_pb2.GetEarliestMsgStoreTimeRequest(topic=topic,
                                                                                         queue_id=queue_id))
        assert earliest.store_timestamp == stamp
        span = stub.GetQueueOffsetRange(query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=queue_id))
        assert span.min_offset == 0 and span.max_offset > 0


def check_against_the_dump(system: System, dump_rows: Rows, run: str, lost: int | None = None) -> None:
    """The system's answers are the dump's (``lost``: the commitlog offset of a record quarantined)."""
    meta, = dump_rows(run, "meta")
    query, commitlog = system.query.stub, system.commitlog.stub
    info = commitlog.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
    assert (info.min_offset, info.max_offset) == (meta["minPhyOffset"], meta["maxPhyOffset"])
    assert [r.start_offset for r in info.quarantined_ranges] == ([] if lost is None else [lost])
    pulled: list[int] = []
    for cq in dump_rows(run, "cqrange"):
        span = query.GetQueueOffsetRange(query_pb2.GetQueueOffsetRangeRequest(topic=cq["topic"],
                                                                              queue_id=cq["queueId"]), timeout=10)
        assert (span.min_offset, span.max_offset) == (cq["minOffset"], cq["maxOffset"]), cq
        offset = cq["minOffset"]
        while offset < cq["maxOffset"]:
            response = query.PullMessage(query_pb2.PullMessageRequest(
                topic=cq["topic"], queue_id=cq["queueId"], queue_offset=offset, max_messages=64), timeout=30)
            pulled.extend(m.commitlog_offset for m in response.messages)
            offset = response.next_begin_offset
    assert sorted(pulled) == [r["commitLogOffset"] for r in dump_rows(run, "msg") if r["commitLogOffset"] != lost]

    def by_key(row: dict[str, Any]) -> list[int]:
        response = query.QueryMessage(query_pb2.QueryMessageRequest(topic=row["topic"], key=row["key"], max_num=64),
                                      timeout=30)
        return [m.commitlog_offset for m in response.messages]

    rows = dump_rows(run, "query")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(by_key, rows))
    # RocketMQ's recovery indexes the record at the index's endPhyOffset again (docs/formats.md), so its
    # key query can list it twice; an index built once lists it once.
    wrong = [(r["key"], a) for r, a in zip(rows, answers, strict=True)
             if a != [o for o in dict.fromkeys(r["queryMessageOffsets"]) if o != lost]]
    assert not wrong, wrong[:3]
    rows = dump_rows(run, "timequery")
    answers = [query.SearchOffset(query_pb2.SearchOffsetRequest(topic=r["topic"], queue_id=r["queueId"],
                                                                timestamp=r["timestamp"]), timeout=10).offset
               for r in rows]
    assert [(r["topic"], r["queueId"], r["timestamp"], a) for r, a in zip(rows, answers, strict=True)
            if a != r["offset"]] == []


def test_the_normal_store_answers_every_offset_range_and_timequery_row(fixture_system: System,
                                                                      dump_rows: Rows) -> None:
    check_against_the_dump(fixture_system, dump_rows, "normal")


@pytest.fixture(scope="module", params=["crash", "torn", "crash-crc-damaged"])
def recovered_system(request: pytest.FixtureRequest, pristine_store: Callable[[str], Path],
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, System]]:
    """A RocketMQ store as its broker left it (commitlog, checkpoint, abort file), recovered by mqstore's
    commitlog and indexed from scratch by its indexer."""
    name: str = request.param
    raw = pristine_store(f"{name.partition('-')[0]}-raw")
    root = tmp_path_factory.mktemp(f"recovered-{name}")
    broker = root / "broker"
    shutil.copytree(raw / "commitlog", broker / "commitlog")
    for state in ("checkpoint", "abort"):
        shutil.copy2(raw / state, broker / state)
    if name.endswith("crc-damaged"):
        with open(broker / "commitlog" / f"{1 << 20:020d}", "r+b") as f:
            f.seek(VICTIM - (1 << 20) + BODY_BYTE)
            byte = f.read(1)[0]
            f.seek(VICTIM - (1 << 20) + BODY_BYTE)
            f.write(bytes([byte ^ 0xFF]))
    with running_system(root, FIXTURE_ENV) as started:
        started.wait_dispatched()
        yield name, started


def test_a_recovered_store_answers_as_the_dump(recovered_system: tuple[str, System], dump_rows: Rows) -> None:
    name, system = recovered_system
    check_against_the_dump(system, dump_rows, name.partition("-")[0],
                           VICTIM if name.endswith("crc-damaged") else None)
