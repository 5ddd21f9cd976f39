"""The transaction flow's records and rules without processes: RocketMQ 4.9.8's half, commit, op,
put-back and discard records (``services/store/rules/transaction_records.py``), what AppendRequest.transaction_flow
opens and what it keeps closed, the gateway's wire half, and the checker's settings."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.transaction_relay import half_message, refuse_in_batch
from mqstore.v1 import common_pb2
from services.scheduler.transaction_check import CheckSettings
from services.store.errors import InvalidArgumentError
from services.store.formats.message import MessageRecord
from services.store.rules import transaction_records as tx
from services.store.rules.producer_message import check_producer_message

PROPS = {"TRAN_MSG": "true", "PGROUP": "g1", "UNIQ_KEY": "0A0000010000000000000000000000AB", "TAGS": "TagA",
         "REAL_TOPIC": "Orders", "REAL_QID": "3", "WAIT": "true"}


def _half_record(**changes: object) -> MessageRecord:
    record = MessageRecord(store_size=200, magic=0, body_crc=0, queue_id=0, flag=5, queue_offset=17,
                           commitlog_offset=4096, sys_flag=0x2 | 0x20, born_timestamp=1_700_000_000_000,
                           born_host="10.0.0.1:5000", store_timestamp=1_700_000_000_010, store_host="10.0.0.2:10911",
                           reconsume_times=0, prepared_transaction_offset=0, body=b"order", topic=tx.HALF_TOPIC,
                           properties=dict(PROPS))
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


def test_the_half_keeps_the_message_and_names_its_real_queue() -> None:
    wire = half_message(common_pb2.Message(topic="Orders", body=b"order", flag=5, sys_flag=0x4 | 0x2,
                                           properties={"TRAN_MSG": "true", "PGROUP": "g1"}), 3)
    # parseHalfMessageInner: the prepared type is reset to NOT_TYPE (the half needs a queue offset)
    assert (wire.topic, wire.queue_id, wire.sys_flag, wire.body, wire.flag) == (tx.HALF_TOPIC, 0, 0x2, b"order", 5)
    assert dict(wire.properties) == {"TRAN_MSG": "true", "PGROUP": "g1", "REAL_TOPIC": "Orders", "REAL_QID": "3"}


def test_commit_is_the_halfs_whole_record_on_its_real_queue_with_the_commit_type() -> None:
    commit = tx.commit_of(_half_record())
    assert (commit.topic, commit.queue_id) == ("Orders", 3)
    assert commit.sys_flag == 0x2 | 0x8, "COMMIT type; the store-host IPv6 bit is the commitlog's"
    assert commit.prepared_transaction_offset == 4096
    assert commit.properties == PROPS, "4.9.8 serialises the properties before clearing REAL_TOPIC/REAL_QID/TRAN_MSG"
    assert (commit.body, commit.flag, commit.born_timestamp, commit.born_host) == \
        (b"order", 5, 1_700_000_000_000, "10.0.0.1:5000")


def test_op_record_marks_the_half_queue_offset_with_the_remove_tag() -> None:
    op = tx.op_of(_half_record(), 123, "10.0.0.2:10911")
    assert (op.topic, op.queue_id, op.body, op.sys_flag, op.flag) == (tx.OP_TOPIC, 0, b"17", 0, 0)
    assert op.properties == {"TAGS": "d", "WAIT": "true"}
    stored = _half_record(topic=tx.OP_TOPIC, body=op.body, properties=op.properties)
    assert tx.op_half_offset(stored) == 17
    assert tx.op_half_offset(dataclasses.replace(stored, properties={"TAGS": "x"})) is None


def test_put_back_counts_checks_and_discard_keeps_everything() -> None:
    half = _half_record()
    assert tx.check_times(half) is None
    again = tx.put_back_of(half, 1)
    assert (again.topic, again.queue_id, again.properties["TRANSACTION_CHECK_TIMES"]) == (tx.HALF_TOPIC, 0, "1")
    assert tx.check_times(dataclasses.replace(half, properties=again.properties)) == 1
    discarded = tx.discard_of(half)
    assert (discarded.topic, discarded.queue_id, discarded.properties) == (tx.CHECK_MAX_TIME_TOPIC, 0, PROPS)
    assert tx.immunity_ms(half, 6000) == 6000
    immune = dataclasses.replace(half, properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "30"})
    assert tx.immunity_ms(immune, 6000) == 30_000


def test_not_a_half() -> None:
    with pytest.raises(tx.NotAHalf, match="not a half"):
        tx.real_queue(_half_record(topic="Orders"))
    with pytest.raises(tx.NotAHalf, match="REAL_TOPIC"):
        tx.real_queue(_half_record(properties={"PGROUP": "g1"}))


@pytest.mark.parametrize(("topic", "sys_flag"), [(tx.HALF_TOPIC, 0), (tx.OP_TOPIC, 0), (tx.CHECK_MAX_TIME_TOPIC, 0),
                                                 ("Orders", 0x8)])
def test_the_transaction_flow_opens_its_topics_and_the_commit_type(topic: str, sys_flag: int) -> None:
    check_producer_message(topic, {}, 0, sys_flag, 0, 0, 4096, transaction_flow=True)
    with pytest.raises(InvalidArgumentError):  # a producer may not
        check_producer_message(topic, {}, 0, sys_flag, 0, 0, 0)


@pytest.mark.parametrize(("topic", "sys_flag", "fragment"), [
    ("Orders", 0x4, "NOT_TYPE"), ("Orders", 0xC, "NOT_TYPE"), ("SCHEDULE_TOPIC_XXXX", 0, "system topic"),
    ("%RETRY%g", 0, "retry"), ("RMQ_SYS_TRACE_TOPIC", 0, "system topic")])
def test_the_transaction_flow_keeps_the_rest_closed(topic: str, sys_flag: int, fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment):
        check_producer_message(topic, {}, 0, sys_flag, 0, 0, 0, transaction_flow=True)


def test_what_a_half_may_not_carry_and_batches() -> None:
    with pytest.raises(InvalidArgumentError, match="PGROUP"):
        tx.check_half_properties({"TRAN_MSG": "true"})
    with pytest.raises(InvalidArgumentError, match="DELAY"):
        tx.check_half_properties({"TRAN_MSG": "true", "PGROUP": "g", "DELAY": "3"})
    with pytest.raises(InvalidArgumentError, match="REAL_TOPIC"):
        tx.check_half_properties({"TRAN_MSG": "true", "PGROUP": "g", "REAL_TOPIC": "x"})
    assert tx.check_half_properties({"TRAN_MSG": "TRUE", "PGROUP": "g"}) == "g"
    # A group no EndTransaction could name is refused before the half is stored (it would wait for checks).
    with pytest.raises(InvalidArgumentError, match="producer group 'bad/grp'"):
        tx.check_half_properties({"TRAN_MSG": "true", "PGROUP": "bad/grp"})
    assert tx.is_transactional({"TRAN_MSG": "True"}) and not tx.is_transactional({"TRAN_MSG": "false"})
    with pytest.raises(InvalidArgumentError, match="message #2: .*batch"):
        refuse_in_batch(common_pb2.Message(properties={"TRAN_MSG": "true"}), 2)
    refuse_in_batch(common_pb2.Message(properties={"TRAN_MSG": "false"}), 0)


def test_check_settings_from_the_environment() -> None:
    assert CheckSettings.from_env({}) == CheckSettings(6000, 15, 60_000)
    settings = CheckSettings.from_env({"MQSTORE_TRANSACTION_TIMEOUT_MS": "100", "MQSTORE_TRANSACTION_CHECK_MAX": "2",
                                       "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": "50"})
    assert settings == CheckSettings(100, 2, 50)
    with pytest.raises(ValueError, match="positive"):
        CheckSettings.from_env({"MQSTORE_TRANSACTION_CHECK_MAX": "0"})
