"""What a soak runs: the four services as separate processes, producers that record every
acknowledged send, and a chaos thread that kills services with SIGKILL and restarts them.

The services are started exactly as ``mqstore up`` starts them (``services.runner.child_specs``: the
same commands, the same store layout under one root) but each as its own child of this process, on
fixed loopback ports, so any one of them can be killed and restarted on its own address while the
others keep running.

Producers send through the gateway with ``mqstore.client.Producer``. Every message carries its own
UNIQ_KEY, so a retry after an ambiguous failure (a killed service) sends the same message again and
the checks can tell a legitimate duplicate (the message was retried) from a wrong one.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.services import free_port_block
from mqstore.client import Client, Producer
from mqstore.client.errors import MqstoreError
from mqstore.client.models import OutgoingMessage, SendReceipt
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, indexer_pb2, indexer_pb2_grpc
from services.runner import Addresses, ChildSpec, child_specs
from services.server.channels import sync_channel
from services.store.formats.commitlog_walk import commitlog_file_name, iter_commitlog
from services.store.formats.record import encode_blank
from tests.commitlog.commitlog_process import CommitLogProcess, ServiceProcess, spawn_service
from tests.geometry import GeometryPreset
from tests.indexer.indexer_process import IndexerProcess
from tests.query.query_process import QueryProcess

#: Start order (``mqstore up``'s); a clean stop goes the other way.
SERVICES = ("commitlog", "indexer", "query", "gateway")
#: The store host (brokerIP1, listenPort) each commitlog start writes into its records, in turn: a
#: broker whose address changed (a rescheduled pod), and an IPv6 one (other record layout, 56-digit ids).
STORE_HOSTS = (("127.0.0.1", 10911), ("::1", 10911), ("127.0.0.1", 10999))
#: Topics the producers write: the first is created up front with 3 queues, the others by their first send.
TOPICS = ("SoakCreated", "SoakAuto", "SoakAutoToo")
CREATED_TOPIC_QUEUES = 3
#: Messages of one producer that share a "g-" key, so a key query has a few answers (never more than
#: a query returns) whatever the run's length.
KEY_GROUP = 8
#: How long a message is retried before the producer gives up on it (and reports that).
RETRY_FOR_S = 120.0
#: Failures a retry cannot cure: the store refused the message itself.
REFUSALS = ("INVALID_ARGUMENT",)


class GatewayProcess(ServiceProcess):
    service_name = "mqstore.v1.MessagingService"


_HANDLES: dict[str, type[ServiceProcess]] = {"commitlog": CommitLogProcess, "indexer": IndexerProcess,
                                             "query": QueryProcess, "gateway": GatewayProcess}


def commitlog_file_count(root: Path) -> int:
    """Files holding data, so far (the preallocated next file, removed by a clean stop, not counted)."""
    directory = root / "commitlog"
    return sum(1 for _ in directory.iterdir()) - 1 if directory.is_dir() else 0


class SoakSystem:
    """commitlog, indexer, query and gateway on ``root`` (``mqstore up``'s layout), each killable alone."""

    def __init__(self, root: Path, geometry: GeometryPreset, log_dir: Path) -> None:
        self.root = root
        self.geometry = geometry
        self.log_dir = log_dir
        base = free_port_block(4)
        self.addresses = Addresses(*(f"127.0.0.1:{base + i}" for i in range(4)))
        self.specs = {spec.name: spec for spec in child_specs(root, None, self.addresses, metrics_base_port=None)}
        self.handles: dict[str, ServiceProcess] = {}
        self.starts: Counter[str] = Counter()
        root.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)

    @property
    def gateway(self) -> str:
        return self.addresses.gateway

    def env(self, service: str) -> dict[str, str]:
        env = {**self.geometry.env(), "MQSTORE_LOG_LEVEL": "INFO"}
        if service == "commitlog":  # each start writes its records under the next store host
            host, port = STORE_HOSTS[(self.starts[service] - 1) % len(STORE_HOSTS)]
            env |= {"MQSTORE_BROKER_IP": host, "MQSTORE_LISTEN_PORT": str(port)}
        return env

    def start(self, name: str, timeout_s: float = 90.0) -> ServiceProcess:
        """Start (or restart) one service on its address; returns once it reports SERVING."""
        handle = self.spawn(self.specs[name], timeout_s)
        self.handles[name] = handle
        return handle

    def spawn(self, spec: ChildSpec, timeout_s: float = 90.0) -> ServiceProcess:
        """A process of ``spec`` (a spec of this system, or one derived from it), once SERVING."""
        self.starts[spec.name] += 1
        log_path = self.log_dir / f"{spec.name}-{self.starts[spec.name]}.log"
        port = int(spec.listen.rpartition(":")[2])
        handle = _HANDLES[spec.name](self.root, port, spawn_service(spec.args, self.env(spec.name), log_path), log_path)
        try:
            handle.wait_serving(timeout_s)
        except BaseException:
            handle.kill9()
            raise
        return handle

    def start_all(self) -> None:
        for name in SERVICES:
            self.start(name)

    def kill9(self, name: str) -> None:
        self.handles[name].kill9()

    def stop_all(self) -> dict[str, int]:
        """SIGTERM each running service, readers first; returns the exit codes (0 = clean)."""
        codes = {}
        for name in reversed(SERVICES):
            handle = self.handles.get(name)
            if handle is not None and handle.running:
                codes[name] = handle.stop(60)
        return codes

    def kill_all(self) -> None:
        """Teardown's last resort: SIGKILL whatever still runs (only our own children)."""
        for handle in self.handles.values():
            if handle.running:
                handle.kill9()

    def store_info(self) -> commitlog_pb2.StoreInfo:
        with sync_channel(self.addresses.commitlog) as channel:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
            return stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10)

    def wait_indexer_caught_up(self, timeout_s: float, indexer: str | None = None) -> str | None:
        """None once the indexer's reput offset reaches the commitlog's end, else what it is stuck at."""
        return wait_caught_up(self.addresses.commitlog, indexer or self.addresses.indexer, timeout_s)

    def logs_tail(self, name: str, lines: int = 15) -> str:
        handle = self.handles.get(name)
        return "\n".join(handle.logs().splitlines()[-lines:]) if handle else ""


