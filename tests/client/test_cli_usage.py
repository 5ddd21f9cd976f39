"""What the command line says when it is used wrongly or at its edges: one line and exit code 1 for a
mistake, a positional group for ``dlq`` like ``groups``, a clamped delay level said aloud, ``-q`` that
is quiet, ``perm`` in JSON as the table shows it, KEYS split as RocketMQ splits them, and a benchmark
run against the system that is already running."""

from __future__ import annotations

import json

import pytest

from mqstore.client import Client
from mqstore.client.models import OutgoingMessage
from tests.client.conftest import eventually, run_cli


@pytest.mark.parametrize("argv", [
    ("pull", "some_topic", "--offset", "1", "--latest"),   # parses, but does not make sense
    ("send", "some_topic", "body", "--no-such-option"),    # argparse's own error
    ("pull", "some_topic", "--max", "many"),               # a bad value
    ("no-such-command",),
])
def test_a_malformed_command_line_is_one_line_and_exit_1(gateway: str, argv: tuple[str, ...]) -> None:
    done = run_cli(*argv, "--gateway", gateway)
    assert done.code == 1, done
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "usage:" not in done.stderr and "error:" in done.stderr and "--help" in done.stderr


def test_dlq_takes_the_group_as_its_first_positional_like_groups(gateway: str, client: Client, topic: str) -> None:
    sent = client.producer().send(topic, "to the DLQ")
    group = f"pos_{topic}"
    dead = client.send_back(group, sent.offset_msg_id, delay_level=-1)
    listed = run_cli("dlq", "list", group, "--gateway", gateway, "--json")
    assert listed.code == 0, listed.stderr
    assert [json.loads(line)["offset_msg_id"] for line in listed.stdout.splitlines()] == [dead.send.offset_msg_id]
    shown = run_cli("dlq", "show", group, dead.send.offset_msg_id, "--gateway", gateway)
    assert shown.code == 0 and "to the DLQ" in shown.stdout, shown.stderr
    both = run_cli("dlq", "list", group, "--group", "another", "--gateway", gateway)
    assert both.code == 1 and "two groups" in both.stderr
    no_id = run_cli("dlq", "show", group, "--gateway", gateway)
    assert no_id.code == 1 and "msg id" in no_id.stderr


def test_a_delay_level_beyond_the_last_is_stored_at_the_last_with_a_warning(gateway: str, topic: str) -> None:
    done = run_cli("send", topic, "later", "--delay-level", "99", "--gateway", gateway, "--json")
    assert done.code == 0, done.stderr
    receipt = json.loads(done.stdout)
    assert receipt["topic"] == "SCHEDULE_TOPIC_XXXX" and receipt["queue_id"] == 17
    assert "--delay-level 99" in done.stderr and "stored at level 18" in done.stderr
    fine = run_cli("send", topic, "sooner", "--delay-level", "18", "--gateway", gateway)
    assert fine.code == 0 and "warning" not in fine.stderr


def test_status_quiet_prints_the_table_only(gateway: str) -> None:
    loud = run_cli("status", "--gateway", gateway)
    quiet = run_cli("status", "-q", "--gateway", gateway)
    assert loud.code == quiet.code == 0, quiet.stderr
    assert "healthy" in loud.stderr
    # The same table (its figures may move between the two calls: the system is live).
    assert quiet.stderr == "" and quiet.stdout.splitlines()[0] == loud.stdout.splitlines()[0]
    assert len(quiet.stdout.splitlines()) == len(loud.stdout.splitlines())


def test_topics_json_gives_perm_as_the_table_does(gateway: str, topic: str) -> None:
    assert run_cli("topics", "create", topic, "--queues", "2", "--perm", "r", "--gateway", gateway).code == 0
    listed = run_cli("topics", "--json", "--gateway", gateway)
    rows = {row["topic"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert rows[topic]["perm"] == "r-" and rows[topic]["perm_bits"] == 4
    table = run_cli("topics", "--gateway", gateway)
    assert any(line.split()[0] == topic and line.split()[-1] == "r-" for line in table.stdout.splitlines())


def test_keys_are_split_at_white_space_as_rocketmq_does(client: Client, topic: str) -> None:
    sent = client.producer().send(topic, "two keys", keys="has space")
    message = eventually(lambda: client.get_message(sent.msg_id))
    assert message.keys == ("has", "space")
    with pytest.raises(ValueError, match="white space"):
        OutgoingMessage(body=b"x", topic=topic, keys=["has space"]).to_proto()


def test_bench_runs_against_the_running_system(gateway: str) -> None:
    done = run_cli("bench", "--gateway", gateway, "--cases", "send", "--tiny", "--duration", "1", "--reps", "1",
                   "--quiet", timeout=120)
    assert done.code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"the running system at {gateway}" in done.stdout
    assert "starting mqstore up" not in done.stderr and "send 1x1" in done.stdout


def test_get_of_an_unknown_uniq_key_says_only_that(gateway: str) -> None:
    """A UNIQ_KEY whose digits make no offset msg id (the port field 0x26251A2C is out of range): the
    answer is that no message has it, not why it is no offset msg id."""
    done = run_cli("get", "7F00000126251A2C0000000000000000", "--gateway", gateway)
    assert done.code == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "NOT_FOUND" in done.stderr and "no message has UNIQ_KEY 7F00000126251A2C0000000000000000" in done.stderr
    assert "port field" not in done.stderr
