"""The dispatch parser (``parse_dispatch_requests``, which finds the few properties dispatch needs by
searching the properties string) gives exactly the DispatchRequests of a full decode of each record
(``decode_record``, its whole properties map): on RocketMQ's fixture stores, and on generated records
whose properties try every corner of RocketMQ's string2messageProperties (duplicates, empty names and
values, separators inside values, names that end like TAGS or KEYS, DELAY on the schedule topic, IPv6
hosts)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    DEFAULT_DELAY_LEVELS_MS,
    SCHEDULE_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
)
from services.store.formats.record import (
    INVALID,
    DispatchRequest,
    RecordError,
    check_record,
    decode_record,
    dispatch_request_of,
    encode_record,
    parse_dispatch_requests,
)
from services.store.formats.socket_address import encode_address
from tests.conftest import StoreFactory
from tests.test_dispatch_parse import chunks_of


def fully_decoded(data: bytes, start_offset: int) -> list[DispatchRequest]:
    """The oracle: every record decoded whole (its properties map built), then its request."""
    requests, pos = [], 0
    while pos < len(data):
        record = decode_record(data, pos)
        if record.commitlog_offset != start_offset + pos:
            raise RecordError(f"offset {start_offset + pos}: not a whole record that starts here")
        try:
            requests.append(dispatch_request_of(record, DEFAULT_DELAY_LEVELS_MS))
        except ValueError as exc:  # a DELAY that is no int: an invalid record, as check_record says
            raise RecordError(str(exc)) from None
        pos += record.store_size
    return requests


NAMES = ["TAGS", "KEYS", "UNIQ_KEY", "DELAY", "XTAGS", "KEYSX", "", "CLUSTER", "TAG", "UNIQ_KEY\x01x"]
VALUES = ["", "a", "a b", " a  b ", "TagA", "标签", "3", "18", "99", "-1", "x\x01y", "KEYS\x01z", "0"]


@pytest.mark.parametrize("store", ["normal-raw", "crash-recovered"])
def test_the_fixture_stores_parse_alike(pristine_store: StoreFactory, store: str) -> None:
    for start, data in chunks_of(pristine_store(store) / "commitlog"):
        assert parse_dispatch_requests(data, start) == fully_decoded(data, start)


def property_text(items: list[tuple[str, str]], trailing: bool) -> bytes:
    text = "\x02".join(f"{name}\x01{value}" if value or name else name for name, value in items)
    return (text + ("\x02" if trailing else "")).encode()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)), max_size=6),
                          st.booleans(), st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=6))
def test_generated_records_parse_alike(specs: list[tuple[list[tuple[str, str]], bool, bool, bool, bool]]) -> None:
    records, offset = [], 4096
    for items, schedule, born_v6, store_v6, trailing in specs:
        sys_flag = (BORNHOST_V6_FLAG if born_v6 else 0) | (STOREHOSTADDRESS_V6_FLAG if store_v6 else 0)
        record = encode_record(
            topic=(SCHEDULE_TOPIC if schedule else "主题").encode(), queue_id=2, body=b"body", flag=0,
            properties=property_text(items, trailing), sys_flag=sys_flag, born_timestamp=5,
            born_host=encode_address("[::1]:80" if born_v6 else "10.0.0.1:80"),
            store_host=encode_address("[fe80::2]:90" if store_v6 else "10.0.0.2:90"),
            queue_offset=7, commitlog_offset=offset, store_timestamp=1_700_000_000_000)
        records.append(record)
        offset += len(record)
    data = b"".join(records)
    assert outcome(parse_dispatch_requests, data, 4096) == outcome(fully_decoded, data, 4096)


def outcome(parse: Callable[[bytes, int], list[DispatchRequest]], data: bytes, start: int) -> object:
    """The requests, or that the chunk was refused (RecordError)."""
    try:
        return parse(data, start)
    except RecordError:
        return RecordError


def schedule_record(delay: str, offset: int = 4096) -> bytes:
    return encode_record(topic=SCHEDULE_TOPIC.encode(), queue_id=2, body=b"later", flag=0,
                         properties=property_text([("DELAY", delay), ("TAGS", "TagA")], False), sys_flag=0,
                         born_timestamp=5, born_host=encode_address("10.0.0.1:80"),
                         store_host=encode_address("10.0.0.2:90"), queue_offset=7, commitlog_offset=offset,
                         store_timestamp=1_700_000_000_000)


@pytest.mark.parametrize("delay", ["soon", "3.5", " 3", "99999999999"])
def test_a_delay_that_is_no_int_is_an_invalid_record_on_both_paths(delay: str) -> None:
    """4.9.8's checkMessageAndReturnSize parses DELAY with Integer.parseInt inside the try that answers
    an invalid record: the record-by-record check and the chunk parser both refuse it."""
    data = schedule_record(delay)
    assert check_record(data, 0) == INVALID
    with pytest.raises(RecordError, match="DELAY"):
        parse_dispatch_requests(data, 4096)


@pytest.mark.parametrize("delay", ["0", "-1", "3", "+3", "18", "99"])
def test_an_int_delay_gives_both_paths_the_same_tags_code(delay: str) -> None:
    data = schedule_record(delay)
    (parsed,) = parse_dispatch_requests(data, 4096)
    assert parsed == check_record(data, 0)
    assert (parsed.tags_code > 1_700_000_000_000) == (int(delay) > 0)


def test_what_is_not_whole_records_is_refused_alike(pristine_store: StoreFactory) -> None:
    start, data = chunks_of(pristine_store("normal-raw") / "commitlog")[0]
    for bad, at in ((data[161:], start + 161 + 1), (data[:1000], start), (data[:8] + b"\xff" * 200, start)):
        with pytest.raises(RecordError):
            parse_dispatch_requests(bad, at)
