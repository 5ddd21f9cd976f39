"""Fixtures of the client tests: one ``mqstore up`` for the whole folder (real processes).

Starting the system is most of the folder's run time, so it is shared by every test module here;
tests keep apart by using their own topics and groups (``topic`` gives each test a fresh name).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import pytest

from mqstore.client import Client, MqstoreError
from tests.commitlog.commitlog_process import mqstore_command
from tests.gateway.system_process import UpProcess, running_up

_names = itertools.count()
T = TypeVar("T")


@pytest.fixture(scope="package")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("client-up") / "store") as started:
        yield started


@pytest.fixture(scope="package")
def gateway(up: UpProcess) -> str:
    return up.gateway


@pytest.fixture
def client(gateway: str) -> Iterator[Client]:
    with Client(gateway) as c:
        yield c


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:80]
    return f"{base}_{next(_names)}"


def eventually(check: Callable[[], T], timeout_s: float = 10.0) -> T:
    """``check()`` once it stops raising: what the indexer makes findable (by key, by UNIQ_KEY, by
    pull) lags the commitlog by a few milliseconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except (MqstoreError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str


def client_env() -> dict[str, str]:
    """The environment without MQSTORE_* settings, so only the command line picks the gateway."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}


def run_cli(*args: str, stdin: str | None = None, timeout: float = 60) -> Run:
    proc = subprocess.run([*mqstore_command(), *args], input=stdin, capture_output=True, text=True,
                          env=client_env(), timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr)