def wait_caught_up(commitlog: str, indexer: str, timeout_s: float) -> str | None:
    """Poll until the indexer at ``indexer`` has dispatched everything the commitlog at ``commitlog`` holds."""
    deadline = time.monotonic() + timeout_s
    with sync_channel(commitlog) as cl_channel, sync_channel(indexer) as ix_channel:
        commitlog_stub = commitlog_pb2_grpc.CommitLogServiceStub(cl_channel)
        indexer_stub = indexer_pb2_grpc.IndexerServiceStub(ix_channel)
        status = None
        while True:
            end = commitlog_stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10).max_offset
            status = indexer_stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=10)
            if status.reput_offset >= end:
                return None
            if time.monotonic() > deadline:
                return (f"the indexer did not catch up in {timeout_s:.0f}s: reput offset {status.reput_offset} "
                        f"< commitlog max offset {end} (connected={status.connected}, "
                        f"dispatched {status.dispatched_records} records)")
            time.sleep(0.1)


def end_log_with_a_blank_file(commitlog_dir: Path, file_size: int) -> int:
    """Hand-build what RocketMQ's own writes never leave but a log may hold: the rest of the last file
    BLANK, then a commitlog file BLANK from its first byte. Writes continue after it. Only on a stopped
    store. Returns where the next record goes."""
    commitlog_dir.mkdir(parents=True, exist_ok=True)
    walk = iter_commitlog(commitlog_dir, file_size=file_size)
    for _ in walk:
        pass
    end = walk.end.offset if walk.end else 0
    position = end % file_size
    if position:  # the rest of the file holding the end of the data
        with open(commitlog_dir / commitlog_file_name(end - position), "r+b") as f:
            f.seek(position)
            f.write(encode_blank(file_size - position))
        end += file_size - position
    for later in commitlog_dir.iterdir():
        if int(later.name) > end:
            raise RuntimeError(f"{later}: a commitlog file after the end of the data {end}; is the store running?")
    with open(commitlog_dir / commitlog_file_name(end), "wb") as f:  # sparse: only its first 8 bytes are written
        f.write(encode_blank(file_size))
        f.truncate(file_size)
    return end + file_size


