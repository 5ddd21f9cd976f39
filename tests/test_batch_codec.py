"""The batch blob codec (RocketMQ's MessageDecoder.encodeMessages layout): the client's encoder and the
store's decoder agree on every message, and any damage to a blob is refused naming a message, never
decoded into something else."""

from __future__ import annotations

import re
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.client.batch_encoder import decode_entries, encode_entry, properties_bytes
from services.store.errors import InvalidArgumentError
from services.store.rules import batch_codec

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), min_size=1,
                max_size=12)
_uniq = st.text("0123456789ABCDEF", min_size=32, max_size=32)
_message = st.tuples(st.binary(min_size=1, max_size=300), st.integers(0, 2**31 - 1),
                     st.dictionaries(_text.filter(lambda t: t != "UNIQ_KEY"), _text, max_size=5), st.none() | _uniq)


def _blob(messages: list[tuple[bytes, int, dict[str, str], str | None]]) -> bytes:
    return b"".join(encode_entry(body, flag, properties_bytes({**props, **({"UNIQ_KEY": key} if key else {})}))
                    for body, flag, props, key in messages)


@settings(max_examples=200, deadline=None)
@given(st.lists(_message, min_size=1, max_size=20))
def test_the_store_decodes_what_the_client_encodes(messages: list[tuple[bytes, int, dict[str, str], str | None]]
                                                   ) -> None:
    blob = _blob(messages)
    # The server's own encoder writes the same bytes.
    assert blob == batch_codec.encode_blob(
        (body, flag, {**props, **({"UNIQ_KEY": key} if key else {})}) for body, flag, props, key in messages)
    decoded = batch_codec.decode_blob(blob, "t", 3, 7, "1.2.3.4:5", 2, 1024)
    scan = batch_codec.scan_blob(blob, 1024)
    entries = batch_codec._scan_precise(blob, 1024)
    assert len(decoded) == len(entries) == scan.count == len(messages)
    assert [e.index for e in scan.missing] == [i for i, (_, _, _, key) in enumerate(messages) if not key]
    assert decoded == batch_codec._decode_precise(blob, "t", 3, 7, "1.2.3.4:5", 2, 1024)
    for (body, flag, props, key), message, scanned, (c_body, c_flag, c_props) in zip(
            messages, decoded, entries, decode_entries(blob), strict=True):
        expected = {**props, **({"UNIQ_KEY": key} if key else {})}
        assert (message.body, message.flag, message.properties) == (body, flag, expected)
        assert (c_body, c_flag, c_props) == (body, flag, expected)
        assert scanned.uniq_key == (key or "")
        assert (message.topic, message.queue_id, message.born_timestamp, message.born_host, message.sys_flag) == \
            ("t", 3, 7, "1.2.3.4:5", 2)


@settings(max_examples=100, deadline=None)
@given(st.lists(_message, min_size=1, max_size=5), st.data())
def test_added_uniq_keys_change_only_their_messages(messages: list[tuple[bytes, int, dict[str, str], str | None]],
                                                    data: st.DataObject) -> None:
    blob = _blob(messages)
    scan = batch_codec.scan_blob(blob, 1024)
    missing = {e.index: f"{e.index:032X}" for e in scan.missing}
    rewritten = batch_codec.with_uniq_keys(blob, scan.missing, missing)
    decoded = batch_codec.decode_blob(rewritten, "t", 0, 0, "1.2.3.4:5", 0, 1024)
    for i, ((body, _, props, key), message) in enumerate(zip(messages, decoded, strict=True)):
        assert message.body == body
        assert message.properties == {**props, "UNIQ_KEY": key or missing[i]}


