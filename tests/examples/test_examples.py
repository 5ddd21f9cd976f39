"""The scripts under examples/ run as a user runs them, against one ``mqstore up`` (real processes).

The store checks transactions every 0.5 s here (the defaults, 6 s then 60 s, would make the
transaction example take minutes); everything else is the default.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.client import Client
from tests.gateway.system_process import UpProcess, start_up

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV = {"MQSTORE_TRANSACTION_TIMEOUT_MS": "1000", "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": "500"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    started = start_up(tmp_path_factory.mktemp("examples") / "store", ENV)
    try:
        yield started
        assert started.stop() == 0, started.logs()[-3000:]
    finally:
        started.kill_all()


def _run(up: UpProcess, script: str, *args: str, timeout: float = 90) -> str:
    env = {**os.environ, "MQSTORE_GATEWAY": up.gateway}
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


def test_delayed_and_timer(up: UpProcess) -> None:
    out = _run(up, "delayed_and_timer.py")
    assert "parked in SCHEDULE_TOPIC_XXXX" in out and "parked in rmq_sys_wheel_timer" in out
    delivered = [line for line in out.splitlines() if line.startswith("delivered")]
    assert len(delivered) == 2 and all("ms after due" in line and " -" not in line for line in delivered)


def test_transaction_check(up: UpProcess) -> None:
    out = _run(up, "transaction_check.py")
    assert [line.split(": ")[-1] for line in out.splitlines() if line.startswith("check #")] == \
        ["UNKNOWN", "UNKNOWN", "COMMIT"]
    assert "committed: 'order 1'" in out


def test_retry_to_dead_letter(up: UpProcess) -> None:
    out = _run(up, "retry_to_dead_letter.py")
    tries = [line for line in out.splitlines() if line.startswith("try ")]
    assert len(tries) == 3 and "%RETRY%" in tries[0] and "%RETRY%" in tries[1] and "%DLQ%" in tries[2]
    assert "reconsume times 3" in out and "re-sent to jobs_" in out


def test_group_members_share_the_queues(up: UpProcess) -> None:
    with Client(up.gateway) as client:
        client.create_topic("example_orders", 4)
    env = {**os.environ, "MQSTORE_GATEWAY": up.gateway}
    members = [subprocess.Popen([sys.executable, str(EXAMPLES / "group_member.py"), "example_billing",
                                 "example_orders", "9"], env=env, stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    outputs = [m.communicate(timeout=60)[0] for m in members]
    assert all(m.returncode == 0 for m in members), outputs
    last = [ast.literal_eval([line for line in out.splitlines() if line.startswith("holds ")][-1][6:])
            for out in outputs]
    held = [set(h.get("example_orders", [])) for h in last]
    assert held[0] and held[1] and not held[0] & held[1] and held[0] | held[1] == {0, 1, 2, 3}
