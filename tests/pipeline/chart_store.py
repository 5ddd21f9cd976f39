"""A store for the stats report's charts: what an operator's store holds and each chart must get right.

Twenty minutes of traffic from three producer hosts, each sending from many ephemeral ports, to ten
application topics of very different volumes whose names sort the small ones first, alongside the
broker's own topics (a consumer group's ``%RETRY%`` and ``%DLQ%``, ``SCHEDULE_TOPIC_XXXX``, the
transaction half and op topics: the op records are born at the store's own address). The biggest
topic stops for four minutes; ``Orders`` gets delayed messages (DELAY level 6, two minutes) that the
scheduler re-puts when due, born two minutes before they are stored.

Records are encoded directly with chosen store times (the commitlog engine stamps the wall clock), so
the store and its charts are the same on every run. Kept apart from conftest.py so that
``tools/stats_charts.py`` (the docs' images) builds the same store without pytest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from services.store.formats.commitlog_walk import commitlog_file_name
from services.store.formats.message import properties_to_string
from services.store.formats.record import encode_blank, encode_record
from services.store.formats.socket_address import encode_address

START_MS = 1_767_600_000_000  # 2026-01-05 08:00 UTC
MINUTES = 20
FILE_SIZE = 1 << 20
STORE_HOST = "10.1.0.5:10911"
PRODUCER_HOSTS = ("10.0.1.11", "10.0.1.12", "10.0.1.13")
#: messages per minute and body size per application topic (names chosen so that the biggest sort last)
TOPICS = {"TradeEvents": (90, 120), "Shipments": (60, 1500), "Orders": (45, 400), "Payments": (30, 300),
          "Billing": (12, 200), "Audit": (8, 100), "Alerts": (5, 80), "Coupons": (3, 60), "Clicks": (2, 40),
          "Accounts": (1, 500)}
#: minutes (from START_MS) in which TradeEvents sends nothing
QUIET = range(8, 12)
DELAY_LEVEL = 6
DELAY_MS = 120_000
DELAYED_PER_MINUTE = 4
TRANSACTIONS_PER_MINUTE = 40
GROUP = "billing-cg"


@dataclass
class ChartStore:
    """What was written, for the tests' expectations."""

    root: Path
    messages: dict[str, int] = field(default_factory=dict)  # per topic
    per_host: dict[str, int] = field(default_factory=dict)  # per producer host, store-born records left out
    delayed: int = 0  # scheduled deliveries (re-puts under Orders)
    store_born: int = 0
    max_latency_ms: int = 0  # of every record but the scheduled deliveries


@dataclass(frozen=True)
class _Record:
    store_ms: int
    topic: str
    body: bytes
    born_ms: int
    born_host: str
    properties: dict[str, str]


def _events(rng: random.Random, out: ChartStore) -> list[_Record]:
    events: list[_Record] = []

    def put(topic: str, store_ms: int, size: int, host: str, latency_ms: int, **props: str) -> None:
        events.append(_Record(store_ms, topic, rng.randbytes(size), store_ms - latency_ms, host, props))
        out.messages[topic] = out.messages.get(topic, 0) + 1
        if host == STORE_HOST:
            out.store_born += 1
        else:
            ip = host.rsplit(":", 1)[0]
            out.per_host[ip] = out.per_host.get(ip, 0) + 1
        if "REAL_TOPIC" not in props or topic == "SCHEDULE_TOPIC_XXXX":
            out.max_latency_ms = max(out.max_latency_ms, latency_ms)

    def producer(weights: tuple[int, ...] = (6, 3, 1)) -> str:
        ip = rng.choices(PRODUCER_HOSTS, weights)[0]
        return f"{ip}:{rng.randrange(32768, 61000)}"  # a new connection, a new ephemeral port

    def latency() -> int:
        return rng.randrange(1, 25) if rng.random() < 0.97 else rng.randrange(100, 400)

    for minute in range(MINUTES):
        base = START_MS + minute * 60_000
        for topic, (per_minute, size) in TOPICS.items():
            if topic == "TradeEvents" and minute in QUIET:
                continue
            for _ in range(per_minute):
                put(topic, base + rng.randrange(60_000), rng.randrange(size // 2, size * 2), producer(), latency())
        for _ in range(4):
            put("%RETRY%" + GROUP, base + rng.randrange(60_000), 200, producer((0, 0, 1)), latency(),
                REAL_TOPIC="Billing", RETRY_TOPIC="Billing")
        if minute % 5 == 4:
            put("%DLQ%" + GROUP, base + rng.randrange(60_000), 200, producer((0, 0, 1)), latency())
        for _ in range(TRANSACTIONS_PER_MINUTE):
            at = base + rng.randrange(59_000)
            put("RMQ_SYS_TRANS_HALF_TOPIC", at, 300, producer((1, 1, 0)), latency(), TRAN_MSG="true",
                REAL_TOPIC="Payments", REAL_QID="0")
            put("RMQ_SYS_TRANS_OP_HALF_TOPIC", at + rng.randrange(50, 900), 1, STORE_HOST, 0, TAGS="d")
        for _ in range(DELAYED_PER_MINUTE):
            at = base + rng.randrange(60_000)
            host = producer()
            props = {"DELAY": str(DELAY_LEVEL), "REAL_TOPIC": "Orders", "REAL_QID": "0"}
            lag = latency()
            put("SCHEDULE_TOPIC_XXXX", at, 400, host, lag, **props)
            if at - lag + DELAY_MS + 5 < START_MS + MINUTES * 60_000:  # due within the store's time
                put("Orders", at + DELAY_MS + rng.randrange(5, 200), 400, host, DELAY_MS + lag, **props)
                out.delayed += 1
    return sorted(events, key=lambda e: e.store_ms)


def write_chart_store(root: Path, seed: int = 3) -> ChartStore:
    """Write the store's commitlog (1 MiB files, BLANK-filled at each roll) under ``root``."""
    out = ChartStore(root)
    directory = root / "commitlog"
    directory.mkdir(parents=True)
    queue_offsets: dict[str, int] = {}
    store_host = encode_address(STORE_HOST)
    file_start, data = 0, bytearray()
    for event in _events(random.Random(seed), out):
        queue_offset = queue_offsets.get(event.topic, 0)
        queue_offsets[event.topic] = queue_offset + 1
        fields = dict(topic=event.topic.encode(), queue_id=0, body=event.body, flag=0,
                      properties=properties_to_string(event.properties).encode(), sys_flag=0,
                      born_timestamp=event.born_ms, born_host=encode_address(event.born_host),
                      store_host=store_host, queue_offset=queue_offset, store_timestamp=event.store_ms)
        record = encode_record(commitlog_offset=file_start + len(data), **fields)
        if len(data) + len(record) + 8 > FILE_SIZE:  # RocketMQ leaves room for a BLANK's 8 bytes
            data += encode_blank(FILE_SIZE - len(data))
            (directory / commitlog_file_name(file_start)).write_bytes(bytes(data).ljust(FILE_SIZE, b"\0"))
            file_start, data = file_start + FILE_SIZE, bytearray()
            record = encode_record(commitlog_offset=file_start, **fields)
        data += record
    (directory / commitlog_file_name(file_start)).write_bytes(bytes(data).ljust(FILE_SIZE, b"\0"))
    return out