@settings(max_examples=300, deadline=None)
@given(st.lists(_message, min_size=1, max_size=4), st.data())
def test_a_damaged_blob_is_refused_or_decodes_to_whole_messages(
        messages: list[tuple[bytes, int, dict[str, str], str | None]], data: st.DataObject) -> None:
    """Cut, extended or with a byte changed: either refused (naming a message) by both passes alike,
    or every entry still decodes whole (a changed body or property byte is a different message)."""
    blob = bytearray(_blob(messages))
    how = data.draw(st.sampled_from(["cut", "flip", "append"]))
    if how == "cut":
        del blob[data.draw(st.integers(1, len(blob) - 1)):]
    elif how == "flip":
        at = data.draw(st.integers(0, len(blob) - 1))
        blob[at] ^= data.draw(st.integers(1, 255))
    else:
        blob += data.draw(st.binary(min_size=1, max_size=30))
    damaged = bytes(blob)
    try:
        precise = batch_codec._scan_precise(damaged, 1024)
    except InvalidArgumentError as exc:
        assert "message #" in str(exc)
        with pytest.raises(InvalidArgumentError) as fast:
            batch_codec.scan_blob(damaged, 1024)
        assert str(fast.value) == str(exc)
        with pytest.raises(InvalidArgumentError):
            batch_codec.decode_blob(damaged, "t", 0, 0, "1.2.3.4:5", 0, 1024)
        return
    scanned = batch_codec.scan_blob(damaged, 1024)
    assert scanned.count == len(precise) and [e.index for e in scanned.missing] == \
        [e.index for e in precise if not e.uniq_key]
    try:
        decoded = batch_codec.decode_blob(damaged, "t", 0, 0, "1.2.3.4:5", 0, 1024)
    except InvalidArgumentError as exc:
        # The commitlog refuses repeated property names, which the gateway leaves to it.
        assert "appears twice" in str(exc)
        return
    assert len(decoded) == scanned.count
    assert decoded == batch_codec._decode_precise(damaged, "t", 0, 0, "1.2.3.4:5", 0, 1024)
    assert sum(batch_codec.ENTRY_OVERHEAD + len(m.body) + len(batch_codec.properties_bytes(m.properties))
               for m in decoded) <= len(damaged)


def test_a_trailing_separator_of_older_clients_is_accepted() -> None:
    blob = encode_entry(b"x", 0, b"TAGS\x01a\x02KEYS\x01k\x02")
    assert batch_codec.decode_blob(blob, "t", 0, 0, "h:1", 0, 8)[0].properties == {"TAGS": "a", "KEYS": "k"}
    assert [e.index for e in batch_codec.scan_blob(blob, 8).missing] == [0]


@pytest.mark.parametrize("props", [
    b"XUNIQ_KEY\x01abc",
    b"A\x01b\x02XUNIQ_KEY\x01" + b"0" * 32 + b"\x02UNIQ_KEY\x01" + b"1" * 32,
    b"UNIQ_KEY\x01" + b"a" * 56 + b"\x02",
])
def test_names_ending_in_uniq_key_take_the_precise_pass_with_the_same_outcome(props: bytes) -> None:
    blob = encode_entry(b"x", 0, props)
    assert batch_codec.scan_blob(blob, 8) == batch_codec.BlobScan(
        1, [e for e in batch_codec._scan_precise(blob, 8) if not e.uniq_key])
    assert batch_codec.decode_blob(blob, "t", 0, 0, "h:1", 0, 8) == \
        batch_codec._decode_precise(blob, "t", 0, 0, "h:1", 0, 8)


def test_the_frame_is_rocketmq_encode_message() -> None:
    """totalSize, magic 0, body CRC 0, flag, body length + body, int16 properties length + properties."""
    assert encode_entry(b"ab", 5, b"K\x01v") == struct.pack(">iiiii", 27, 0, 0, 5, 2) + b"ab" + b"\x00\x03K\x01v"


@pytest.mark.parametrize("props, sys_flag, body, refused", [
    (b"TRAN_MSG\x01true\x02PGROUP\x01pg", 0, b"x", "message #1: a transactional message (TRAN_MSG=true)"),
    (b"TRAN_MSG\x01True", 0, b"x", "message #1: a transactional message"),
    (b"TRAN_MSG\x01false", 0, b"x", None),
    (b"XTRAN_MSG\x01true", 0, b"x", None),
    (b"", 0x1, b"not zlib", "message #1: sys_flag 0x1 marks the body compressed, but the body is not zlib data"),
    (b"", 0x301, zlib.compress(b"abc")[:-1], "message #1: sys_flag 0x301 marks the body compressed, but the body "
                                                "ends before"),
    (b"", 0x1, zlib.compress(b"abc"), None),
    (b"", 0x101, b"LZ4 is stored as sent", None),
])
def test_both_passes_apply_the_batch_rules(props: bytes, sys_flag: int, body: bytes, refused: str | None) -> None:
    """What the fast passes leave to the precise ones (a TRAN_MSG property, a compressed batch)."""
    good = zlib.compress(b"fine") if sys_flag & 1 else b"fine"
    blob = encode_entry(good, 0, b"") + encode_entry(body, 0, props)
    if refused is None:
        assert batch_codec.scan_blob(blob, 8, sys_flag).count == 2
        assert [m.body for m in batch_codec.decode_blob(blob, "t", 0, 0, "h:1", sys_flag, 8)] == [good, body]
        return
    with pytest.raises(InvalidArgumentError, match=re.escape(refused)):
        batch_codec.scan_blob(blob, 8, sys_flag)
    with pytest.raises(InvalidArgumentError, match=re.escape(refused)):
        batch_codec.decode_blob(blob, "t", 0, 0, "h:1", sys_flag, 8)
