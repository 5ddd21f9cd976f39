"""A power-cut campaign through the gateway: the store's services on the power-cut file system, cut and
restarted, the gateway (which keeps nothing on disk) running across the cuts.

The commitlog, indexer, query service and scheduler keep their files on the file system that forgets
(SYNC_FLUSH, the small geometry: 64 KiB commitlog files roll every few hundred sends, so cuts land
mid-roll; ConsumeQueue and index files roll too). Each cycle producers send through the gateway for a
random moment while the cycle also creates a topic, commits a consumer offset, sends delay-level and
timer messages and ends two transactions (one commit, one rollback); then the power is cut (every
service process dies in the same instant) and the next processes, forked from a server that imported
every service once (fork_server.py), start. Every
fifth cycle also cuts while the restarted services recover. After each restart, what was acknowledged
before the cut is looked for: every send pulled at its queue offset and fetched by offset msg id and
UNIQ_KEY, no queue offset acknowledged to two messages, the topics with their queue counts, the
consumer offset (exactly the last acknowledged commit: under SYNC_FLUSH a commit is answered once it
is durable; only a commit the cut left unanswered may have been kept instead). At the end every delayed,
timer and committed transactional message is delivered exactly once, no rolled-back one is, and
``pipeline verify`` checks the stopped store.

``python -m tests.powercut.gateway_campaign --cuts 200`` runs a long one (``make soak-power``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import random
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, gateway_pb2_grpc, query_pb2, transaction_pb2
from services.runner import wait_serving
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS, commitlog_env, free_port, spawn_service
from tests.gateway.system_process import GATEWAY_SERVICE
from tests.geometry import SMALL
from tests.powercut.fork_server import ForkedProcess, ForkServer
from tests.powercut.mount import REPO_ROOT, PowerCutMount
from tests.waiting import retried_while

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOPIC = "PowerCutGw"
QUEUES = 4
DELAYED = "PowerCutDelayed"
TIMED = "PowerCutTimer"
TX = "PowerCutTx"
GROUP = "powercut-consumers"
TX_GROUP = "powercut-tx"
PRODUCERS = 2
#: RocketMQ's default: under SYNC_FLUSH the commit path, not this periodic write, must make offsets durable.
OFFSET_PERSIST_MS = 5000
ENV = {**SMALL.env(), "MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH", "MQSTORE_MAX_MESSAGE_SIZE": str(16 * 1024),
       "MQSTORE_DEFAULT_TOPIC_QUEUE_NUMS": str(QUEUES), "MQSTORE_LOG_LEVEL": "WARNING"}
SERVICES = ("commitlog", "indexer", "query", "scheduler")
#: After each cut, this many of the sends acknowledged last before it are also fetched by offset msg id and
#: by UNIQ_KEY (every send is pulled at its queue offset after its cut and again at the end).
BY_ID_PER_CUT = 12
T = TypeVar("T")


@dataclass(frozen=True)
class Sent:
    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    offset_msg_id: str
    uniq_key: str


@dataclass
class Acked:
    """What the system acknowledged, by kind."""

    sends: list[Sent] = field(default_factory=list)
    topics: dict[str, int] = field(default_factory=dict)  # topic -> queues
    offsets: list[tuple[int, bool]] = field(default_factory=list)  # (offset committed, whether answered)
    delayed: list[bytes] = field(default_factory=list)  # delay-level and timer bodies (delivered later)
    timed: list[bytes] = field(default_factory=list)
    committed: list[bytes] = field(default_factory=list)
    rolled_back: list[bytes] = field(default_factory=list)


@dataclass
class CampaignResult:
    cuts: int = 0
    cuts_starting: int = 0
    sends: int = 0
    lost: list[str] = field(default_factory=list)
    rolls: int = 0
    seconds: float = 0.0
    restart_s: list[float] = field(default_factory=list)
    check_s: list[float] = field(default_factory=list)
    cut_s: list[float] = field(default_factory=list)
    cycles_s: float = 0.0  # the cycles alone, without the final checks and pipeline verify
    verify_s: float = 0.0

    def summary(self) -> str:
        per_cut = self.cycles_s / max(1, self.cuts + self.cuts_starting)
        return (f"{self.cuts} cuts under load and {self.cuts_starting} while recovering, {self.sends} acknowledged "
                f"sends, {len(self.lost)} lost, {self.rolls} commitlog files rolled, {self.seconds:.0f}s "
                f"({per_cut:.2f}s per cut; medians: restart {_median(self.restart_s):.2f}s, check "
                f"{_median(self.check_s):.2f}s, cut and remount {_median(self.cut_s):.2f}s; "
                f"then final checks {self.seconds - self.cycles_s - self.verify_s:.0f}s, pipeline verify "
                f"{self.verify_s:.0f}s)")


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0


class StoreServices:
    """The four services on the mount at fixed ports, forked from a server that imported them once."""

    def __init__(self, store: Path, logs: Path, env: dict[str, str]) -> None:
        self.store = store
        self.logs = logs
        self.env = env
        self.addresses = {name: f"127.0.0.1:{free_port()}" for name in SERVICES}
        self._numbers = itertools.count()
        self.running: dict[str, ForkedProcess] = {}
        self.forks = ForkServer(REPO_ROOT, commitlog_env(self.env), logs / "fork-server.log")

    def _args(self, name: str) -> list[str]:
        a, store = self.addresses, str(self.store)
        return {
            "commitlog": ["--store", store],
            "indexer": ["--store", f"{store}/indexer", "--commitlog", a["commitlog"]],
            "query": ["--store", f"{store}/query", "--commitlog", a["commitlog"], "--indexer", a["indexer"],
                      "--store-root", store, "--persist-interval-ms", str(OFFSET_PERSIST_MS)],
            "scheduler": ["--store", f"{store}/scheduler", "--store-root", store, "--commitlog", a["commitlog"],
                          "--indexer", a["indexer"], "--persist-interval-ms", "500"],
        }[name] + ["--listen", a[name]]

    def release(self) -> None:
        """Start the services, all at once (each waits for the ones it reads)."""
        number = next(self._numbers)
        self.running = {name: self.forks.start(["serve", name, *self._args(name)], self.logs / f"{name}-{number}.log")
                        for name in SERVICES}

    def wait_serving(self, timeout_s: float = 90.0) -> None:
        for name in SERVICES:
            if not wait_serving(self.addresses[name], self.running[name], timeout_s):
                raise RuntimeError(f"{name} did not serve after a restart (exit {self.running[name].poll()}):\n"
                                   + self.log_tail(name))

    def log_tail(self, name: str) -> str:
        logs = sorted(self.logs.glob(f"{name}-*.log"), key=lambda p: p.stat().st_mtime)
        return logs[-1].read_text(errors="replace")[-3000:] if logs else ""

    def kill(self) -> None:
        """The power cut's instant: every process of the store dies."""
        for proc in self.running.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.running.values():
            proc.wait(10)

    def stop(self) -> None:
        """A clean stop, readers before the writer."""
        for name in reversed(SERVICES):
            proc = self.running[name]
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)

    def close(self) -> None:
        for proc in self.running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.forks.close()


