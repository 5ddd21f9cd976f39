"""The client commands of ``mqstore`` end to end, as a user runs them (subprocesses)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from mqstore.client.cli import parse_time
from tests.client.conftest import Run, eventually, run_cli
from tests.gateway.system_process import free_port_block


def _json_lines(run: Run) -> list[dict[str, Any]]:
    assert run.code == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


def _clean_failure(run: Run, code: int = 1) -> str:
    """A refused command: the given exit code, one ``mqstore...: error:`` line, no traceback."""
    assert run.code == code, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith("mqstore"), run.stderr
    return errors[0]


def test_send_pull_get_query_offset_topics(gateway: str, topic: str) -> None:
    g = ("--gateway", gateway)
    created = run_cli("topics", "create", topic, "--queues", "2", *g)
    assert created.code == 0 and topic in created.stdout and "rw" in created.stdout, created.stderr

    sent = _json_lines(run_cli("send", topic, "hello", "world", "--tags", "TagA", "--keys", "order-7 vip",
                               "--property", "origin=cli", "--json", *g))
    assert [r["status"] for r in sent] == ["PUT_OK", "PUT_OK"] and {r["topic"] for r in sent} == {topic}
    table = run_cli("send", "--topic", topic, "third", "--queue", "1", *g)
    assert table.code == 0 and table.stdout.splitlines()[0].split()[:3] == ["UNIQ_KEY", "QUEUE", "OFFSET"]

    pulled = eventually(lambda: _exactly(_json_lines(run_cli("pull", topic, "--json", *g)), 3))
    assert sorted(m["body"] for m in pulled) == ["hello", "third", "world"]
    hello = next(m for m in pulled if m["body"] == "hello")
    assert hello["tags"] == "TagA" and hello["keys"] == ["order-7", "vip"] and hello["properties"]["origin"] == "cli"
    assert hello["msg_id"] == sent[0]["msg_id"]

    shown = run_cli("get", str(sent[0]["msg_id"]), *g)
    assert shown.code == 0 and "order-7 vip" in shown.stdout and "hello" in shown.stdout, shown.stderr
    as_json = _json_lines(run_cli("get", str(sent[1]["offset_msg_id"]), "--json", *g))
    assert as_json[0]["body"] == "world"

    found = eventually(lambda: _exactly(
        _json_lines(run_cli("query", "--topic", topic, "--key", "vip", "--begin", "1h", "--json", *g)), 2))
    assert sorted(m["body"] for m in found) == ["hello", "world"]
    found_table = run_cli("query", "--topic", topic, "--key", "order-7", *g).stdout.splitlines()
    assert found_table[0].split() == ["QUEUE", "OFFSET", "UNIQ_KEY", "OFFSET_MSG_ID", "TAGS", "KEYS", "STORED", "BODY"]
    assert len(found_table) == 3 and all("order-7 vip" in row for row in found_table[1:])

    offsets = _json_lines(run_cli("offset", "--topic", topic, "--json", *g))
    assert [(o["queue_id"], o["min_offset"]) for o in offsets] == [(0, 0), (1, 0)]
    assert sum(int(o["max_offset"]) for o in offsets) == 3

    # A group pulls two, commits them; "offset show" sees that; a rewind makes it read again.
    group = f"{topic}_g"
    first = _json_lines(run_cli("pull", topic, "--group", group, "--max", "2", "--json", *g))
    assert len(first) == 2
    shown_offsets = _json_lines(run_cli("offset", "show", "--group", group, "--topic", topic, "--json", *g))
    assert sum(int(o["committed_offset"]) for o in shown_offsets) == 2
    rest = _json_lines(run_cli("pull", topic, "--group", group, "--json", *g))
    assert sorted(m["msg_id"] for m in first + rest) == sorted(m["msg_id"] for m in pulled)
    rewound = run_cli("offset", "commit", "--group", group, "--topic", topic, "--to", "min", *g)
    assert rewound.code == 0 and "COMMITTED" in rewound.stdout
    assert len(_json_lines(run_cli("pull", topic, "--group", group, "--json", *g))) == 3

    listed = run_cli("topics", *g)
    assert listed.code == 0 and any(line.split()[:3] == [topic, "2", "2"] for line in listed.stdout.splitlines())
    route = _json_lines(run_cli("topics", "route", topic, "--json", *g))
    assert [(q["queue_id"], q["readable"], q["writable"]) for q in route] == [(0, True, True), (1, True, True)]


def _exactly(items: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    assert len(items) == count, items
    return items


def test_uniq_key_and_offset_msg_id_are_named_alike_by_send_pull_get_and_query(gateway: str, topic: str) -> None:
    g = ("--gateway", gateway)
    [sent] = _json_lines(run_cli("send", topic, "hello", "--keys", "ids-1", "--queue", "0", "--json", *g))
    ids = (sent["uniq_key"], sent["offset_msg_id"])
    assert len(ids[0]) == 32 and len(ids[1]) == 32 and sent["msg_id"] == ids[0], "msg_id: the deprecated alias"
    [pulled] = eventually(lambda: _exactly(_json_lines(run_cli("pull", topic, "--json", *g)), 1))
    [by_uniq_key] = _json_lines(run_cli("get", ids[0], "--json", *g))
    [by_offset_id] = _json_lines(run_cli("get", ids[1], "--json", *g))
    [keyed] = eventually(lambda: _exactly(_json_lines(run_cli("query", "--topic", topic, "--key", "ids-1",
                                                               "--json", *g)), 1))
    for message in (pulled, by_uniq_key, by_offset_id, keyed):
        assert (message["uniq_key"], message["offset_msg_id"]) == ids, message

    sent_table = run_cli("send", topic, "again", "--queue", "0", *g).stdout.splitlines()
    assert sent_table[0].split()[:5] == ["UNIQ_KEY", "QUEUE", "OFFSET", "STATUS", "OFFSET_MSG_ID"]
    pulled_table = eventually(lambda: _exactly(run_cli("pull", topic, *g).stdout.splitlines(), 3))
    assert pulled_table[0].split() == ["QUEUE", "OFFSET", "UNIQ_KEY", "OFFSET_MSG_ID", "TAGS", "KEYS", "STORED",
                                       "BODY"]
    assert pulled_table[1].split()[2:4] == list(ids)
    shown = run_cli("get", ids[0], *g).stdout
    assert re.search(rf"^uniq key: +{ids[0]}$", shown, re.M), shown
    assert re.search(rf"^offset msg id: +{ids[1]}$", shown, re.M), shown

def test_send_a_file_with_a_progress_bar_keeps_output_clean(gateway: str, topic: str, tmp_path: Path) -> None:
    path = tmp_path / "messages.txt"
    path.write_text("".join(f"line {i}\n" for i in range(2000)) + "\n")  # the empty line is skipped
    streamed = run_cli("send", topic, "--file", str(path), "--gateway", gateway)
    assert streamed.code == 0, streamed.stderr
    assert "\r" not in streamed.stderr and "\x1b" not in streamed.stderr  # no bar when stderr is not a TTY
    assert "sent 2000 messages" in streamed.stderr
    rows = streamed.stdout.splitlines()
    assert rows[0].split() == ["QUEUE", "MESSAGES", "FIRST_OFFSET", "LAST_OFFSET"]
    assert sum(int(r.split()[1]) for r in rows[1:]) == 2000

    batched = run_cli("send", topic, "--file", "-", "--batch", "100", "--json", "--quiet", "--gateway", gateway,
                      stdin="".join(f"b{i}\n" for i in range(250)))
    receipts = _json_lines(batched)
    assert len(receipts) == 250 and batched.stderr == ""
    assert len({r["queue_id"] for r in receipts[:100]}) == 1


def test_user_mistakes_are_one_line_errors(gateway: str, topic: str) -> None:
    unknown = _clean_failure(run_cli("get", "0" * 32, "--gateway", gateway))
    assert "NOT_FOUND" in unknown
    bad = _clean_failure(run_cli("send", "bad topic!", "x", "--gateway", gateway))
    assert "INVALID_ARGUMENT" in bad and "illegal characters" in bad
    missing = _clean_failure(run_cli("topics", "route", "no_such_topic_here", "--gateway", gateway))
    assert "NOT_FOUND" in missing
    nobody = _clean_failure(run_cli("topics", "--gateway", f"127.0.0.1:{free_port_block(1)}", "--timeout", "5"))
    assert "UNAVAILABLE" in nobody and "cannot reach the gateway" in nobody
    no_file = _clean_failure(run_cli("send", topic, "--file", "/no/such/file", "--gateway", gateway))
    assert "/no/such/file" in no_file
    # Usage errors are one line and exit 1 too (README: "a mistake gives one line on stderr and exit code 1").
    _clean_failure(run_cli("send", topic, "--gateway", gateway), code=1)
    _clean_failure(run_cli("pull", topic, "--max", "-1"), code=1)
    _clean_failure(run_cli("query", "--topic", topic, "--begin", "yesterday-ish"), code=1)


@pytest.mark.parametrize(("text", "expected"), [
    ("1718000000000", 1718000000000),
    ("2024-06-10T08:00:00Z", 1718006400000),
    ("2024-06-10T10:00:00+02:00", 1718006400000),
])
def test_times_are_read_as_ms_or_iso(text: str, expected: int) -> None:
    assert parse_time(text) == expected


def test_ages_are_before_now() -> None:
    import time

    now = time.time() * 1000
    assert abs(parse_time("1h") - (now - 3_600_000)) < 5000
    assert abs(parse_time("15m ago") - (now - 900_000)) < 5000
