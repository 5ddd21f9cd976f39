"""Consumer groups end to end (real processes): three PullConsumer processes join one group one after
another on a topic with eight queues while a producer keeps sending, then one is killed with kill -9.

What must hold (issue 11): after each change every queue is owned by exactly one live member within one
rebalance interval + the member timeout; no message waits longer than that to be consumed; every
message is consumed (none skipped; duplicates, which at-least-once allows, are counted); DescribeGroups
reports lag = max offset - committed offset.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mqstore.client import Client, Producer, PullConsumer
from mqstore.client.groups import describe_groups
from mqstore.client.models import Message
from tests.client.conftest import eventually, run_cli

QUEUES = 8
INTERVAL_S = 1.0
TIMEOUT_S = 3.0
#: Scheduling noise on a shared 2-core machine (process start, GC, a busy gateway).
SLACK_S = 3.0
#: Long enough that a kill -9 leaves messages handed out but not committed (they come again: duplicates).
COMMIT_INTERVAL_S = 1.0
#: Messages sent per second (round robin over the queues).
RATE = 20
#: A message is consumed within this long of being sent, whatever happens to the members.
BOUND_S = INTERVAL_S + TIMEOUT_S + SLACK_S


def member_main(gateway: str, group: str, topic: str) -> None:
    """One consumer process: prints each message and each change of its queues as JSON lines."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    consumer = PullConsumer(group, topic, gateway, rebalance_interval_s=INTERVAL_S, member_timeout_s=TIMEOUT_S,
                            commit_interval_s=COMMIT_INTERVAL_S, long_poll_ms=200)

    def emit(**event: object) -> None:
        print(json.dumps({"t": time.time(), **event}), flush=True)

    held: list[int] = []
    while not stopping.is_set():
        for m in consumer.poll(64, timeout=0.2):
            emit(event="msg", q=m.queue_id, o=m.queue_offset, b=m.body.decode())
        now = consumer.assignment()[topic]
        if now != held:
            held = now
            emit(event="assign", queues=held, client_id=consumer.client_id)
    consumer.close()
    emit(event="closed")


@dataclass
class Member:
    proc: subprocess.Popen[bytes]
    out: Path

    def events(self) -> list[dict[str, object]]:
        lines = self.out.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]

    def queues(self) -> list[int]:
        assigns = [e for e in self.events() if e["event"] == "assign"]
        return list(assigns[-1]["queues"]) if assigns else []  # type: ignore[call-overload]

    def client_id(self) -> str | None:
        assigns = [e for e in self.events() if e["event"] == "assign"]
        return str(assigns[-1]["client_id"]) if assigns else None