class Gateway:
    """One gateway process for the whole campaign (it keeps nothing on disk, so the cuts spare it)."""

    def __init__(self, services: StoreServices, logs: Path) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        a = services.addresses
        self.proc = spawn_service(["serve", "gateway", "--listen", self.address, "--commitlog", a["commitlog"],
                                   "--query", a["query"], "--default-topic-queue-nums", str(QUEUES)],
                                  ENV, logs / "gateway.log")
        self.channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self.stub = gateway_pb2_grpc.MessagingServiceStub(self.channel)

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        health = health_pb2_grpc.HealthStub(self.channel)
        status = health.Check(health_pb2.HealthCheckRequest(service=GATEWAY_SERVICE), timeout=timeout_s,
                              wait_for_ready=True).status
        assert status == health_pb2.HealthCheckResponse.SERVING, f"the gateway answers {status}"

    def close(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _retry(call: Callable[[], T | None], timeout_s: float = 30.0) -> T | None:
    """``call()`` until it answers something (the restarted indexer catches up with the log first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = call()
            if answer is not None or time.monotonic() > deadline:
                return answer
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DATA_LOSS or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _reachable(call: Callable[[], T], timeout_s: float = 30.0) -> T:
    """``call()``, again while the gateway answers UNAVAILABLE: its channels to the restarted services may
    still wait out a reconnect backoff when the services already serve."""
    return retried_while(grpc.StatusCode.UNAVAILABLE, call, timeout_s)


def _send(stub: gateway_pb2_grpc.MessagingServiceStub, topic: str, body: bytes,
          **properties: str) -> gateway_pb2.SendResult | None:
    message = common_pb2.Message(topic=topic, body=body, properties=properties)
    try:
        result = stub.Send(gateway_pb2.SendRequest(message=message), timeout=5)
    except (grpc.RpcError, ValueError):
        return None
    return result if result.status == commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK else None


def _produce(stub: gateway_pb2_grpc.MessagingServiceStub, producer: int, cycle: int, sent: list[Sent],
             stop: threading.Event) -> None:
    rng = random.Random(cycle * 1000 + producer)
    for i in itertools.count():
        if stop.is_set():
            return
        body = f"c{cycle}-p{producer}-{i}-".encode() + rng.randbytes(rng.randrange(0, 2048))
        result = _send(stub, TOPIC, body)
        if result is None:
            time.sleep(0.02)  # the store is being cut (or not yet back): nothing was acknowledged
            continue
        sent.append(Sent(TOPIC, body, result.queue_id, result.queue_offset, result.offset_msg_id, result.uniq_key))


def _side_work(stub: gateway_pb2_grpc.MessagingServiceStub, cycle: int, acked: Acked, rng: random.Random) -> None:
    """One cycle's state changes besides plain sends: a topic, an offset commit, delayed, timer and
    transactional messages. Each is recorded once acknowledged."""
    topic, queues = f"PowerCutTopic{cycle}", 1 + cycle % 3
    with contextlib.suppress(grpc.RpcError, ValueError):
        stub.CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
            topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6)), timeout=5)
        acked.topics[topic] = queues
    with contextlib.suppress(grpc.RpcError, ValueError):
        offset = cycle * 10 + rng.randrange(10)
        acked.offsets.append((offset, False))
        stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(consumer_group=GROUP, topic=TOPIC, queue_id=0,
                                                                offset=offset), timeout=5)
        acked.offsets[-1] = (offset, True)
    delayed = f"delayed-{cycle}".encode()
    if _send(stub, DELAYED, delayed, DELAY="1") is not None:
        acked.delayed.append(delayed)
    timed = f"timer-{cycle}".encode()
    if _send(stub, TIMED, timed, TIMER_DELIVER_MS=str(int(time.time() * 1000) + 1200)) is not None:
        acked.timed.append(timed)
    for resolution, bodies in ((transaction_pb2.COMMIT, acked.committed),
                               (transaction_pb2.ROLLBACK, acked.rolled_back)):
        body = f"tx-{cycle}-{resolution}".encode()
        half = _send(stub, TX, body, TRAN_MSG="true", PGROUP=TX_GROUP)
        if half is None:
            continue
        with contextlib.suppress(grpc.RpcError, ValueError):
            stub.EndTransaction(transaction_pb2.EndTransactionRequest(
                producer_group=TX_GROUP, transaction_id=half.msg_id, offset_msg_id=half.offset_msg_id,
                resolution=resolution), timeout=5)
            bodies.append(body)


def _pull_queue(stub: gateway_pb2_grpc.MessagingServiceStub, topic: str, queue_id: int,
                start: int = 0) -> dict[int, query_pb2.StoredMessage]:
    """Every message of one queue from ``start``, by queue offset."""
    found: dict[int, query_pb2.StoredMessage] = {}
    offset = start
    while True:
        try:
            got = stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=offset,
                                                         max_messages=64), timeout=10)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return found
            raise
        if not got.messages or got.messages[-1].queue_offset < offset:  # none, or not where asked: stop
            return found
        for message in got.messages:
            found[message.queue_offset] = message
        offset = got.messages[-1].queue_offset + 1


def _check_sends(stub: gateway_pb2_grpc.MessagingServiceStub, sends: list[Sent], by_id: int) -> list[str]:
    """Each send pulled at its queue offset; the last ``by_id`` sends (the ones acknowledged closest to the
    cut) also fetched by offset msg id and by UNIQ_KEY (from the index: two lookups each, so a sample)."""
    lost: list[str] = []
    deadline = time.monotonic() + 30.0  # for the indexer to catch up, all queues together
    by_queue: dict[int, list[Sent]] = {}
    for s in sends:
        by_queue.setdefault(s.queue_id, []).append(s)
    for queue_id, queued in by_queue.items():
        last = max(s.queue_offset for s in queued)

        def caught_up(queue_id: int = queue_id, start: int = min(s.queue_offset for s in queued),
                      last: int = last) -> dict[int, query_pb2.StoredMessage] | None:
            pulled = _pull_queue(stub, TOPIC, queue_id, start)
            return pulled if last in pulled else None

        try:
            pulled = _retry(caught_up, max(0.0, deadline - time.monotonic())) or {}
        except grpc.RpcError as exc:
            lost.append(f"pull of queue {queue_id}: {exc.code()} {exc.details()}")
            continue
        for s in queued:
            if s.queue_offset not in pulled or pulled[s.queue_offset].body != s.body:
                lost.append(f"pull of queue {s.queue_id} offset {s.queue_offset}: "
                            f"{'none' if s.queue_offset not in pulled else 'another body'}")
    for s in sends[-by_id:] if by_id and not lost else ():  # by id only once the pulls found everything
        for key, kind in ((s.offset_msg_id, "offset msg id"), (s.uniq_key, "UNIQ_KEY")):
            def view(key: str = key) -> bytes | None:
                try:
                    return bytes(stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=key, topic=TOPIC),
                                                 timeout=10).message.body)
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.NOT_FOUND:
                        return None
                    raise
            try:
                if _retry(view, 10) != s.body:
                    lost.append(f"{kind} {key}: not found or another body")
            except grpc.RpcError as exc:
                lost.append(f"{kind} {key}: {exc.code()}")
    return lost


def _check_state(stub: gateway_pb2_grpc.MessagingServiceStub, acked: Acked) -> list[str]:
    """Topics with their queue counts, and the consumer offset, as acknowledged before the cut."""
    wrong: list[str] = []
    listed = _reachable(lambda: stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=10))
    topics = {t.topic: t for t in listed.topics}
    for topic, queues in acked.topics.items():
        config = topics.get(topic)
        if config is None or (config.read_queue_nums, config.write_queue_nums) != (queues, queues):
            wrong.append(f"topic {topic}: {'missing' if config is None else 'other queue counts'} after a cut")
    if acked.offsets:
        try:
            request = query_pb2.QueryConsumerOffsetRequest(consumer_group=GROUP, topic=TOPIC, queue_id=0)
            now = _reachable(lambda: stub.QueryOffset(request, timeout=10)).offset
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # no commit kept (only while none was answered)
                raise
            now = -1
        allowed = _allowed_offsets(acked)
        if now not in allowed:
            wrong.append(f"consumer offset {now} after a cut: the commits allow only {sorted(allowed)[:4]} (the "
                         "last acknowledged, or one sent after it that the cut left unanswered)")
    return wrong


def _allowed_offsets(acked: Acked) -> set[int]:
    """The consumer offsets the query service may hold after the cuts: under SYNC_FLUSH exactly the last
    acknowledged commit (-1: none at all, while none was), or a later one whose answer the cut
    prevented (it may have been written before the power went)."""
    answered = [i for i, (_, ok) in enumerate(acked.offsets) if ok]
    last = answered[-1] if answered else -1
    kept = {acked.offsets[last][0]} if answered else {-1}
    return kept | {offset for offset, _ in acked.offsets[last + 1:]}


def _owners(sends: list[Sent]) -> list[str]:
    owners: dict[tuple[int, int], bytes] = {}
    return [f"queue {s.queue_id} offset {s.queue_offset} acknowledged to two messages" for s in sends
            if owners.setdefault((s.queue_id, s.queue_offset), s.body) != s.body]


def _delivered(stub: gateway_pb2_grpc.MessagingServiceStub, topic: str) -> Counter[bytes]:
    bodies: Counter[bytes] = Counter()
    for queue_id in range(QUEUES):
        bodies.update(bytes(m.body) for m in _pull_queue(stub, topic, queue_id).values())
    return bodies


def _check_deliveries(stub: gateway_pb2_grpc.MessagingServiceStub, acked: Acked, timeout_s: float = 30.0) -> list[str]:
    """Every acknowledged delayed, timer and committed message delivered exactly once; no rolled-back one."""
    expected = {DELAYED: Counter(acked.delayed), TIMED: Counter(acked.timed), TX: Counter(acked.committed)}
    deadline = time.monotonic() + timeout_s
    while True:
        got = {topic: _delivered(stub, topic) for topic in expected}
        missing = {topic: [b for b in want if not got[topic][b]] for topic, want in expected.items()}
        if not any(missing.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    wrong = [f"{topic}: {body!r} acknowledged, never delivered" for topic, bodies in missing.items() for body in bodies]
    wrong += [f"{topic}: {body!r} delivered {n} times" for topic in expected for body, n in got[topic].items() if n > 1]
    wrong += [f"{TX}: {body!r} rolled back, delivered" for body in acked.rolled_back if got[TX][body]]
    return wrong


def _pipeline_verify(backing_store: Path, work: Path, spark: SparkSession | None) -> list[str]:
    """``mqstore pipeline verify`` of the stopped store: in ``spark``, the test suite's session, when given
    (no JVM to start: that took longer than the verify itself), else in a process of its own."""
    from tests.soak.soak import finish_pipeline, run_pipeline_in_session, start_pipeline, verify_findings

    report = work / "verify-report.json"
    args = (str(backing_store), "--report", str(report), "--master", "local[1]")
    if spark is not None:
        return verify_findings(report, run_pipeline_in_session(work, SMALL, "verify", *args))
    proc = start_pipeline(work, SMALL, "verify", *args)
    return verify_findings(report, finish_pipeline(work, "verify", proc, 300))


def run_campaign(base: Path, cuts: int, seed: int = 1, env: dict[str, str] | None = None,
                 verify: bool = True, log: Callable[[str], None] = lambda line: None,
                 spark: SparkSession | None = None) -> CampaignResult:
    """``cuts`` power cuts of the store's services (every fifth while they recover); what was lost.
    ``spark``: the session ``pipeline verify`` runs in (else a process of its own)."""
    started = time.monotonic()
    rng = random.Random(seed)
    fs = PowerCutMount(base, seed=seed)
    logs = base / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    fs.start()
    services = StoreServices(fs.mount / "store", logs, {**ENV, **(env or {})})
    gateway = Gateway(services, logs)
    stub = gateway.stub
    result = CampaignResult()
    acked = Acked()
    previous: list[Sent] = []
    files_before = 0
    stop = threading.Event()
    try:
        cycle = 0
        while result.cuts + result.cuts_starting < cuts:
            cycle += 1
            mark = time.monotonic()
            services.release()
            if cycle % 5 == 0:  # a cut while the services recover (truncating, creating files, dispatching)
                time.sleep(rng.uniform(0.0, 1.0))
                fs.cut(services.kill)
                result.cuts_starting += 1
                fs.start()
                services.release()
            services.wait_serving()
            if cycle == 1:
                gateway.wait_serving()
            result.restart_s.append(time.monotonic() - mark)
            mark = time.monotonic()
            found = _check_sends(stub, previous, by_id=BY_ID_PER_CUT) + _check_state(stub, acked)
            found += _owners(acked.sends)
            result.check_s.append(time.monotonic() - mark)
            result.lost += found
            if found:
                break
            stop = threading.Event()
            per_producer: list[list[Sent]] = [[] for _ in range(PRODUCERS)]
            threads = [threading.Thread(target=_produce, args=(stub, p, cycle, per_producer[p], stop), daemon=True)
                       for p in range(PRODUCERS)]
            # The cycle's other changes run beside the producers: the cut may land in any of them.
            threads.append(threading.Thread(target=_side_work, args=(stub, cycle, acked, random.Random(rng.random())),
                                            daemon=True))
            for thread in threads:
                thread.start()
            time.sleep(rng.uniform(0.1, 0.6))
            cut_at = time.monotonic()
            fs.cut(services.kill)
            result.cut_s.append(time.monotonic() - cut_at)
            stop.set()
            for thread in threads:
                thread.join(15)
            previous = [s for sent in per_producer for s in sent]
            acked.sends += previous
            result.cuts += 1
            files_now = len(list((fs.backing / "store" / "commitlog").glob("0*")))
            result.rolls += max(0, files_now - files_before)
            files_before = files_now
            log(f"cycle {cycle}: {len(previous)} acknowledged, {result.cuts + result.cuts_starting} cuts")
            fs.start()
        result.cycles_s = time.monotonic() - started
        if not result.lost:
            services.release()
            services.wait_serving()
            result.lost += _check_sends(stub, acked.sends, by_id=0) + _check_state(stub, acked)
            result.lost += _owners(acked.sends) + _check_deliveries(stub, acked)
            services.stop()
            fs.stop()
            if verify and not result.lost:
                mark = time.monotonic()
                found = _pipeline_verify(fs.backing / "store", base, spark)
                result.lost += [f"pipeline verify: {line}" for line in found]
                result.verify_s = time.monotonic() - mark
    finally:
        stop.set()  # the producers of a cycle that ended in an error too
        gateway.close()
        services.close()
        fs.kill()
    result.sends = len(acked.sends)
    result.seconds = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--dir", type=Path, default=Path(".bench-tmp/powercut-gateway"))
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    result = run_campaign(args.dir, args.cuts, args.seed, log=lambda line: print(line, flush=True))
    print(f"gateway power-cut campaign (SYNC_FLUSH, seed {args.seed}): {result.summary()}")
    for line in result.lost[:20]:
        print("  LOST", line)
    return 1 if result.lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