# -- what producers send and what the store acknowledged ------------------------------------------------


@dataclass(frozen=True)
class Outgoing:
    """One logical message; a retry sends the same one (same UNIQ_KEY) again."""

    uniq_key: str
    topic: str
    body: bytes
    keys: tuple[str, ...]
    tags: str | None

    def message(self) -> OutgoingMessage:
        return OutgoingMessage(body=self.body, topic=self.topic, keys=list(self.keys) or None, tags=self.tags,
                               properties={"UNIQ_KEY": self.uniq_key})


@dataclass(frozen=True)
class Ack:
    """An acknowledged send: the receipt and what was sent."""

    uniq_key: str
    offset_msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    keys: tuple[str, ...]
    tags: str | None
    body_len: int
    body_crc: int
    status: str


@dataclass
class Ledger:
    """Every message attempted, retried, acknowledged or given up on; thread-safe."""

    attempted: dict[str, Outgoing] = field(default_factory=dict)
    retried: set[str] = field(default_factory=set)
    acks: dict[str, Ack] = field(default_factory=dict)
    #: Sends that ended without an ack: (uniq key, why).
    unacknowledged: list[tuple[str, str]] = field(default_factory=list)
    #: gRPC codes of failed sends, to show what the chaos produced.
    failures: Counter[str] = field(default_factory=Counter)
    #: Receipts for messages this producer did not send, or twice for one message (the second kept here).
    strange_receipts: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attempt(self, messages: Sequence[Outgoing]) -> None:
        with self._lock:
            for m in messages:
                self.attempted.setdefault(m.uniq_key, m)

    def acknowledge(self, receipts: Sequence[SendReceipt]) -> set[str]:
        acked = set()
        with self._lock:
            for r in receipts:
                sent = self.attempted.get(r.msg_id)
                if sent is None or r.msg_id in self.acks:
                    self.strange_receipts.append(f"{r.msg_id} at {r.offset_msg_id}")
                    continue
                self.acks[r.msg_id] = Ack(r.msg_id, r.offset_msg_id, r.topic, r.queue_id, r.queue_offset, sent.keys,
                                          sent.tags, len(sent.body), zlib.crc32(sent.body), r.status)
                acked.add(r.msg_id)
        return acked

    def failed(self, messages: Sequence[Outgoing], code: str) -> None:
        with self._lock:
            self.retried.update(m.uniq_key for m in messages)
            self.failures[code] += 1

    def give_up(self, messages: Sequence[Outgoing], why: str) -> None:
        with self._lock:
            self.unacknowledged.extend((m.uniq_key, why) for m in messages)


# -- producers ---------------------------------------------------------------------------------------