@dataclass
class Sender:
    producer: Producer
    topic: str
    sent: dict[str, tuple[int, float]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            body = f"m{n}"
            queue_id = n % QUEUES
            at = time.time()
            self.producer.send(self.topic, body, queue_id=queue_id)
            self.sent[body] = (queue_id, at)
            n += 1
            time.sleep(1 / RATE)


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()


def _start(members: list[Member], tmp_path: Path, gateway: str, group: str, topic: str) -> Member:
    out = tmp_path / f"member{len(members)}.jsonl"
    root = Path(__file__).resolve().parents[2]
    code = "import sys; from tests.client.test_consumer_groups import member_main; member_main(*sys.argv[1:])"
    with out.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-c", code, gateway, group, topic], stdout=sink,
                                stderr=subprocess.STDOUT, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    member = Member(proc, out)
    members.append(member)
    return member


def _settled(client: Client, group: str, topic: str, live: list[Member], deadline_s: float) -> float:
    """Waits until every queue is owned by exactly one of ``live`` (by their own account and by
    DescribeGroups), each with the average share; returns how long it took."""
    started = time.monotonic()
    while True:
        owned = [q for m in live for q in m.queues()]
        ids = [m.client_id() for m in live]
        shares = sorted(len(m.queues()) for m in live)
        expected = sorted([QUEUES // len(live) + (1 if i < QUEUES % len(live) else 0) for i in range(len(live))])
        if sorted(owned) == list(range(QUEUES)) and shares == expected:
            (described,) = describe_groups(client, group)
            owners = {q.queue_id: q.owner for q in described.queues if q.topic == topic}
            if sorted(m.client_id for m in described.members) == sorted(ids) and \
                    sorted(owners) == list(range(QUEUES)) and set(owners.values()) == set(ids):
                return time.monotonic() - started
        if time.monotonic() - started > deadline_s:
            raise AssertionError(f"not settled after {deadline_s}s: {[m.queues() for m in live]}")
        time.sleep(0.1)


def test_three_members_join_then_one_is_killed(gateway: str, client: Client, topic: str, tmp_path: Path,
                                               members: list[Member]) -> None:
    group = f"g_{topic}"[:200]
    client.create_topic(topic, QUEUES)
    sender = Sender(client.producer(), topic)
    thread = threading.Thread(target=sender.run, daemon=True)
    thread.start()
    try:
        a = _start(members, tmp_path, gateway, group, topic)
        _settled(client, group, topic, [a], 30)  # the first start includes the interpreter's
        b = _start(members, tmp_path, gateway, group, topic)
        took_b = _settled(client, group, topic, [a, b], 15)
        c = _start(members, tmp_path, gateway, group, topic)
        took_c = _settled(client, group, topic, [a, b, c], 15)
        time.sleep(1)
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()
        killed_at = time.monotonic()
        took_kill = _settled(client, group, topic, [a, c], BOUND_S + 10)
        assert time.monotonic() - killed_at <= BOUND_S, "the killed member's queues were not taken over in time"
        time.sleep(1)
    finally:
        sender.stop.set()
        thread.join()
    total = len(sender.sent)
    # Everything sent is consumed by someone.
    deadline = time.monotonic() + BOUND_S + 10
    while True:
        seen = Counter(str(e["b"]) for m in members for e in m.events() if e["event"] == "msg")
        missing = set(sender.sent) - set(seen)
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not missing, f"{len(missing)} of {total} messages never consumed, e.g. {sorted(missing)[:5]}"
    duplicates = sum(n - 1 for n in seen.values())
    first_seen: dict[str, float] = {}
    for m in members:
        for e in m.events():
            if e["event"] == "msg":
                body, at = str(e["b"]), float(e["t"])  # type: ignore[arg-type]
                first_seen[body] = min(first_seen.get(body, at), at)
    waits = sorted(first_seen[b] - sent_at for b, (_, sent_at) in sender.sent.items())
    print(f"\n{total} messages, {duplicates} duplicates; settled after join b {took_b:.1f}s, join c {took_c:.1f}s, "
          f"kill -9 b {took_kill:.1f}s; consume wait p50 {waits[len(waits) // 2]:.2f}s max {waits[-1]:.2f}s")
    assert waits[-1] <= BOUND_S, f"a message waited {waits[-1]:.1f}s to be consumed"
    # Only the killed member's messages since its last commit come twice (clean hand-overs commit first).
    assert duplicates <= RATE * (COMMIT_INTERVAL_S + SLACK_S), duplicates
    # The live members stop cleanly (commit, unregister); lag is then 0 and matches the offsets.
    for m in (a, c):
        m.proc.send_signal(signal.SIGTERM)
    for m in (a, c):
        assert m.proc.wait(timeout=30) == 0, m.out.read_text()[-2000:]
    (described,) = describe_groups(client, group)
    assert described.members == []
    queues = {q.queue_id: q for q in described.queues if q.topic == topic}
    assert sorted(queues) == list(range(QUEUES))
    for queue_id, q in queues.items():
        offsets = client.queue_offsets(topic, queue_id)
        committed = client.committed_offset(group, topic, queue_id)
        assert (q.max_offset, q.committed_offset) == (offsets.max_offset, committed)
        assert q.lag == offsets.max_offset - (committed or 0) == 0
    assert described.total_lag == 0


def test_a_member_that_leaves_hands_its_queues_over_at_once(gateway: str, client: Client, topic: str) -> None:
    """close() commits and unregisters: the other member takes the queues at its next round (no
    member timeout), from the committed offsets (nothing delivered twice)."""
    group = f"g_{topic}"[:200]
    client.create_topic(topic, 4)
    producer = client.producer()
    for i in range(40):
        producer.send(topic, f"m{i}", queue_id=i % 4)
    options = {"rebalance_interval_s": 0.5, "member_timeout_s": 30.0, "long_poll_ms": 100}
    first = client.consumer(group, topic, **options)
    second = client.consumer(group, topic, **options)
    got: list[str] = []
    got += [m.body.decode() for m in first.poll(10, timeout=0.2)]
    got += [m.body.decode() for m in second.poll(10, timeout=0.2)]
    deadline = time.monotonic() + 10
    while sorted(first.queue_ids + second.queue_ids) != [0, 1, 2, 3] or not first.queue_ids or not second.queue_ids:
        got += [m.body.decode() for m in first.poll(5, timeout=0.1)]
        got += [m.body.decode() for m in second.poll(5, timeout=0.1)]
        assert time.monotonic() < deadline, (first.queue_ids, second.queue_ids)
    first.close()
    for i in range(40, 80):
        producer.send(topic, f"m{i}", queue_id=i % 4)
    deadline = time.monotonic() + 10
    while len(set(got)) < 80 or second.queue_ids != [0, 1, 2, 3]:
        got += [m.body.decode() for m in second.poll(40, timeout=0.2)]
        assert time.monotonic() < deadline, f"{second.queue_ids} {sorted(set(got))}"
    assert sorted(got, key=lambda b: int(b[1:])) == [f"m{i}" for i in range(80)], "one delivery each"
    second.close()


def test_explicit_queues_or_rebalance_off_do_not_join(gateway: str, client: Client, topic: str) -> None:
    group = f"g_{topic}"[:200]
    client.create_topic(topic, 2)
    with client.consumer(group, topic, queue_ids=[1]) as explicit, \
            client.consumer(group, topic, rebalance=False) as everything:
        explicit.poll(timeout=0)
        everything.poll(timeout=0)
        assert explicit.queue_ids == [1] and everything.queue_ids == [0, 1]
        assert explicit.client_id is None and everything.client_id is None
        (described,) = describe_groups(client, group)
        assert described.members == []


def test_groups_cli_shows_members_queues_and_lag(gateway: str, client: Client, topic: str) -> None:
    group = f"cli_{topic}"[:200]
    client.create_topic(topic, 2)
    producer = client.producer()
    for i in range(3):
        producer.send(topic, f"m{i}", queue_id=0)
    with client.consumer(group, topic, rebalance_interval_s=5.0) as consumer:
        eventually(lambda: _consumed(consumer, 1))
        consumer.commit()
        shown = run_cli("groups", group, "--gateway", gateway, "--json")
        assert shown.code == 0, shown.stderr
        (info,) = [json.loads(line) for line in shown.stdout.splitlines()]
        assert [m["client_id"] for m in info["members"]] == [consumer.client_id]
        rows = {q["queue_id"]: (q["max_offset"], q["committed_offset"], q["lag"], q["owner"]) for q in info["queues"]}
        committed = consumer.positions()[0]
        assert rows[0] == (3, committed, 3 - committed, consumer.client_id)
        assert rows[1] == (0, 0, 0, consumer.client_id)
        table = run_cli("groups", "--gateway", gateway)
        assert table.code == 0 and group in table.stdout and consumer.client_id in table.stdout, table.stderr
        assert table.stdout.splitlines()[0].split() == ["GROUP", "TOPIC", "QUEUE", "SHARD", "MAX_OFFSET", "COMMITTED",
                                                        "LAG", "MEMBER"]
    bad = run_cli("groups", "bad group", "--gateway", gateway)
    assert bad.code == 1 and "INVALID_ARGUMENT" in bad.stderr


def _consumed(consumer: PullConsumer, at_least: int) -> None:
    assert len(consumer.poll(at_least, timeout=0.5)) >= at_least


def test_a_member_that_dies_before_committing_has_its_messages_delivered_again(client: Client, topic: str) -> None:
    """At-least-once: what a dead member handed out but never committed comes again from the member
    that takes its queues once the group dropped it (nothing skipped)."""
    group = f"g_{topic}"[:200]
    client.create_topic(topic, 2)
    producer = client.producer()
    for i in range(10):
        producer.send(topic, f"m{i}", queue_id=i % 2)
    options = {"rebalance_interval_s": 0.5, "member_timeout_s": 1.5, "long_poll_ms": 100}
    dying = client.consumer(group, topic, commit_interval_s=3600, **options)
    handed_out = eventually(lambda: _taken(dying, 4))
    # ``dying`` is abandoned (no commit, no unregister), as a killed process would be.
    survivor = client.consumer(group, topic, **options)
    got: list[str] = []
    deadline = time.monotonic() + 15
    while len(set(got)) < 10:
        got += [m.body.decode() for m in survivor.poll(10, timeout=0.2)]
        assert time.monotonic() < deadline, sorted(got)
    assert sorted(got, key=lambda b: int(b[1:])) == [f"m{i}" for i in range(10)]
    assert {m.body.decode() for m in handed_out} <= set(got), "the dead member's messages came again"
    assert survivor.queue_ids == [0, 1]
    survivor.close()


def _taken(consumer: PullConsumer, at_least: int) -> list[Message]:
    messages = consumer.poll(at_least, timeout=0.5)
    assert len(messages) >= at_least
    return messages


def test_a_member_of_several_topics_gets_its_share_of_each(client: Client, topic: str) -> None:
    group = f"g_{topic}"[:200]
    other = f"{topic}_b"
    for name in (topic, other):
        client.create_topic(name, 2)
    producer = client.producer()
    sent = {(name, f"{name}:{i}") for name in (topic, other) for i in range(8)}
    for name, body in sorted(sent):
        producer.send(name, body, queue_id=int(body.rsplit(":", 1)[1]) % 2)
    options = {"rebalance_interval_s": 0.5, "member_timeout_s": 5.0, "long_poll_ms": 100}
    first = client.consumer(group, [topic, other], **options)
    second = client.consumer(group, [topic, other], **options)
    got: list[tuple[str, str]] = []
    deadline = time.monotonic() + 15
    # Which member comes first in the group's sorted member ids (random client ids) is not known: each
    # gets one queue of each topic, the same index of both.
    shares = [{topic: [0], other: [0]}, {topic: [1], other: [1]}]

    def split() -> bool:
        return sorted((first.assignment(), second.assignment()), key=str) == shares

    while len(set(got)) < len(sent) or not split():
        for consumer in (first, second):
            got += [(m.topic, m.body.decode()) for m in consumer.poll(16, timeout=0.1)]
        assert time.monotonic() < deadline, (first.assignment(), second.assignment(), len(set(got)))
    assert set(got) == sent
    assert first.topics == [topic, other]
    first.close()
    second.close()


def test_several_topics_without_a_group_and_what_needs_one_topic(client: Client, topic: str) -> None:
    other = f"{topic}_b"
    producer = client.producer()
    producer.send(topic, "one")
    producer.send(other, "two")
    with client.consumer(None, [topic, other]) as consumer:
        got: set[tuple[str, str]] = set()
        deadline = time.monotonic() + 10
        while len(got) < 2:
            got |= {(m.topic, m.body.decode()) for m in consumer.poll(10, timeout=0.5)}
            assert time.monotonic() < deadline, got
        assert got == {(topic, "one"), (other, "two")}
    with pytest.raises(ValueError, match="single topic"):
        client.consumer("g", [topic, other], queue_ids=[0])
    with pytest.raises(ValueError, match="distinct topics"):
        client.consumer("g", [topic, topic])
