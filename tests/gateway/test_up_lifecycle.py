"""``mqstore up`` as a newcomer uses it: Ctrl-C (SIGINT) stops every service cleanly, a second start
reuses the data, and the welcome text names the gateway. Every service's /metrics answers. A second
``up`` on ports in use fails naming the port; a killed service is restarted."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from bench.services import free_port_block
from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from services.runner import ChildSpec, _Child
from services.server.process import RestartPolicy
from tests.commitlog.commitlog_process import commitlog_env, mqstore_command
from tests.gateway.system_process import UpProcess, running_up, start_up


def test_ctrl_c_stops_cleanly_and_a_second_start_reuses_the_data(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = start_up(store)
    try:
        assert f"Gateway: {first.gateway}" in first.logs() and "mqstore send" in first.logs()
        sent = first.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="kept", body=b"survives")),
                               timeout=10)
        scraped = urllib.request.urlopen(first.metrics_url("gateway"), timeout=10).read().decode()
        assert "mqstore_gateway_sent_messages_total 1.0" in scraped
        for service in ("commitlog", "indexer", "query"):
            assert urllib.request.urlopen(first.metrics_url(service), timeout=10).status == 200
        first.channel.close()
        first.proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers (the children have their own sessions)
        assert first.proc.wait(90) == 0, first.logs()[-3000:]
    finally:
        first.kill_all()
    logs = first.logs()
    assert [name for name in ("gateway", "query", "indexer", "commitlog") if f"{name} stopped (exit code 0)" in logs] \
        == ["gateway", "query", "indexer", "commitlog"]
    assert logs.index("gateway stopped") < logs.index("query stopped") < logs.index("commitlog stopped")
    assert not (store / "abort").exists() and not (store / "indexer" / "abort").exists()

    # The second start appends to the same log: without this, the first's "mqstore is up" would be
    # taken for the second's, and the test would go on while the second is still starting.
    first.log_path.rename(first.log_path.with_name("first-up.log"))
    second = start_up(store)
    try:
        pulled = second.stub.Pull(query_pb2.PullMessageRequest(topic="kept", queue_id=sent.queue_id,
                                                               queue_offset=sent.queue_offset), timeout=10)
        assert [m.body for m in pulled.messages] == [b"survives"]
        assert pulled.messages[0].uniq_key == sent.msg_id
        assert second.stop() == 0
    finally:
        second.kill_all()


def _pid_of(up: UpProcess, service: str) -> int:
    """The pid of ``service``'s latest start, from the runner's ``started NAME (pid N)`` lines."""
    pids = re.findall(rf"^started {service} \(pid (\d+)\)", up.logs(), re.MULTILINE)
    return int(pids[-1])


def _send_until_it_works(up: UpProcess, body: bytes, timeout_s: float = 60.0) -> gateway_pb2.SendResult:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="supervised", body=body)),
                                timeout=5, wait_for_ready=True)
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _pull_until_found(up: UpProcess, sent: gateway_pb2.SendResult, timeout_s: float = 60.0) -> bytes:
    """The body at ``sent``'s position, pulled as a consumer does: again until the restarted services
    have caught up."""
    request = query_pb2.PullMessageRequest(topic="supervised", queue_id=sent.queue_id, queue_offset=sent.queue_offset,
                                           long_poll_ms=1000)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pulled = up.stub.Pull(request, timeout=5)
            if pulled.messages:
                return pulled.messages[0].body
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
        assert time.monotonic() < deadline, "not found"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """One system for the tests below (each leaves it serving); its final stop must be clean."""
    with running_up(tmp_path_factory.mktemp("up") / "store") as started:
        yield started


def test_a_second_up_on_busy_ports_fails_naming_the_port(up: UpProcess, tmp_path: Path) -> None:
    metrics_base_port = free_port_block(7, avoid=range(up.base_port, up.base_port + 5))
    second = subprocess.run(
        [*mqstore_command(), "up", "--store", str(tmp_path / "second"), "--base-port", str(up.base_port),
         "--metrics-base-port", str(metrics_base_port)],
        env=commitlog_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    output = second.stdout + second.stderr
    assert second.returncode == 1, output
    assert "is SERVING" not in output and "mqstore is up" not in output
    assert f"commitlog did not start: port {up.commitlog} is taken by another process" in output
    _send_until_it_works(up, b"undisturbed")


def test_a_killed_service_is_restarted_and_the_system_keeps_working(up: UpProcess) -> None:
    before = _send_until_it_works(up, b"before")
    for service in ("gateway", "commitlog"):
        os.kill(_pid_of(up, service), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while f"{service} is SERVING again" not in up.logs():
            assert up.proc.poll() is None, up.logs()[-3000:]
            assert time.monotonic() < deadline, up.logs()[-3000:]
            time.sleep(0.1)
        assert f"{service} exited with signal SIGKILL: restarting it" in up.logs()
        after = _send_until_it_works(up, service.encode())
        assert _pull_until_found(up, after) == service.encode()
    assert _pull_until_found(up, before) == b"before"


def test_backoff_doubles_and_repeated_deaths_give_up() -> None:
    policy = RestartPolicy(max_restarts=3, window_s=10.0, first_backoff_s=0.5, max_backoff_s=1.5)
    assert [policy.died(t) for t in (0.0, 1.0, 2.0)] == [0.5, 1.0, 1.5]
    assert policy.died(3.0) is None  # a fourth death within 10 s
    assert policy.died(12.5) == 1.0  # only the death at 3 s is still within the window: two


class _DyingChild(_Child):
    """A child whose process exits at once with code 3."""

    def start(self) -> subprocess.Popen[bytes]:
        self.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        return self.proc


def test_a_child_that_keeps_dying_stops_the_system_saying_why() -> None:
    child = _DyingChild(ChildSpec("broken", [], "127.0.0.1:1"),
                        restarts=RestartPolicy(max_restarts=2, first_backoff_s=0.01))
    assert child.start_serving() is None  # it exited: counted by supervise
    deadline = time.monotonic() + 30
    failure = None
    while failure is None:
        assert time.monotonic() < deadline
        failure = child.supervise()
        time.sleep(0.02)
    assert failure == "broken exited 3 times within 60 s (last: code 3); restarting it does not help"
