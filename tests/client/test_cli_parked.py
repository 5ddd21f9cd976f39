"""``mqstore send`` for delayed and timer messages, as a user types it: options between the topic and
the bodies, and a receipt table that says the queue/offset are the parking topic's."""

from __future__ import annotations

from mqstore.client import Client
from tests.client.conftest import run_cli


def test_options_between_topic_and_bodies(gateway: str, client: Client, topic: str) -> None:
    """``send T -p K=V text`` stores the text (argparse alone called it an unrecognized argument), and
    options given between the bodies apply to every message."""
    sent = run_cli("send", topic, "-p", "origin=cli", "first", "--tags", "TagA", "second", "--gateway", gateway)
    assert sent.code == 0, sent.stderr
    rows = sent.stdout.splitlines()
    assert len(rows) == 3 and rows[0].split() == ["UNIQ_KEY", "QUEUE", "OFFSET", "STATUS", "OFFSET_MSG_ID", "SHARD"]
    stored = [client.get_message(row.split()[0]) for row in rows[1:]]
    assert [m.body for m in stored] == [b"first", b"second"]
    assert all(m.tags == "TagA" and m.properties["origin"] == "cli" for m in stored)


def test_parked_messages_name_their_parking_topic(gateway: str, client: Client, topic: str) -> None:
    delayed = run_cli("send", topic, "--delay-level", "1", "later", "--gateway", gateway)
    timer = run_cli("send", topic, "-p", "TIMER_DELAY_SEC=60", "in a minute", "--gateway", gateway)
    for run, parking in ((delayed, "SCHEDULE_TOPIC_XXXX"), (timer, "rmq_sys_wheel_timer")):
        assert run.code == 0, run.stderr
        header, row = run.stdout.splitlines()
        assert header.split()[-1] == "PARKED_IN" and row.split()[-1] == parking
        msg_id = row.split()[0]
        assert client.get_message(msg_id).properties["REAL_TOPIC"] == topic


def test_dlq_table_headers_are_one_word_each(gateway: str, client: Client, topic: str) -> None:
    """Column names without spaces, so ``awk``/``cut`` see as many header words as cells."""
    sent = client.producer().send(topic, "dead")
    group = f"hdr_{topic}"
    client.send_back(group, sent.offset_msg_id, delay_level=-1)
    listed = run_cli("dlq", "list", "--group", group, "--gateway", gateway)
    assert listed.code == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["QUEUE_OFFSET", "OFFSET_MSG_ID", "UNIQ_KEY", "ORIGINAL_TOPIC", "RECONSUME", "BODY"]
    assert len(row.split()) == len(header.split())


def test_groups_names_an_unknown_group(gateway: str, topic: str) -> None:
    shown = run_cli("groups", f"nobody_{topic}", "--gateway", gateway)
    assert shown.code == 0 and f"group nobody_{topic} has no members and no committed offsets" in shown.stderr