class Writers:
    """Producers send at the same time (``shared``); a phase that must be the only writer of the log
    (``exclusive``) waits for the sends in flight and holds off new ones."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._sending = 0
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._exclusive)
            self._sending += 1
        try:
            yield
        finally:
            with self._changed:
                self._sending -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._exclusive)
            self._exclusive = True
            self._changed.wait_for(lambda: self._sending == 0)
        try:
            yield
        finally:
            with self._changed:
                self._exclusive = False
                self._changed.notify_all()


@dataclass(frozen=True)
class Pace:
    """How hard the producers push; the defaults suit a test of about a minute on 2 cores."""

    #: A burst of back-to-back batches, then a quiet spell (the indexer catches up in it).
    burst_s: tuple[float, float] = (0.8, 2.0)
    quiet_s: tuple[float, float] = (0.5, 1.5)
    batch_size: tuple[int, int] = (4, 24)
    pause_between_batches_s: tuple[float, float] = (0.08, 0.2)
    #: The slow producer: one message at a time, a good share of them nearly a whole commitlog file.
    slow_interval_s: tuple[float, float] = (0.1, 0.3)
    slow_large_share: float = 0.2
    batch_large_share: float = 0.002
    #: Once, this long into the workload: a commitlog file of only tiny records, this many (0: never).
    dense_file_messages: int = 4500
    dense_file_after_s: float = 12.0


class MessageFactory:
    """Messages of one producer: bodies of every size up to nearly a file, keys, tags; seeded."""

    def __init__(self, rng: random.Random, producer: int, run_id: int, geometry: GeometryPreset) -> None:
        self.rng = rng
        self.producer = producer
        self.run_id = run_id
        self.largest = geometry.largest_body
        self.count = 0

    def next(self, topic: str, large_share: float, size: int | None = None, keys: bool = True) -> Outgoing:
        rng, n = self.rng, self.count
        self.count += 1
        # RocketMQ's UNIQ_KEY shape: 32 upper-case hex digits (here: loopback ip, run, producer, counter).
        uniq = f"7F000001{self.run_id:08X}{self.producer:04X}{n:012X}"
        if size is None:
            roll = rng.random()
            size = (rng.randint(self.largest // 2, self.largest) if roll < large_share
                    else rng.randint(1, 64) if roll < 0.3  # at least one byte: RocketMQ refuses an empty body
                    else rng.randint(65, 2000))
        words: list[str] = []
        if keys and rng.random() < 0.8:
            words.append(f"u-{uniq[-16:]}")
        if keys and rng.random() < 0.6:
            words.append(f"g{self.run_id:x}-{self.producer}-{n // KEY_GROUP}")
        tags = rng.choice((None, "TagA", "TagB", "TagC")) if keys else None
        return Outgoing(uniq, topic, rng.randbytes(size), tuple(words), tags)


class ProducerThread(threading.Thread):
    """Sends until ``stop`` is set; retries every failure but a refusal with the same messages."""

    def __init__(self, name: str, gateway: str, ledger: Ledger, factory: MessageFactory, pace: Pace,
                 stop: threading.Event, writers: Writers) -> None:
        super().__init__(name=name, daemon=True)
        self.gateway = gateway
        self.ledger = ledger
        self.factory = factory
        self.pace = pace
        self.stop_event = stop
        self.writers = writers
        self.rng = factory.rng
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(self.gateway, timeout=5.0) as producer:
                self.produce(producer)
        except BaseException as exc:  # reported by the caller: a thread's exception is otherwise only printed
            self.error = exc

    def produce(self, producer: Producer) -> None:
        raise NotImplementedError

    def deliver(self, producer: Producer, messages: list[Outgoing], how: str) -> None:
        """Send until every message is acknowledged, refused, or retried for RETRY_FOR_S."""
        pending = messages
        deadline = time.monotonic() + RETRY_FOR_S
        backoff = 0.05
        while pending:
            self.ledger.attempt(pending)
            failure: MqstoreError | None = None
            try:
                receipts = send(producer, pending, how)
            except MqstoreError as exc:
                receipts, failure = exc.receipts, exc
            acked = self.ledger.acknowledge(receipts)
            pending = [m for m in pending if m.uniq_key not in acked]
            if not pending:
                return
            code = failure.code if failure else "NO_RECEIPT"
            self.ledger.failed(pending, code)
            if code in REFUSALS:
                self.ledger.give_up(pending, f"refused: {failure}")
                return
            if time.monotonic() > deadline:
                self.ledger.give_up(pending, f"still failing after {RETRY_FOR_S:.0f}s: {failure}")
                return
            time.sleep(backoff * (0.5 + self.rng.random()))
            backoff = min(backoff * 2, 1.0)

    def sleep(self, bounds: tuple[float, float]) -> None:
        self.stop_event.wait(self.rng.uniform(*bounds))


def send(producer: Producer, messages: Sequence[Outgoing], how: str) -> list[SendReceipt]:
    """One attempt; on a failure the error's ``receipts`` hold what was acknowledged before it."""
    if how == "single":
        (message,) = messages
        return [producer.send_message(message.message())]
    topic = messages[0].topic
    if how == "batch":
        return producer.send_batch(topic, [m.message() for m in messages])
    receipts: list[SendReceipt] = []
    try:
        for receipt in producer.send_stream([m.message() for m in messages], topic):
            receipts.append(receipt)
    except MqstoreError as exc:
        exc.receipts = receipts
        raise
    return receipts


