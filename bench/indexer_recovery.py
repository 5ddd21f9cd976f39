"""Indexer recovery after kill -9 under load: how long until every acknowledged message is findable.

    python -m bench.indexer_recovery                       # a 2 GiB commitlog, 5 kills under 5,000 msgs/s
    python -m bench.indexer_recovery --size-gib 1 --kills 3 --rate 20000

Real processes on 127.0.0.1, RocketMQ's default geometry (1 GiB commitlog files, one 20,000,000-entry
index file): a commitlog written in-process to ``--size-gib`` (1 KiB bodies, UNIQ_KEY + 1 KEYS word,
so 2 index entries a message), a ``mqstore commitlog`` on it, a ``mqstore indexer`` that first
indexes the whole log (timed: what a rebuild from the log start costs, the old recovery in 2 of 3
crashes), then producers send AppendBatch (64 messages) at ``--rate`` while the indexer is killed
with SIGKILL ``--kills`` times at random points and restarted at once. Per kill:

* ``serving s``: from the kill to the new indexer answering (process start, recovery, gRPC up);
* ``recovery s``: the recovery itself (the indexer's ``mqstore_indexer_recovery_seconds``);
* ``re-dispatch``: bytes between the resume offset and the reput offset seen just before the kill;
* ``findable s``: from the kill until the last message acknowledged before it is found both by pull
  (its ConsumeQueue unit) and by key (QueryByKey on its UNIQ_KEY and KEYS word). Dispatch is in
  commitlog order, so every earlier message is findable then too; after the kills, every message
  acknowledged within 60 s before a kill, and a sample of the rest, is checked by pull and key.

The store lives under <repo>/.bench-tmp and is deleted afterwards (``--keep-store`` keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench.append_grpc import store_info
from bench.report import progress
from bench.services import Service, free_port
from bench.workload import CLUSTER, QUEUES, TOPIC, print_machine, scratch_dir
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc
from services.commitlog.message_store import MessageStore
from services.store.config import ASYNC_FLUSH, load_config
from services.store.formats.message import Message

GIB = 1024**3
BODY_SIZE = 1024
BATCH = 64
INDEXER_HEALTH = "mqstore.v1.IndexerService"
COMMITLOG_HEALTH = "mqstore.v1.CommitLogService"
#: Every message acknowledged in this many seconds before a kill is checked by pull and key.
WINDOW_S = 5


@dataclass(frozen=True)
class Sent:
    commitlog_offset: int
    queue_id: int
    queue_offset: int
    n: int  # message number: UNIQ_KEY and KEYS derive from it


def uniq_key(n: int) -> str:
    return f"{n:032X}"


def keys_word(n: int) -> str:
    return f"order-{n}"


def write_store(root: Path, total_bytes: int) -> int:
    """Fill ``root`` (a commitlog service's store) with ~``total_bytes`` of messages, stopped cleanly.
    Returns how many messages."""
    rng = random.Random(7)
    bodies = [rng.randbytes(BODY_SIZE) for _ in range(256)]
    log = MessageStore(load_config(environ={}, flush_disk_type=ASYNC_FLUSH), root)
    log.start()
    count, started = 0, time.monotonic()
    try:
        while log.max_offset < total_bytes:
            log.put_messages([Message(TOPIC, n % QUEUES, bodies[n % len(bodies)], properties={
                "UNIQ_KEY": uniq_key(n), "KEYS": keys_word(n), "CLUSTER": CLUSTER}, born_host="127.0.0.1:50000")
                for n in range(count, count + BATCH)])
            count += BATCH
            if count % (BATCH * 4000) == 0:
                progress(f"  wrote {log.max_offset / GIB:.2f} GiB ({count:,} messages)")
    finally:
        log.shutdown()
    progress(f"wrote {count:,} messages ({total_bytes / GIB:.2f} GiB) in {time.monotonic() - started:.0f} s")
    return count


class Producer(threading.Thread):
    """AppendBatch of 64 at ``rate`` msgs/s; every acknowledged message goes to ``sent`` (in order)."""

    def __init__(self, target: str, first: int, rate: float) -> None:
        super().__init__(name="producer", daemon=True)
        self.target, self.next, self.rate = target, first, rate
        self.sent: list[Sent] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.error: BaseException | None = None

    def run(self) -> None:
        body = b"x" * BODY_SIZE
        try:
            with grpc.insecure_channel(self.target) as channel:
                stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
                started, batches = time.perf_counter(), 0
                while not self.stop.is_set():
                    first = self.next
                    request = commitlog_pb2.AppendBatchRequest(messages=[common_pb2.Message(
                        topic=TOPIC, queue_id=n % QUEUES, body=body,
                        properties={"UNIQ_KEY": uniq_key(n), "KEYS": keys_word(n), "CLUSTER": CLUSTER})
                        for n in range(first, first + BATCH)])
                    results = stub.AppendBatch(request, timeout=30).results
                    with self.lock:
                        self.sent.extend(Sent(r.commitlog_offset, (first + i) % QUEUES, r.queue_offset, first + i)
                                         for i, r in enumerate(results))
                    self.next += BATCH
                    batches += 1
                    ahead = batches * BATCH / self.rate - (time.perf_counter() - started)
                    if ahead > 0:
                        time.sleep(ahead)
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def acked(self) -> list[Sent]:
        with self.lock:
            return list(self.sent)


@dataclass
class Indexer:
    store: Path
    commitlog: str
    listen: str
    metrics_port: int
    env: dict[str, str]
    starts: int = 0
    service: Service | None = None
    channel: grpc.Channel | None = None
    stub: indexer_pb2_grpc.IndexerServiceStub | None = field(default=None, repr=False)

    def start(self) -> None:
        self.starts += 1
        log_path = self.store.parent / f"indexer-{self.starts}.log"
        self.service = Service("indexer", ["--store", str(self.store), "--listen", self.listen,
                                           "--commitlog", self.commitlog], log_path,
                               {**self.env, "MQSTORE_METRICS_PORT": str(self.metrics_port)}, INDEXER_HEALTH)
        self.channel = grpc.insecure_channel(self.listen)
        self.stub = indexer_pb2_grpc.IndexerServiceStub(self.channel)

    def kill9(self) -> None:
        assert self.service is not None and self.channel is not None
        os.kill(self.service.pid, signal.SIGKILL)
        self.service.proc.wait()
        self.service.stop()  # closes its log
        self.channel.close()

    def status(self) -> indexer_pb2.DispatchStatus:
        assert self.stub is not None
        return self.stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=5)

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))

    def recovered_line(self) -> dict[str, object]:
        assert self.service is not None
        for line in self.service.log_path.read_text(errors="replace").splitlines():
            if '"indexer recovered' in line:
                return dict(json.loads(line))
        raise RuntimeError(f"no recovery line in {self.service.log_path}")

    def findable_written(self, n: int) -> bool:
        """Message ``n`` of the log written before the indexer started: the one unit of queue n % 8 at
        queue offset n // 8, and both its keys, name the same commitlog offset."""
        assert self.stub is not None
        unit = self.stub.GetQueueEntries(indexer_pb2.GetQueueEntriesRequest(
            topic=TOPIC, queue_id=n % QUEUES, from_offset=n // QUEUES, max_count=1), timeout=5).units
        return len(unit) == 1 and self.findable(Sent(unit[0].commitlog_offset, n % QUEUES, n // QUEUES, n))

    def findable(self, m: Sent) -> bool:
        """By pull (the unit at its queue offset) and by both keys."""
        assert self.stub is not None
        try:
            units = self.stub.GetQueueEntries(indexer_pb2.GetQueueEntriesRequest(
                topic=TOPIC, queue_id=m.queue_id, from_offset=m.queue_offset, max_count=1), timeout=5).units
            if not units or units[0].commitlog_offset != m.commitlog_offset:
                return False
            return all(m.commitlog_offset in self.stub.QueryByKey(indexer_pb2.QueryByKeyRequest(
                topic=TOPIC, key=key, max_num=64), timeout=5).commitlog_offsets
                for key in (uniq_key(m.n), keys_word(m.n)))
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
                return False
            raise


def wait_until(what: str, check: object, timeout_s: float, interval_s: float = 0.01) -> float:
    """Poll ``check()`` until true; returns the monotonic time it first was."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():  # type: ignore[operator]
                return time.monotonic()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(interval_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=2.0, help="commitlog size before the kills")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--rate", type=float, default=5_000, help="msgs/s sent during the kills")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--keep-store", action="store_true")
    args = parser.parse_args()
    print_machine()
    rng = random.Random(args.seed)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    with scratch_dir("indexer-recovery", keep=args.keep_store) as root:
        messages = write_store(root / "broker", int(args.size_gib * GIB))
        commitlog = Service("commitlog", ["--store", str(root / "broker"), "--listen", f"127.0.0.1:{free_port()}"],
                            root / "commitlog.log", env, COMMITLOG_HEALTH)
        indexer = Indexer(root / "indexer", commitlog.target, f"127.0.0.1:{free_port()}", free_port(), env)
        producer: Producer | None = None
        try:
            commitlog.wait_serving()
            log_end = store_info(commitlog.target).max_offset
            started = time.monotonic()
            indexer.start()
            assert indexer.service is not None
            indexer.service.wait_serving()
            wait_until("initial indexing", lambda: indexer.status().reput_offset >= log_end, 3600, 0.5)
            build_s = time.monotonic() - started
            progress(f"indexed the whole log ({log_end / GIB:.2f} GiB, {messages:,} messages) from scratch in "
                     f"{build_s:.1f} s ({log_end / build_s / 1e6:.0f} MB/s): a rebuild from the log start")
            producer = Producer(commitlog.target, messages, args.rate)
            producer.start()
            rows = []
            chosen: dict[int, Sent] = {}
            for kill in range(1, args.kills + 1):
                time.sleep(rng.uniform(3.0, 8.0))
                reput = indexer.status().reput_offset
                checkpoint = indexer.metric("mqstore_indexer_dispatch_checkpoint_offset_bytes")
                killed = time.monotonic()
                indexer.kill9()
                acked = producer.acked()
                last = acked[-1]  # acknowledged before the kill
                chosen.update((m.n, m) for m in acked[-int(args.rate * WINDOW_S):])
                indexer.start()
                assert indexer.service is not None
                indexer.service.wait_serving()
                serving = time.monotonic()
                caught_up = wait_until("caught up", lambda m=last: indexer.status().reput_offset > m.commitlog_offset,
                                       600)
                found = wait_until("findable", lambda m=last: indexer.findable(m), 600)
                line = indexer.recovered_line()
                resume = int(str(line["resume_offset"]))
                rows.append({"kill": kill, "log GiB": round(store_info(commitlog.target).max_offset / GIB, 2),
                             "reput at kill": reput, "checkpoint": int(checkpoint), "resume": resume,
                             "re-dispatch KB": round((reput - resume) / 1e3),
                             "recovery s": round(indexer.metric("mqstore_indexer_recovery_seconds"), 3),
                             "serving s": round(serving - killed, 2), "caught up s": round(caught_up - killed, 2),
                             "findable s": round(found - killed, 2)})
                progress("  " + json.dumps(rows[-1]))
            producer.stop.set()
            producer.join(60)
            if producer.error is not None:
                raise producer.error
            final = producer.acked()
            wait_until("final catch-up", lambda: indexer.status().reput_offset >= store_info(
                commitlog.target).max_offset, 600)
            chosen.update((m.n, m) for m in rng.sample(final, min(len(final), 2000)))
            checked = list(chosen.values())
            with ThreadPoolExecutor(8) as pool:
                missing = [m for m, ok in zip(checked, pool.map(indexer.findable, checked), strict=True) if not ok]
            print(f"\nchecked {len(checked):,} of the {len(final):,} messages sent under load by pull and by key "
                  f"(all of those acknowledged in the {WINDOW_S} s before each kill): {len(missing)} missing",
                  flush=True)
            old = rng.sample(range(messages), min(messages, 2000))
            with ThreadPoolExecutor(8) as pool:
                missing_old = [n for n, ok in zip(old, pool.map(indexer.findable_written, old), strict=True) if not ok]
            print(f"checked {len(old):,} of the {messages:,} messages written before: {len(missing_old)} missing",
                  flush=True)
            print("\n| kill | log GiB | reput at kill | checkpoint | resume | re-dispatch KB | recovery s | "
                  "serving s | caught up s | findable s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for row in rows:
                print("| " + " | ".join(str(v) for v in row.values()) + " |")
            for key in ("recovery s", "serving s", "findable s"):
                values = [float(str(r[key])) for r in rows]
                print(f"{key}: median {statistics.median(values):.2f}, max {max(values):.2f}")
            print(f"rebuild from the log start: {build_s:.1f} s for {log_end / GIB:.2f} GiB")
        finally:
            if producer is not None:
                producer.stop.set()
                producer.join(60)
            if indexer.service is not None:
                indexer.service.stop()
            commitlog.stop()


if __name__ == "__main__":
    main()
