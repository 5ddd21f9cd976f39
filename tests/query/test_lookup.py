"""ViewMessage (offset msg id and UNIQ_KEY) and QueryMessage (keys, with a key-hash collision)
against real services."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mqstore.v1 import query_pb2
from services.store.formats.index_file import IndexFile
from services.store.formats.java_hash import index_key_hash
from services.store.formats.message_id import make_message_id
from tests.query.query_process import System, message, running_system

Kind = query_pb2.MessageIdKind


def view(system: System, msg_id: str, **fields: Any) -> query_pb2.ViewMessageResponse:
    response: query_pb2.ViewMessageResponse = system.query.stub.ViewMessage(
        query_pb2.ViewMessageRequest(msg_id=msg_id, **fields), timeout=10)
    return response


def query(system: System, topic: str, key: str, **fields: Any) -> query_pb2.QueryMessageResponse:
    response: query_pb2.QueryMessageResponse = system.query.stub.QueryMessage(
        query_pb2.QueryMessageRequest(topic=topic, key=key, **fields), timeout=10)
    return response


def rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


UNIQ = "0A00000100002A9F1B6D358600000001"
UNIQ_RETRY = "0A00000100002A9F1B6D358600000002"


@pytest.fixture(scope="module")
def appended(system: System) -> list[Any]:
    return system.append([
        message("ViewA", 0, b"first", UNIQ_KEY=UNIQ, KEYS="order-1"),
        message("ViewA", 1, b"second", UNIQ_KEY=UNIQ_RETRY),
        message("ViewB", 0, b"retry", UNIQ_KEY=UNIQ_RETRY),  # the same UNIQ_KEY stored again, later
        message("ViewA", 0, bytes(9000), KEYS="big"),  # longer than the service's first read of an id
    ])


def test_get_by_offset_message_id(system: System, appended: list[Any]) -> None:
    for result, body in zip(appended, [b"first", b"second", b"retry", bytes(9000)], strict=True):
        response = view(system, result.msg_id)
        assert response.found_by == Kind.MESSAGE_ID_KIND_OFFSET
        assert (response.message.msg_id, response.message.commitlog_offset, response.message.body) == \
            (result.msg_id, result.commitlog_offset, body)
    lower = view(system, appended[0].msg_id.lower(), kind=Kind.MESSAGE_ID_KIND_OFFSET)
    assert lower.message.body == b"first"


def test_get_by_uniq_key_with_and_without_topic(system: System, appended: list[Any]) -> None:
    for fields in ({}, {"topic": "ViewA"}, {"kind": Kind.MESSAGE_ID_KIND_UNIQ_KEY}):
        response = view(system, UNIQ, **fields)
        assert response.found_by == Kind.MESSAGE_ID_KIND_UNIQ_KEY, fields
        assert (response.message.uniq_key, response.message.body) == (UNIQ, b"first")
    # Stored twice: the first stored copy, or the one of the topic asked for.
    assert view(system, UNIQ_RETRY).message.body == b"second"
    assert view(system, UNIQ_RETRY, topic="ViewB").message.body == b"retry"
    error = rpc_error(view, system, UNIQ, topic="ViewB")
    assert error.code() == grpc.StatusCode.NOT_FOUND and UNIQ in str(error.details())


def test_offset_id_of_another_store_host_names_that_host(system: System, appended: list[Any]) -> None:
    foreign = make_message_id("10.9.8.7:10911", appended[0].commitlog_offset)
    for kind in (Kind.MESSAGE_ID_KIND_UNSPECIFIED, Kind.MESSAGE_ID_KIND_OFFSET):
        error = rpc_error(view, system, foreign, kind=kind)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "10.9.8.7:10911" in str(error.details()) and "127.0.0.1:10911" in str(error.details())
    v6 = make_message_id("[2001:db8::1]:10911", 0)
    error = rpc_error(view, system, v6)
    assert error.code() == grpc.StatusCode.NOT_FOUND and "[2001:db8::1]:10911" in str(error.details())


def test_well_formed_but_absent_ids_are_not_found(system: System, appended: list[Any]) -> None:
    ours = "127.0.0.1:10911"
    for msg_id in (make_message_id(ours, 10**12),  # past the end of the log
                   make_message_id(ours, appended[0].commitlog_offset + 4),  # inside a record
                   "0A00000100002A9F1B6D35860000FFFF"):  # an unknown UNIQ_KEY
        error = rpc_error(view, system, msg_id)
        assert error.code() == grpc.StatusCode.NOT_FOUND, msg_id
        assert msg_id.upper() in str(error.details()) or msg_id in str(error.details())


def test_not_found_says_what_was_looked_up(system: System, appended: list[Any]) -> None:
    offset = 10**12
    msg_id = make_message_id("127.0.0.1:10911", offset)
    details = str(rpc_error(view, system, msg_id).details())
    assert f"no message at commitlog offset {offset} of store host 127.0.0.1:10911 (offset msg id {msg_id})" in details
    assert f"no message has UNIQ_KEY {msg_id} in any topic" in details
    only_offset = str(rpc_error(view, system, msg_id, kind=Kind.MESSAGE_ID_KIND_OFFSET).details())
    assert "commitlog offset" in only_offset and "UNIQ_KEY" not in only_offset
    only_key = str(rpc_error(view, system, msg_id, kind=Kind.MESSAGE_ID_KIND_UNIQ_KEY).details())
    assert only_key == f"no message has UNIQ_KEY {msg_id} in any topic"
    # Inside a record: the store answers for the offset, whatever host the id names.
    inside = make_message_id("10.9.8.7:10911", appended[0].commitlog_offset + 4)
    assert "no record starts there" in str(rpc_error(view, system, inside).details())


# What a RocketMQ 4.9.8 client on an IPv6 address (2001:db8::5) makes: ip 16 + pid 2 + class-loader
# hash 4 + ms in the month 4 + counter 2 = 28 bytes, 56 hex digits.
UNIQ_V6 = "20010DB8000000000000000000000005" + "1F40" + "12345678" + "000003E8" + "0007"


def test_a_uniq_key_of_an_ipv6_producer_is_found(system: System) -> None:
    sent = message("ViewV6", 0, b"from v6", UNIQ_KEY=UNIQ_V6)
    sent.born_host = "[2001:db8::5]:40000"
    [result] = system.append([sent])
    for fields in ({}, {"topic": "ViewV6"}, {"kind": Kind.MESSAGE_ID_KIND_UNIQ_KEY}):
        response = view(system, UNIQ_V6, **fields)
        assert response.found_by == Kind.MESSAGE_ID_KIND_UNIQ_KEY, fields
        found = response.message
        assert (found.body, found.uniq_key, found.msg_id, found.born_host) == \
            (b"from v6", UNIQ_V6, result.msg_id, "[2001:db8::5]:40000")
    # Its pid and hash read as a port are above 65535: it cannot be an offset msg id.
    error = rpc_error(view, system, UNIQ_V6, kind=Kind.MESSAGE_ID_KIND_OFFSET)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "port" in str(error.details())


def test_an_id_of_either_kind_is_an_offset_id_only_if_its_record_spells_it(system: System,
                                                                            appended: list[Any]) -> None:
    """32 and 56 digits are both lengths of both kinds: nothing is guessed from the length."""
    second = appended[1]
    # UNIQ_KEYs that decode to plausible offset ids of this store, none of which a record spells.
    inside_a_record = make_message_id("127.0.0.1:10911", second.commitlog_offset + 4)
    another_v4_host = make_message_id("127.0.0.2:10911", second.commitlog_offset)
    an_ipv6_host = make_message_id("[::1]:10911", second.commitlog_offset)  # 56 digits
    keys = [inside_a_record, another_v4_host, an_ipv6_host]
    system.append([message("ViewTwin", 0, f"key {i}".encode(), UNIQ_KEY=key) for i, key in enumerate(keys)])
    for i, key in enumerate(keys):
        response = view(system, key)
        assert (response.found_by, response.message.body) == (Kind.MESSAGE_ID_KIND_UNIQ_KEY, f"key {i}".encode())
    # A UNIQ_KEY that is also a real offset id: the record at the offset first; the kind or a topic decide.
    system.append([message("ViewTwin", 0, b"twin", UNIQ_KEY=second.msg_id)])
    by_offset = view(system, second.msg_id)
    assert (by_offset.found_by, by_offset.message.body) == (Kind.MESSAGE_ID_KIND_OFFSET, b"second")
    for fields in ({"kind": Kind.MESSAGE_ID_KIND_UNIQ_KEY}, {"topic": "ViewTwin"}):
        by_key = view(system, second.msg_id, **fields)
        assert (by_key.found_by, by_key.message.body) == (Kind.MESSAGE_ID_KIND_UNIQ_KEY, b"twin"), fields


@pytest.mark.parametrize(("msg_id", "kind"), [
    ("", Kind.MESSAGE_ID_KIND_UNSPECIFIED),
    ("xyz", Kind.MESSAGE_ID_KIND_UNSPECIFIED),
    ("7F00000100002A9F000000000000000", Kind.MESSAGE_ID_KIND_UNSPECIFIED),  # 31 digits
    ("7F00000100002A9F00000000000000000", Kind.MESSAGE_ID_KIND_UNSPECIFIED),  # 33 digits
    ("7F00000100002A9F000000000000000G", Kind.MESSAGE_ID_KIND_UNSPECIFIED),
    ("７F00000100002A9F000000000000000", Kind.MESSAGE_ID_KIND_UNSPECIFIED),  # a full-width digit
    ("0A00000100002A9F1B6D3586000000010A00000100002A9F1B6D", Kind.MESSAGE_ID_KIND_OFFSET),  # 52: no id at all
    ("0A00000100002A9F1B6D3586000000010A00000100002A9F1B6D", Kind.MESSAGE_ID_KIND_UNIQ_KEY),
    ("7F000001" + "0001869F" + "0000000000000000", Kind.MESSAGE_ID_KIND_OFFSET),  # port 99999
    ("7F00000100002A9F" + "8000000000000000", Kind.MESSAGE_ID_KIND_OFFSET),  # a negative offset
    (UNIQ, 7),
])
def test_malformed_ids_are_invalid(system: System, msg_id: str, kind: int) -> None:
    error = rpc_error(view, system, msg_id, kind=kind)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details()


def test_key_hash_collision_is_filtered_out(system: System) -> None:
    topic = "KeyCollide"
    assert index_key_hash(f"{topic}#Aa") == index_key_hash(f"{topic}#BB")
    results = system.append([message(topic, 0, b"a1", KEYS="Aa"), message(topic, 0, b"b1", KEYS="BB"),
                             message(topic, 0, b"a2", KEYS="x Aa"), message(topic, 0, b"c", KEYS="AaBB")])
    for key, bodies in [("Aa", [b"a1", b"a2"]), ("BB", [b"b1"]), ("AaBB", [b"c"]), ("x", [b"a2"])]:
        response = query(system, topic, key)
        assert [m.body for m in response.messages] == bodies, key
        assert [m.commitlog_offset for m in response.messages] == sorted(m.commitlog_offset
                                                                         for m in response.messages)
    # The index answered three hits for Aa (the collision included); one was dropped.
    assert query(system, topic, "Aa").index_hits == 3
    assert query(system, topic, "Aa").index_last_update_phy_offset >= results[-1].commitlog_offset
    assert query(system, "KeyElsewhere", "Aa").messages == []


def test_time_range_and_max_num(system: System) -> None:
    topic = "KeyRange"
    results = system.append([message(topic, 0, f"k{i}".encode(), KEYS="same") for i in range(5)])
    stamps = [r.store_timestamp for r in results]
    assert [m.body for m in query(system, topic, "same").messages] == [b"k0", b"k1", b"k2", b"k3", b"k4"]
    newest_two = query(system, topic, "same", max_num=2).messages
    assert [m.body for m in newest_two] == [b"k3", b"k4"]
    assert query(system, topic, "same", begin_timestamp=stamps[-1] + 1).messages == []
    assert query(system, topic, "same", end_timestamp=stamps[0] - 1).messages == []
    # The window begins at index times (whole seconds from the index file's begin, as RocketMQ's): one
    # that begins a second before the first store time holds every record.
    inside = query(system, topic, "same", begin_timestamp=stamps[0] - 1000, end_timestamp=stamps[-1]).messages
    assert len(inside) == 5
    by_uniq = query(system, "ViewA", UNIQ)
    assert [m.body for m in by_uniq.messages] == [b"first"]


@pytest.mark.parametrize("fields", [
    {"topic": "", "key": "k"}, {"topic": "T", "key": ""}, {"topic": "bad topic", "key": "k"},
    {"topic": "T", "key": "k", "max_num": 65}, {"topic": "T", "key": "k", "max_num": -1},
    {"topic": "T", "key": "k", "begin_timestamp": 10, "end_timestamp": 5},
    {"topic": "T", "key": "k", "begin_timestamp": -1}, {"topic": "T", "key": "k\x01v"},
])
def test_bad_key_queries_are_invalid(system: System, fields: dict[str, Any]) -> None:
    error = rpc_error(system.query.stub.QueryMessage, query_pb2.QueryMessageRequest(**fields), timeout=5)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details()


def test_a_key_repeated_in_keys_gives_its_record_once(system: System) -> None:
    """KEYS ``ord-1441 BB BB`` puts two index entries for BB at one commitlog offset: one record."""
    topic = "KeyTwice"
    results = system.append([message(topic, 0, b"first", KEYS="BB"), message(topic, 0, b"second", KEYS="BB"),
                             message(topic, 0, b"twice", KEYS="ord-1441 BB BB")])
    offsets = [r.commitlog_offset for r in results]
    for max_num in (0, 3, 64):
        response = query(system, topic, "BB", max_num=max_num)
        assert [m.commitlog_offset for m in response.messages] == offsets, max_num
    assert [m.body for m in query(system, topic, "BB", max_num=2).messages] == [b"second", b"twice"]
    assert query(system, topic, "BB").index_hits == 4  # entries examined, the repeat included


# Index files of 7 slots and 300 entries: every key's chain runs through other keys' entries, and
# a few hundred keys roll files.
SMALL_INDEX_ENV = {"MQSTORE_MAX_HASH_SLOT_NUM": "7", "MQSTORE_MAX_INDEX_NUM": "300"}


@pytest.fixture(scope="module")
def small_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running_system(tmp_path_factory.mktemp("small-index"), SMALL_INDEX_ENV) as started:
        yield started


def colliding_keys(blocks: int) -> list[str]:
    """Every key of ``blocks`` "Aa"/"BB" blocks: all have one String.hashCode."""
    return ["".join(parts) for parts in itertools.product(("Aa", "BB"), repeat=blocks)]


def index_times(index_dir: Path, commitlog_offset: int) -> list[int]:
    """The store times (whole seconds from the file's begin) the index holds for a record."""
    times = []
    for path in sorted(index_dir.iterdir()):
        f = IndexFile(path, int(SMALL_INDEX_ENV["MQSTORE_MAX_HASH_SLOT_NUM"]),
                      int(SMALL_INDEX_ENV["MQSTORE_MAX_INDEX_NUM"]), read_only=True)
        try:
            times += [f.begin_timestamp + e.time_diff * 1000 for e in f.entries() if e.phy_offset == commitlog_offset]
        finally:
            f.close()
    return times


def test_colliding_keys_do_not_crowd_out_older_matches(small_index: System) -> None:
    """The 4 records of the key are older than 100 records of keys with the same hash: the first 64
    index hits are all collisions, the walk goes on until it has the real matches."""
    topic = "KeyCrowd"
    target, *others = colliding_keys(4)
    assert {index_key_hash(f"{topic}#{k}") for k in others} == {index_key_hash(f"{topic}#{target}")}
    wanted = small_index.append([message(topic, 0, f"real {i}".encode(), KEYS=target) for i in range(4)])
    crowd = small_index.append([message(topic, i % 4, b"crowd", KEYS=f"{others[i % len(others)]} other-{i}")
                                for i in range(100)])
    offsets = [r.commitlog_offset for r in wanted]
    response = query(small_index, topic, target)
    assert [m.commitlog_offset for m in response.messages] == offsets
    assert response.index_hits == 104
    assert [m.body for m in query(small_index, topic, target, max_num=2).messages] == [b"real 2", b"real 3"]
    # A window that ends at the last real match: records of the same second after it are index hits
    # (the index keeps whole seconds) but not matches.
    window = query(small_index, topic, target, end_timestamp=wanted[-1].store_timestamp)
    assert [m.commitlog_offset for m in window.messages] == offsets
    # A collider's own key is found among them.
    assert [m.commitlog_offset for m in query(small_index, topic, others[0]).messages] == \
        [crowd[i].commitlog_offset for i in range(0, 100, len(others))]


def test_the_window_begins_at_the_index_time_as_in_rocketmq(small_index: System) -> None:
    """RocketMQ 4.9.8's selectPhyOffset keeps an entry whose index time (the file's beginTimestamp +
    whole seconds) is in [begin, end], and stops the walk at one older than begin: a record stored
    after ``begin`` whose index time is before it is not returned."""
    topic = "KeyBegin"
    results = small_index.append([message(topic, 0, f"b{i}".encode(), KEYS="edge") for i in range(3)])
    index_dir = small_index.indexer.store_dir / "index"
    for result in results:
        [indexed_at] = index_times(index_dir, result.commitlog_offset)
        if indexed_at < result.store_timestamp:
            break
    else:
        pytest.skip("every record was stored at a whole second from its index file's begin")
    stored_at = result.store_timestamp
    inside = query(small_index, topic, "edge", begin_timestamp=indexed_at, end_timestamp=stored_at)
    assert result.commitlog_offset in [m.commitlog_offset for m in inside.messages]
    after = query(small_index, topic, "edge", begin_timestamp=indexed_at + 1, end_timestamp=stored_at)
    assert result.commitlog_offset not in [m.commitlog_offset for m in after.messages]
