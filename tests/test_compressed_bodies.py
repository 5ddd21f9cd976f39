"""One inflate rule for a body flagged compressed, on every read path: the store's pull and GetMessage
(``stored_message``), the Python client's raw records, the RocketMQ 5 receive path and export. A body
the rule does not inflate - not zlib data, a stream cut short or followed by more bytes, LZ4 or ZSTD -
is handed over as stored with its compressed flag (a RocketMQ 5 message says GZIP, as RocketMQ 5's
proxy marks any compressed record), never as an empty or partial body. The records are written by the
commitlog engine itself: the send refuses them."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import pytest

from apache.rocketmq.v2 import definition_pb2
from gateway.rocketmq5.messages import to_v2
from mqstore.client import compression
from mqstore.client.compression import NotInflatable, consumer_body, inflate
from mqstore.client.records import decode_records
from mqstore.v1 import query_pb2
from pipeline.export import decompress_body
from services.commitlog.message_store import MessageStore
from services.query.stored_message import _general, stored_message
from services.store.config import load_config
from services.store.formats.message import Message

PLAIN = b"compressed body " * 40
WHOLE = zlib.compress(PLAIN)
#: (stored body, sys_flag) -> what every reader hands over: (body, still compressed?)
CASES: dict[str, tuple[bytes, int, bytes, bool]] = {
    "zlib": (WHOLE, 0x1, PLAIN, False),
    "zlib type": (WHOLE, 0x301, PLAIN, False),
    "not compressed": (b"plain", 0x0, b"plain", False),
    "not zlib data": (b"not zlib", 0x1, b"not zlib", True),
    "zlib header only": (b"x", 0x1, b"x", True),  # inflated to b"" before
    "cut short": (WHOLE[:-7], 0x1, WHOLE[:-7], True),  # a partial body before
    "more after the stream": (WHOLE + b"!", 0x1, WHOLE + b"!", True),
    "lz4 type": (WHOLE, 0x101, WHOLE, True),
    "zstd type": (WHOLE, 0x201, WHOLE, True),
}


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, bytes]]]:
    """Each case's record as the engine wrote it: (commitlog offset, bytes)."""
    log = MessageStore(load_config(environ={}), tmp_path_factory.mktemp("compressed") / "store")
    log.start()
    try:
        results = log.put_messages([Message("Squeezed", 0, body, sys_flag=sys_flag, properties={"KEYS": name})
                                    for name, (body, sys_flag, _, _) in CASES.items()])
        yield {name: (r.commitlog_offset, log.read(r.commitlog_offset, r.wrote_bytes))
               for name, r in zip(CASES, results, strict=True)}
    finally:
        log.shutdown()


@pytest.mark.parametrize("name", CASES)
def test_every_reader_follows_the_one_rule(records: dict[str, tuple[int, bytes]], name: str) -> None:
    stored, sys_flag, body, compressed = CASES[name]
    offset, raw = records[name]
    assert consumer_body(stored, sys_flag) == (body, compressed)
    for message in (stored_message(raw, offset), _general(raw, offset)):  # pull and GetMessage
        assert (message.body, message.body_compressed, message.sys_flag) == (body, compressed, sys_flag)
    (client,) = decode_records(raw)
    assert (client.body, client.body_compressed) == (body, compressed)
    assert decompress_body(stored, sys_flag) == (body, sys_flag & 0x1 == 0x1 and not compressed)
    v2 = query_pb2.StoredMessage(topic="Squeezed", queue_offset=0, msg_id="ID", body=body, body_compressed=compressed,
                                 sys_flag=sys_flag, born_host="127.0.0.1:1", store_host="127.0.0.1:2")
    received = to_v2(v2, definition_pb2.Resource(name="Squeezed"), 0, "r", 1000, 1)
    encoding = definition_pb2.Encoding.GZIP if compressed else definition_pb2.Encoding.IDENTITY
    assert (received.body, received.system_properties.body_encoding) == (body, encoding)


#: The bound, made small here (the rule reads it at each call): 64 MiB takes seconds to inflate.
BOUND = 1 << 20


@pytest.mark.parametrize("body, reason", [
    (b"not zlib", "is not zlib data"),
    (b"x", "ends before its zlib stream does"),
    (WHOLE + b"tail", "has 4 bytes after the end of its zlib stream"),
    (zlib.compress(bytes(BOUND + 1)), f"inflates to more than {BOUND} bytes"),
])
def test_the_rule_says_why_a_body_does_not_inflate(monkeypatch: pytest.MonkeyPatch, body: bytes, reason: str) -> None:
    monkeypatch.setattr(compression, "MAX_INFLATED_BODY_BYTES", BOUND)
    with pytest.raises(NotInflatable, match=reason):
        inflate(body)


def test_a_body_of_exactly_the_bound_inflates(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compression.MAX_INFLATED_BODY_BYTES == 64 * 1024 * 1024
    monkeypatch.setattr(compression, "MAX_INFLATED_BODY_BYTES", BOUND)
    assert len(inflate(zlib.compress(bytes(BOUND)))) == BOUND
