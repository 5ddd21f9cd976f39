"""A power-cut campaign: the commitlog service on the power-cut file system, producers, cut, restart.

Each cycle starts the service on the mount (SYNC_FLUSH, 4 MiB commitlog files), runs producers for a
random moment (long enough, every few cycles, to roll a file: the cut lands mid-roll), cuts the power
(everything not made durable is forgotten), and restarts. After every restart each append acknowledged
in the cycle before is read back by its offset, byte for byte; at the end every acknowledged append
is, and the log's queue offsets are dense per queue (none used twice, none skipped). Every fifth cycle
also cuts the power while the service starts (during recovery, truncation or the first file's creation).

``python -m tests.powercut.campaign --cuts 300`` runs a long one (``make soak-power``).
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from mqstore.v1 import commitlog_pb2, common_pb2
from services.store.config import MessageStoreConfig
from services.store.formats.record import decode_record
from tests.commitlog.commitlog_process import MIB, CommitLogProcess, commitlog_env, free_port
from tests.powercut.mount import REPO_ROOT, PowerCutMount

PRODUCERS = 4
#: Under ASYNC_FLUSH a cycle lasts up to this long (four flush intervals): the loss window is measured
#: against flush rounds, not against a cycle that ends before the first one.
ASYNC_CYCLE_S = 2.0
TOPIC = "PowerCutTopic"
QUEUES = 4
ENV = {
    "MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH",
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(4 * MIB),
    "MQSTORE_MAX_MESSAGE_SIZE": str(256 * 1024),
}


@dataclass(frozen=True)
class Ack:
    body: bytes
    queue_id: int
    commitlog_offset: int
    size: int
    queue_offset: int
    acked_at: float  # time.monotonic() when the acknowledgement arrived

    def describe(self) -> str:
        return f"offset {self.commitlog_offset} (queue {self.queue_id} offset {self.queue_offset})"


@dataclass
class CampaignResult:
    cuts: int = 0
    acked: int = 0
    lost: list[str] = field(default_factory=list)
    refused_starts: int = 0
    rolls: int = 0
    seconds: float = 0.0
    cut_outcomes: list[str] = field(default_factory=list)
    cuts_starting: int = 0
    #: per acknowledged append lost, how long before the cut it was acknowledged (the loss window)
    loss_ages_ms: list[float] = field(default_factory=list)
    #: per restart after a cut under ASYNC_FLUSH, recovery's own report of the loss: (bytes, ms) its
    #: witnesses show (services/commitlog/recovery.py's FlushLoss; None: no WARNING)
    reported: list[tuple[int, int] | None] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.cuts} cuts under load and {self.cuts_starting} while starting, {self.acked} acknowledged "
                f"appends, {len(self.lost)} lost, {self.rolls} files rolled, {self.seconds:.1f}s")


class WarmStart:
    """The next commitlog process, its imports done ahead (warm_start.py); :meth:`go` starts it."""

    def __init__(self, store: Path, env: dict[str, str], logs: Path, number: int) -> None:
        self.store = store
        self.port = free_port()
        self.log_path = logs / f"commitlog-{number}.log"
        args = [sys.executable, "-m", "tests.powercut.warm_start", "serve", "commitlog", "--store", str(store),
                "--listen", f"127.0.0.1:{self.port}"]
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(args, cwd=REPO_ROOT, env=commitlog_env(env), stdin=subprocess.PIPE,
                                         stdout=log_file, stderr=log_file)

    def release(self) -> None:
        """Let the process start (recovery first)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.close()

    def go(self, timeout_s: float = 30.0) -> CommitLogProcess:
        self.release()
        handle = CommitLogProcess(self.store, self.port, self.proc, self.log_path)
        try:
            handle.wait_serving(timeout_s)
        except BaseException:
            handle.kill9()
            raise
        return handle

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _produce(handle: CommitLogProcess, producer: int, cycle: int, big: bool, acks: list[Ack],
             stop: threading.Event) -> None:
    rng = random.Random(cycle * 1000 + producer)
    i = 0
    while not stop.is_set():
        size = rng.randrange(32 * 1024, 200 * 1024) if big else rng.randrange(0, 2048)
        body = f"c{cycle}-p{producer}-{i}-".encode() + rng.randbytes(size)
        queue_id = rng.randrange(QUEUES)
        request = commitlog_pb2.AppendRequest(message=common_pb2.Message(topic=TOPIC, queue_id=queue_id, body=body))
        try:
            result = handle.stub.Append(request, timeout=10)
        except (grpc.RpcError, ValueError):  # the power is gone: an unacknowledged append may or may not be there
            return
        if result.status != commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK:
            return
        acks.append(Ack(body, queue_id, result.commitlog_offset, result.wrote_bytes, result.queue_offset,
                        time.monotonic()))
        i += 1


