"""Stopping ``mqstore up`` while RocketMQ 5 clients are connected: the long-lived streams (a push
consumer's Telemetry and long-polling receives, a producer's transaction checks) end at once, so the
stop takes seconds, not the services' drain grace of 10 s each, and logs nothing at ERROR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mqstore.v1 import groups_pb2
from tests.gateway.system_process import UpProcess, start_up
from tests.rocketmq5.test_official_python_client import REPO
from tests.rocketmq5.topics import create_topic

#: Well under one service's drain grace (10 s), and two of them wait in a row (scheduler, gateway).
STOP_LIMIT_S = 8.0


def test_a_stop_with_v2_clients_connected_is_quick_and_quiet(tmp_path: Path) -> None:
    up = start_up(tmp_path / "store")
    clients: list[subprocess.Popen[bytes]] = []
    try:
        create_topic(up, "rmq5-stop", 2)
        env = {**os.environ, "HOME": str(tmp_path)}
        for scenario, args in (("push", {"topic": "rmq5-stop", "group": "g-stop", "fail": "none", "attempts": 1,
                                          "wait_s": 120, "linger_s": 0}),
                               ("orphan", {"topic": "rmq5-stop", "wait_s": 120})):
            clients.append(subprocess.Popen([sys.executable, "-m", "tests.rocketmq5.official_client", scenario,
                                             up.gateway, json.dumps(args)], cwd=REPO, env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while not _members(up, "g-stop") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _members(up, "g-stop"), "the push consumer joined its group"
        time.sleep(2)  # its receives are long polling now, and the producer's checks stream is open
        started = time.monotonic()
        assert up.stop(timeout_s=60) == 0, up.logs()[-5000:]
        took = time.monotonic() - started
        logs = up.logs()
        errors = [line for line in logs.splitlines() if '"level": "ERROR"' in line or "Traceback" in line
                  or "Task was destroyed" in line]
        assert not errors, "\n".join(errors[:20])
        assert took < STOP_LIMIT_S, f"the stop took {took:.1f} s:\n{logs[-4000:]}"
    finally:
        for client in clients:
            client.kill()
            client.wait()
        up.kill_all()


def _members(up: UpProcess, group: str) -> int:
    answer = up.stub.DescribeGroups(groups_pb2.DescribeGroupsRequest(group=group), timeout=10)
    return sum(len(g.members) for g in answer.groups)
