"""decode_parked (the scheduler's re-put decode) against decode_record: the same fields for any record
(IPv4 and IPv6 hosts, odd properties), and RecordError, never another exception, for garbage or a
record cut short."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.store.formats.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, properties_to_string
from services.store.formats.parked_record import decode_parked
from services.store.formats.record import RecordError, decode_record, encode_record

PROP_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), min_size=1, max_size=20)
HOST4 = st.binary(min_size=8, max_size=8)
HOST6 = st.binary(min_size=20, max_size=20)


@st.composite
def records(draw: st.DrawFn) -> bytes:
    born_v6, store_v6 = draw(st.booleans()), draw(st.booleans())
    sys_flag = (BORNHOST_V6_FLAG if born_v6 else 0) | (STOREHOSTADDRESS_V6_FLAG if store_v6 else 0)
    properties = draw(st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=6))
    return encode_record(
        topic=draw(st.sampled_from([b"SCHEDULE_TOPIC_XXXX", b"rmq_sys_wheel_timer", b"t"])),
        queue_id=draw(st.integers(0, 17)), body=draw(st.binary(max_size=64)), flag=draw(st.integers(-5, 5)),
        properties=properties_to_string(properties).encode(), sys_flag=sys_flag | draw(st.sampled_from([0, 0x8])),
        born_timestamp=draw(st.integers(0, 2**62)), born_host=draw(HOST6 if born_v6 else HOST4),
        store_host=draw(HOST6 if store_v6 else HOST4), reconsume_times=draw(st.integers(0, 16)),
        commitlog_offset=draw(st.integers(0, 2**40)), store_timestamp=draw(st.integers(0, 2**62)))


@settings(max_examples=200, deadline=None)
@given(records(), st.binary(max_size=16))
def test_the_same_fields_as_decode_record(data: bytes, prefix: bytes) -> None:
    buf = prefix + data
    full = decode_record(buf, len(prefix))
    parked = decode_parked(buf, len(prefix))
    for field in parked._fields:
        assert getattr(parked, field) == getattr(full, field), field


@settings(max_examples=200, deadline=None)
@given(records(), st.data())
def test_a_record_cut_short_or_garbage_raises_record_error(data: bytes, draw: st.DataObject) -> None:
    cut = draw.draw(st.integers(0, len(data) - 1))
    for buf in (data[:cut], draw.draw(st.binary(max_size=200))):
        try:
            decode_parked(buf)
        except RecordError:
            continue
        decode_record(buf)  # whatever decode_parked accepts, decode_record accepts too
