"""A power-cut campaign of the whole system: ``mqstore up`` on the power-cut file system, producers
through the gateway, cut, restart (``python -m tests.powercut.up_campaign --cuts 20``; part of
``make soak-power`` with SOAK_POWER_UP_CUTS).

Every service's files (commitlog, ConsumeQueues, index, checkpoints, config, the indexer's dispatch
checkpoint) lie on the file system that forgets. After each restart every append acknowledged before
the cut is looked for as a consumer and an operator would: pulled at its queue offset, fetched by its
offset msg id and by its UNIQ_KEY; and no queue offset is acknowledged to two different messages.
"""

from __future__ import annotations

import argparse
import random
import shutil
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, query_pb2
from tests.commitlog.commitlog_process import MIB
from tests.gateway.system_process import UpProcess, start_up
from tests.powercut.mount import PowerCutMount

TOPIC = "PowerCutUp"
FLUSH_LOSS_GAUGES = ("bytes", "ms", "messages")
PRODUCERS = 4
ENV = {"MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH", "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(4 * MIB)}


@dataclass(frozen=True)
class Sent:
    body: bytes
    queue_id: int
    queue_offset: int
    offset_msg_id: str
    uniq_key: str


def _produce(up: UpProcess, producer: int, cycle: int, sent: list[Sent], stop: threading.Event) -> None:
    rng = random.Random(cycle * 1000 + producer)
    i = 0
    while not stop.is_set():
        body = f"c{cycle}-p{producer}-{i}-".encode() + rng.randbytes(rng.randrange(0, 8192))
        try:
            result = up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=TOPIC, body=body)),
                                  timeout=10)
        except (grpc.RpcError, ValueError):
            return
        if result.status == commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK:
            sent.append(Sent(body, result.queue_id, result.queue_offset, result.offset_msg_id, result.uniq_key))
        i += 1


def _retry(call: object, timeout_s: float = 60.0) -> object:
    """``call()`` until it answers (the restarted indexer catches up with the log first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = call()  # type: ignore[operator]
            if answer is not None or time.monotonic() > deadline:
                return answer
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _missing(up: UpProcess, sent: list[Sent]) -> list[str]:
    lost = []
    for s in sent:
        def pull(s: Sent = s) -> bytes | None:
            try:
                got = up.stub.Pull(query_pb2.PullMessageRequest(topic=TOPIC, queue_id=s.queue_id,
                                                                queue_offset=s.queue_offset, max_messages=1),
                                   timeout=10)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.DATA_LOSS:  # the queue's unit points at another record
                    return f"DATA_LOSS: {exc.details()}".encode()
                raise
            return got.messages[0].body if got.messages else None

        pulled = _retry(pull)
        if pulled != s.body:
            why = pulled.decode(errors="replace")[:200] if isinstance(pulled, bytes) and pulled.startswith(b"DATA_") \
                else "another body or none"
            lost.append(f"pull of queue {s.queue_id} offset {s.queue_offset}: {why}")
            continue
        for key, kind in ((s.offset_msg_id, "offset msg id"), (s.uniq_key, "UNIQ_KEY")):
            try:
                view = up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=key, topic=TOPIC), timeout=10)
                if view.message.body != s.body:
                    lost.append(f"{kind} {key}")
            except grpc.RpcError as exc:
                lost.append(f"{kind} {key}: {exc.code()}")
    return lost


def _flush_loss(up: UpProcess) -> tuple[int, ...]:
    """The commitlog's mqstore_commitlog_recovery_flush_loss_* gauges (bytes, ms, messages)."""
    with urllib.request.urlopen(up.metrics_url("commitlog"), timeout=10) as response:
        text = response.read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith("mqstore_commitlog_recovery_flush_loss_")}
    return tuple(int(values.get(f"mqstore_commitlog_recovery_flush_loss_{name}", -1)) for name in FLUSH_LOSS_GAUGES)


def run(base: Path, cuts: int, seed: int, flush: str = "SYNC_FLUSH",
        reports: list[tuple[int, ...]] | None = None) -> tuple[int, list[str], float]:
    """(acknowledged, what was lost, seconds); ``reports`` gets the flush-loss gauges after each cut."""
    started = time.monotonic()
    rng = random.Random(seed)
    fs = PowerCutMount(base, seed=seed)
    fs.start()
    store = fs.mount / "store"
    env = {**ENV, "MQSTORE_FLUSH_DISK_TYPE": flush}
    everything: list[Sent] = []
    previous: list[Sent] = []
    lost: list[str] = []
    try:
        for cycle in range(cuts):
            up = start_up(store, env, timeout_s=180)
            if reports is not None and cycle:
                reports.append(_flush_loss(up))
            if flush == "SYNC_FLUSH":  # under ASYNC_FLUSH the loss is allowed: recovery's report is what is measured
                lost += _missing(up, previous)
            stop = threading.Event()
            per_producer: list[list[Sent]] = [[] for _ in range(PRODUCERS)]
            threads = [threading.Thread(target=_produce, args=(up, p, cycle, per_producer[p], stop))
                       for p in range(PRODUCERS)]
            for thread in threads:
                thread.start()
            time.sleep(rng.uniform(0.2, 2.0))
            fs.cut(up.kill_all)
            stop.set()
            for thread in threads:
                thread.join(15)
            previous = [s for batch in per_producer for s in batch]
            everything += previous
            print(f"cut {cycle + 1}: {len(previous)} acknowledged, {len(lost)} lost so far", flush=True)
            fs.start()
        up = start_up(store, env, timeout_s=180)
        try:
            lost += [x for x in _missing(up, everything) if x not in lost] if flush == "SYNC_FLUSH" else []
            owners: dict[tuple[int, int], bytes] = {}
            for s in everything:
                if owners.setdefault((s.queue_id, s.queue_offset), s.body) != s.body:
                    lost.append(f"queue {s.queue_id} offset {s.queue_offset} acknowledged to two messages")
        finally:
            up.stop()
            up.kill_all()
    finally:
        fs.kill()
    return len(everything), lost, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuts", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--flush", choices=("SYNC_FLUSH", "ASYNC_FLUSH"), default="SYNC_FLUSH")
    parser.add_argument("--dir", type=Path, default=Path(".bench-tmp/powercut-up"))
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    reports: list[tuple[int, ...]] = []
    acked, lost, seconds = run(args.dir, args.cuts, args.seed, args.flush, reports)
    print(f"mqstore up power-cut campaign ({args.flush}, seed {args.seed}): {args.cuts} cuts, {acked} acknowledged "
          f"sends, {len(lost)} lost, {seconds:.0f}s")
    if args.flush == "ASYNC_FLUSH":  # what recovery itself reported of the loss, from its durable witnesses
        print(f"  recovery's flush-loss gauges after each cut (bytes, ms, consumed messages): {reports}")
    for line in lost[:20]:
        print("  LOST", line)
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