class BurstProducer(ProducerThread):
    """Batches (SendBatch, and SendStream for some) back to back in bursts, quiet in between: the
    indexer lags in a burst and meets rolls from behind, then catches up."""

    def produce(self, producer: Producer) -> None:
        pace = self.pace
        dense_at = time.monotonic() + pace.dense_file_after_s if pace.dense_file_messages else float("inf")
        while not self.stop_event.is_set():
            if time.monotonic() >= dense_at:
                self.fill_a_file_with_tiny_records(producer)
                dense_at = float("inf")
            burst_end = time.monotonic() + self.rng.uniform(*pace.burst_s)
            while time.monotonic() < burst_end and not self.stop_event.is_set():
                topic = self.rng.choice(TOPICS)
                batch = [self.factory.next(topic, pace.batch_large_share)
                         for _ in range(self.rng.randint(*pace.batch_size))]
                with self.writers.shared():
                    self.deliver(producer, batch, "stream" if self.rng.random() < 0.3 else "batch")
                self.sleep(pace.pause_between_batches_s)
            self.sleep(pace.quiet_s)

    def fill_a_file_with_tiny_records(self, producer: Producer) -> None:
        """One message as large as a file can take (the next records start a new file), then thousands
        of tiny ones, with nobody else writing: one commitlog file holds more records than any export
        batch or ConsumeQueue file does."""
        with self.writers.exclusive():
            filler = self.factory.next(TOPICS[1], 1.0, size=self.factory.largest)
            self.deliver(producer, [filler], "single")
            tiny = [self.factory.next(TOPICS[1], 0.0, size=self.rng.randint(1, 16), keys=False)
                    for _ in range(self.pace.dense_file_messages)]
            for first in range(0, len(tiny), 1000):
                self.deliver(producer, tiny[first:first + 1000], "batch")


class TrickleProducer(ProducerThread):
    """One message at a time, many nearly a whole file: rolls that a caught-up indexer meets."""

    def produce(self, producer: Producer) -> None:
        while not self.stop_event.is_set():
            message = self.factory.next(self.rng.choice(TOPICS), self.pace.slow_large_share)
            with self.writers.shared():
                self.deliver(producer, [message], "single")
            self.sleep(self.pace.slow_interval_s)


# -- chaos ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kill:
    at_s: float
    service: str
    downtime_s: float


def kill_plan(rng: random.Random, duration_s: float, kills_per_service: int) -> list[Kill]:
    """Each service killed ``kills_per_service`` times at random points of ``duration_s``, in random order."""
    services = [s for s in SERVICES for _ in range(kills_per_service)]
    rng.shuffle(services)
    times = sorted(rng.uniform(1.0, max(duration_s - 2.0, 1.5)) for _ in services)
    return [Kill(at, service, rng.uniform(0.0, 0.5)) for at, service in zip(times, services, strict=True)]