_FLUSH_LOSS = re.compile(r"recovery under ASYNC_FLUSH after an unclean stop: [^\n]*")
_WITNESSED = re.compile(r"at least (\d+) bytes, (\d+) ms")


def _reported_loss(handle: CommitLogProcess) -> tuple[int, int] | None:
    """(bytes, ms) a witness saw past the log, from the flush-loss WARNING the restarted service
    logged ((0, 0): the WARNING named no witness); None when it logged none."""
    text = handle.log_path.read_text(errors="replace") if handle.log_path.exists() else ""
    found = _FLUSH_LOSS.search(text)
    if found is None:
        return None
    witnessed = _WITNESSED.search(found[0])
    return (0, 0) if witnessed is None else (int(witnessed[1]), int(witnessed[2]))


def _missing(handle: CommitLogProcess, acks: list[Ack]) -> list[Ack]:
    """The acknowledged appends the log does not hold, byte for byte, where the ack said."""
    lost = []
    for ack in acks:
        try:
            response = handle.stub.Read(commitlog_pb2.ReadRequest(offset=ack.commitlog_offset, size=ack.size),
                                        timeout=10)
            record = decode_record(response.data)
            held = (record.body, record.topic, record.queue_id, record.queue_offset)
        except (grpc.RpcError, ValueError) as exc:
            held = (str(exc)[:80].encode(), "", -1, -1)
        if held != (ack.body, TOPIC, ack.queue_id, ack.queue_offset):
            lost.append(ack)
    return lost


def _queue_offsets(handle: CommitLogProcess) -> dict[int, list[int]]:
    """Every record's queue offset, by queue, in log order (through Tail)."""
    by_queue: dict[int, list[int]] = {}
    info = handle.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest())
    offset = info.min_offset
    while offset < info.max_offset:
        chunks = handle.stub.Tail(commitlog_pb2.TailRequest(from_offset=offset, poll_wait_ms=100), timeout=30)
        for chunk in chunks:
            data = memoryview(chunk.data)
            pos = 0
            while pos < len(data):
                size = int.from_bytes(data[pos:pos + 4], "big")
                record = decode_record(bytes(data[pos:pos + size]))
                by_queue.setdefault(record.queue_id, []).append(record.queue_offset)
                pos += size
            offset = chunk.next_offset
            if offset >= info.max_offset:
                break
        chunks.cancel()
    return by_queue


