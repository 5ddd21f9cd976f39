"""What a restarted scheduler reads back from the log (ScheduleFiles.reputs) and matches (reput_key),
on commitlog files written here: the re-puts of a stretch, in order, across a file's BLANK end; no
parked record, transaction half or ordinary record among them, whatever their bytes hold; the walk ends
at a file written long after the state; a re-put shares its key with the parked record it came from and
with nothing else."""

from __future__ import annotations

from pathlib import Path

from services.scheduler.store_reader import ScheduleFiles
from services.scheduler.timeup import message_timeup, reput_key, timer_timeup
from services.store.formats.message import properties_to_string
from services.store.formats.parked_record import decode_parked
from services.store.formats.record import encode_blank, encode_record

FILE_SIZE = 4096
HOST = b"\x0a\x01\x02\x03\x11\xd7\x00\x00"  # 10.1.2.3:4567


def _record(offset: int, topic: str, body: bytes, properties: dict[str, str], stored_ms: int = 1000,
            queue_id: int = 0) -> bytes:
    return encode_record(topic=topic.encode(), queue_id=queue_id, body=body, flag=7,
                         properties=properties_to_string(properties).encode(), sys_flag=0, born_timestamp=5,
                         born_host=HOST, store_host=HOST, commitlog_offset=offset, store_timestamp=stored_ms)


def _parked(uniq: str, **extra: str) -> dict[str, str]:
    return {"UNIQ_KEY": uniq, "REAL_TOPIC": "orders", "REAL_QID": "1", "DELAY": "2", **extra}


def _write_log(root: Path, files: list[list[tuple[str, bytes, dict[str, str], int]]]) -> list[list[int]]:
    """Commitlog files of FILE_SIZE, each with its records and a BLANK end; the records' offsets."""
    (root / "commitlog").mkdir(parents=True)
    offsets: list[list[int]] = []
    for index, records in enumerate(files):
        base, data, starts = index * FILE_SIZE, bytearray(), []
        for topic, body, properties, stored_ms in records:
            starts.append(base + len(data))
            data += _record(base + len(data), topic, body, properties, stored_ms,
                            queue_id=1 if topic == "orders" else 0)
        data += encode_blank(FILE_SIZE - len(data))
        (root / "commitlog" / f"{base:020d}").write_bytes(data.ljust(FILE_SIZE, b"\0"))
        offsets.append(starts)
    return offsets


def test_the_reputs_of_a_stretch_in_order_across_files_and_only_those(tmp_path: Path) -> None:
    offsets = _write_log(tmp_path, [
        [("SCHEDULE_TOPIC_XXXX", b"a", _parked("A"), 1000),  # parked: not a re-put
         ("orders", b"a", _parked("A"), 1001),  # its re-put
         ("RMQ_SYS_TRANS_HALF_TOPIC", b"h", _parked("H"), 1002),  # a half: stored under another topic
         ("orders", b"body holds REAL_TOPIC\x01x", {"UNIQ_KEY": "P"}, 1003),  # ordinary, the bytes in its body
         ("orders", b"b", _parked("B"), 1004)],
        [("orders", b"c", _parked("C", REAL_QID="0"), 2000),  # REAL_QID is not where it lies: not a re-put
         ("orders", b"d", _parked("D"), 2001)],
    ])
    files = ScheduleFiles(tmp_path, tmp_path / "indexer", FILE_SIZE, 6000)
    try:
        end = offsets[1][-1] + 1000
        assert [r.body for r in files.reputs(0, end)] == [b"a", b"b", b"d"]
        assert [r.body for r in files.reputs(offsets[0][2], end)] == [b"b", b"d"]
        assert [r.body for r in files.reputs(0, offsets[0][-1])] == [b"a"]  # end excludes the record there
        # the second file's first record is younger than the state's write allows for: not walked
        assert [r.body for r in files.reputs(offsets[0][1], end, stored_until_ms=1999)] == [b"a", b"b"]
        assert [r.body for r in files.reputs(offsets[0][1], end, stored_until_ms=2000)] == [b"a", b"b", b"d"]
        # a start that is no record's first byte: nothing found there, logged
        assert list(files.reputs(offsets[0][1] + 4, end)) == []
    finally:
        files.close()


def test_a_reput_shares_its_key_with_its_parked_record_only() -> None:
    parked = decode_parked(_record(0, "SCHEDULE_TOPIC_XXXX", b"x", _parked("A")))
    delayed = message_timeup(parked)
    stored = decode_parked(_record(64, delayed.topic, delayed.body, delayed.properties, queue_id=1))
    assert reput_key(stored) == reput_key(parked)
    timer = decode_parked(_record(0, "rmq_sys_wheel_timer", b"x", _parked("A", TIMER_OUT_MS="9")))
    timed = timer_timeup(timer, 1, 2)
    stored_timer = decode_parked(_record(64, timed.topic, timed.body, timed.properties, queue_id=1))
    assert reput_key(stored_timer) == reput_key(timer) != reput_key(parked)
    for other in (_parked("B"), _parked("A", DELAY="3")):
        assert reput_key(decode_parked(_record(0, "SCHEDULE_TOPIC_XXXX", b"x", other))) != reput_key(parked)
    assert reput_key(decode_parked(_record(0, "SCHEDULE_TOPIC_XXXX", b"y", _parked("A")))) != reput_key(parked)