class ChaosThread(threading.Thread):
    """kill -9 and restart per plan; a service that does not come back stops the run (``error``)."""

    def __init__(self, system: SoakSystem, plan: Sequence[Kill], stop: threading.Event,
                 log: Callable[[str], None]) -> None:
        super().__init__(name="chaos", daemon=True)
        self.system = system
        self.plan = plan
        self.stop_event = stop
        self.log = log
        #: (planned at, service, commitlog end when killed, seconds until SERVING again)
        self.done: list[tuple[float, str, int, float]] = []
        self.error: str | None = None

    def run(self) -> None:
        start = time.monotonic()
        for kill in self.plan:
            if self.stop_event.wait(max(0.0, start + kill.at_s - time.monotonic())):
                return
            try:
                end = self.system.store_info().max_offset
            except Exception:  # the commitlog may itself be down right now
                end = -1
            self.system.kill9(kill.service)
            self.log(f"  {time.monotonic() - start:6.1f}s kill -9 {kill.service} (commitlog end {end})")
            time.sleep(kill.downtime_s)
            restarted = time.monotonic()
            try:
                self.system.start(kill.service)
            except Exception as exc:
                self.error = (f"{kill.service} did not come back after kill -9: {exc}\n"
                              f"{self.system.logs_tail(kill.service)}")
                self.stop_event.set()
                return
            self.done.append((kill.at_s, kill.service, end, time.monotonic() - restarted))
            if kill.service == "commitlog":
                self._wait_for_a_write(limit_s=10.0)

    def _wait_for_a_write(self, limit_s: float) -> None:
        """Hold the next kill until the restarted commitlog has stored a record: each start writes under
        its own store host, and a start killed before any write would leave that host untested."""
        deadline = time.monotonic() + limit_s
        try:
            base = self.system.store_info().max_offset
        except Exception:
            return
        while time.monotonic() < deadline and not self.stop_event.is_set():
            try:
                if self.system.store_info().max_offset > base:
                    return
            except Exception:
                pass
            time.sleep(0.05)


# -- one workload --------------------------------------------------------------------------------------


@dataclass
class WorkloadResult:
    seconds: float
    kills: list[tuple[float, str, int, float]]
    problems: list[str]


def create_topics(gateway: str) -> None:
    with Client(gateway) as client:
        if TOPICS[0] not in {t.topic for t in client.topics()}:
            client.create_topic(TOPICS[0], CREATED_TOPIC_QUEUES)


def run_workload(system: SoakSystem, ledger: Ledger, rng: random.Random, duration_s: float, run_id: int,
                 pace: Pace = Pace(), kills_per_service: int = 2, min_files: int = 0,
                 max_s: float | None = None, log: Callable[[str], None] = print) -> WorkloadResult:
    """Producers and chaos for ``duration_s`` (longer until the commitlog has ``min_files`` files, up to
    ``max_s``). The system must be up; it is up again (every killed service restarted) on return."""
    stop = threading.Event()
    writers = Writers()
    producers: list[ProducerThread] = [
        BurstProducer("burst", system.gateway, ledger, MessageFactory(random.Random(rng.random()), 1, run_id,
                                                                      system.geometry), pace, stop, writers),
        TrickleProducer("trickle", system.gateway, ledger, MessageFactory(random.Random(rng.random()), 2, run_id,
                                                                          system.geometry), pace, stop, writers),
    ]
    chaos = ChaosThread(system, kill_plan(random.Random(rng.random()), duration_s, kills_per_service), stop, log)
    start = time.monotonic()
    for thread in (*producers, chaos):
        thread.start()
    limit = start + (max_s if max_s is not None else duration_s * 3)
    while not stop.is_set():
        elapsed = time.monotonic() - start
        if elapsed >= duration_s and commitlog_file_count(system.root) >= min_files:
            break
        if time.monotonic() > limit:
            break
        time.sleep(0.2)
    stop.set()
    chaos.join(120)
    for producer in producers:
        producer.join(RETRY_FOR_S + 30)
    problems = [f"producer {p.name} failed: {p.error!r}" for p in producers if p.error is not None]
    problems += [f"producer {p.name} still running" for p in producers if p.is_alive()]
    if chaos.error:
        problems.append(chaos.error)
    files = commitlog_file_count(system.root)
    if files < min_files:
        problems.append(f"the workload wrote {files} commitlog files, fewer than the {min_files} planned")
    return WorkloadResult(time.monotonic() - start, chaos.done, problems)


def receipts_by_queue(acks: Mapping[str, Ack]) -> dict[tuple[str, int], dict[int, Ack]]:
    """Acknowledged messages per (topic, queue id), by queue offset."""
    queues: dict[tuple[str, int], dict[int, Ack]] = {}
    for ack in acks.values():
        queues.setdefault((ack.topic, ack.queue_id), {})[ack.queue_offset] = ack
    return queues