def run_campaign(base: Path, cuts: int, seed: int = 1, mode: str = "drop", env: dict[str, str] | None = None,
                 stop_at_first_loss: bool = True) -> CampaignResult:
    """``cuts`` power cuts of the commitlog service under load; what was lost, if anything."""
    started = time.monotonic()
    rng = random.Random(seed)
    fs = PowerCutMount(base, mode=mode, seed=seed)
    store = fs.mount / "store"
    settings = {**ENV, **(env or {})}
    async_flush = settings["MQSTORE_FLUSH_DISK_TYPE"] == "ASYNC_FLUSH"
    result = CampaignResult()
    acks: list[Ack] = []
    previous: list[Ack] = []
    cut_at = 0.0
    files_before = 0
    logs = base / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    fs.start()
    # Two processes importing ahead: one import takes longer than a short cycle on a busy machine.
    numbers = itertools.count()
    warm = [WarmStart(store, settings, logs, next(numbers)) for _ in range(2)]
    try:
        cycle = 0
        while result.cuts + result.cuts_starting < cuts:
            cycle += 1
            if cycle % 5 == 0:  # a cut while the service starts: mid-recovery, mid-truncation, mid-file-creation
                starting = warm.pop(0)
                starting.release()
                time.sleep(rng.uniform(0.0, 0.6))
                result.cut_outcomes.append(fs.cut(starting.kill))
                result.cuts_starting += 1
                warm.append(WarmStart(store, settings, logs, next(numbers)))
                fs.start()
            handle = warm.pop(0).go()
            warm.append(WarmStart(store, settings, logs, next(numbers)))
            if async_flush and result.cuts:
                result.reported.append(_reported_loss(handle))
            lost_now = _missing(handle, previous)
            result.lost += [ack.describe() for ack in lost_now]
            result.loss_ages_ms += [(cut_at - ack.acked_at) * 1000 for ack in lost_now]
            if result.lost and stop_at_first_loss:
                handle.kill9()
                break
            big = cycle % 4 == 3  # every fourth cycle writes MiBs: it rolls files, and the cut may land mid-roll
            stop = threading.Event()
            per_producer: list[list[Ack]] = [[] for _ in range(PRODUCERS)]
            threads = [threading.Thread(target=_produce, args=(handle, p, cycle, big, per_producer[p], stop))
                       for p in range(PRODUCERS)]
            for thread in threads:
                thread.start()
            # Under ASYNC_FLUSH a cycle spans flush rounds, so what a cut takes is what the last round left.
            time.sleep(rng.uniform(0.02, ASYNC_CYCLE_S if async_flush else 0.8 if big else 0.25))
            cut_at = time.monotonic()
            result.cut_outcomes.append(fs.cut(handle.kill9))
            stop.set()
            for thread in threads:
                thread.join(15)
            previous = [a for acked in per_producer for a in acked]
            acks += previous
            result.cuts += 1
            files_now = len(list((fs.backing / "store" / "commitlog").glob("0*")))
            result.rolls += max(0, files_now - files_before)
            files_before = files_now
            fs.start()
        result.acked = len(acks)
        if not (result.lost and stop_at_first_loss):
            handle = warm.pop(0).go()
            try:
                result.lost += [x for x in map(Ack.describe, _missing(handle, acks)) if x not in result.lost]
                for queue_id, offsets in _queue_offsets(handle).items():
                    if offsets != list(range(len(offsets))):
                        result.lost.append(f"queue {queue_id}: queue offsets used twice or skipped")
            finally:
                handle.stop()
    finally:
        for process in warm:
            process.kill()
        fs.kill()
    result.seconds = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuts", type=int, default=300)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--mode", choices=("drop", "torn"), default="drop")
    parser.add_argument("--flush", choices=("SYNC_FLUSH", "ASYNC_FLUSH"), default="SYNC_FLUSH",
                        help="ASYNC_FLUSH measures the loss window: how long before a cut the lost appends were acked")
    parser.add_argument("--dir", type=Path, default=Path(".bench-tmp/powercut"))
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    result = run_campaign(args.dir, args.cuts, args.seed, args.mode, {"MQSTORE_FLUSH_DISK_TYPE": args.flush},
                          stop_at_first_loss=False)
    print(f"power-cut campaign ({args.flush}, seed {args.seed}, {args.mode}): {result.summary()}")
    if args.flush == "ASYNC_FLUSH":
        print(f"  flush interval {MessageStoreConfig().flush_interval_commit_log} ms (flushIntervalCommitLog); "
              f"thorough flush every {MessageStoreConfig().flush_commit_log_thorough_interval} ms")
    if result.loss_ages_ms:
        ages = sorted(result.loss_ages_ms)
        print(f"  lost appends were acknowledged {ages[0]:.0f} to {ages[-1]:.0f} ms before their cut (median "
              f"{ages[len(ages) // 2]:.0f} ms, p99 {ages[min(len(ages) - 1, len(ages) * 99 // 100)]:.0f} ms)")
    if result.reported:
        seen = [r for r in result.reported if r is not None]
        witnessed = [r for r in seen if r != (0, 0)]
        most = max(witnessed, key=lambda r: r[1], default=(0, 0))
        print(f"  recovery's WARNING named the lost range after {len(seen)} of {len(result.reported)} cuts, "
              f"a witness's lower bound after {len(witnessed)} (largest: {most[0]} bytes, {most[1]} ms of store "
              "time seen by a witness)")
    for line in result.lost[:20]:
        print("  LOST", line)
    return 1 if result.lost and args.flush == "SYNC_FLUSH" else 0  # ASYNC_FLUSH's loss is measured, allowed


if __name__ == "__main__":
    raise SystemExit(main())
