"""A short measurement of RocketMQ 5's protocol on the gateway (not a test; the machine is shared, so the
numbers are rough): ``python -m tests.rocketmq5.measure [N]`` starts ``mqstore up`` in a temporary
directory and prints sequential v2 SendMessage vs mqstore.v1 Send rates, receive (batches of 32) + one
ack per message, how soon a waiting receive wakes after a send, and the gateway's CPU while it waits."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from apache.rocketmq.v2 import definition_pb2 as d
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from mqstore.v1 import common_pb2, gateway_pb2
from tests.gateway.system_process import start_up
from tests.rocketmq5.test_protocol import ack, receive
from tests.rocketmq5.topics import create_topic


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        up = start_up(Path(root) / "store")
        try:
            create_topic(up, "m", 4)
            v2 = service_pb2_grpc.MessagingServiceStub(up.channel)
            gateway_pid = next(int(line.split("(pid ")[1].split(")")[0]) for line in up.logs().splitlines()
                               if line.startswith("started gateway") and "(pid " in line)
            message = d.Message(topic=d.Resource(name="m"), body=b"x" * 100, system_properties=d.SystemProperties(
                tag="T", message_type=d.MessageType.NORMAL, body_encoding=d.Encoding.IDENTITY))
            started = time.perf_counter()
            for _ in range(n):
                assert v2.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10).status.code == d.Code.OK
            v2_rate = n / (time.perf_counter() - started)
            started = time.perf_counter()
            for _ in range(n):
                up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(
                    topic="m", body=b"x" * 100, properties={"TAGS": "T"})), timeout=10)
            v1_rate = n / (time.perf_counter() - started)
            started, got = time.perf_counter(), 0
            while got < 2 * n:
                messages, _ = receive(v2, "m", "mg", 30, wait_s=1)
                for m in messages:
                    assert ack(v2, "m", "mg", m.system_properties.receipt_handle).status.code == d.Code.OK
                got += len(messages)
            receive_rate = got / (time.perf_counter() - started)
            woke: dict[str, Any] = {}

            def waiter() -> None:
                receive(v2, "m", "mg", 30, wait_s=10)
                woke["at"] = time.perf_counter()

            thread = threading.Thread(target=waiter)
            thread.start()
            time.sleep(1.0)
            cpu_before = _cpu_s(gateway_pid)
            time.sleep(2.0)
            idle_cpu = (_cpu_s(gateway_pid) - cpu_before) / 2.0
            sent_at = time.perf_counter()
            v2.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10)
            thread.join()
            print(f"N={n}: v2 SendMessage {v2_rate:.0f}/s, mqstore.v1 Send {v1_rate:.0f}/s, v2 receive(32) + ack "
                  f"{receive_rate:.0f} msg/s; a waiting receive woke {1000 * (woke['at'] - sent_at):.0f} ms after "
                  f"the send; gateway CPU while one receive waits {idle_cpu * 100:.1f}%")
        finally:
            up.stop()
            up.kill_all()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
