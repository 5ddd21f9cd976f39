"""Every service process starts the same way (services/server/bootstrap.py), with its own settings."""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway import main as gateway_main
from services.commitlog import main as commitlog_main
from services.indexer import main as indexer_main
from services.query import main as query_main
from services.scheduler import main as scheduler_main
from services.server.bootstrap import Bootstrap, ServiceProcess
from services.server.gc_tuning import GEN0_THRESHOLD, RPC_SERVER_GEN0_THRESHOLD
from services.server.memory_debug import INTERVAL_ENV, REPORT_DIR_ENV
from tests.commitlog.commitlog_process import start_commitlog, stop_cleanly


def wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def gc_threshold() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_run_sets_the_process_up_around_serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                gc_threshold: None) -> None:
    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(INTERVAL_ENV, "0.05")
    seen: list[int] = []

    report = tmp_path / f"unit-{os.getpid()}.jsonl"

    def serve() -> int:
        seen.append(gc.get_threshold()[0])
        # A whole first line, not only the file: the reporter's open creates it before the line is written.
        wait_until(lambda: report.exists() and report.read_text().endswith("\n"), timeout_s=30)
        return 7

    assert Bootstrap(ServiceProcess("unit", gc_gen0_threshold=12_345)).run(serve) == 7
    assert seen == [12_345]
    line = report.read_text().splitlines()[0]
    assert "rss_kb" in json.loads(line)


def test_no_threshold_keeps_cpythons(gc_threshold: None) -> None:
    before = gc.get_threshold()
    assert Bootstrap(ServiceProcess("unit", gc_gen0_threshold=None)).run(lambda: gc.get_threshold()[0]) == before[0]


@pytest.mark.parametrize(("serve", "name", "gen0", "internal"), [
    (lambda: commitlog_main.serve("store", None, None), "commitlog", GEN0_THRESHOLD, True),
    (lambda: indexer_main.serve("store", None, None, None), "indexer", GEN0_THRESHOLD, True),
    (lambda: query_main.serve(query_main.QueryOptions("store")), "query", RPC_SERVER_GEN0_THRESHOLD, True),
    (lambda: scheduler_main.serve(scheduler_main.SchedulerOptions("store", "root")), "scheduler", None, True),
])
def test_every_service_main_runs_through_the_bootstrap(monkeypatch: pytest.MonkeyPatch, serve: Callable[[], int],
                                                       name: str, gen0: int | None, internal: bool) -> None:
    ran: list[ServiceProcess] = []

    def run(self: Bootstrap, _: Callable[[], int]) -> int:
        ran.append(self.process)
        return 0

    monkeypatch.setattr(Bootstrap, "run", run)
    assert serve() == 0
    assert ran == [ServiceProcess(name, gen0, internal)]


def test_the_gateway_is_public() -> None:
    assert gateway_main.PROCESS.internal is False
    assert gateway_main.PROCESS.gc_gen0_threshold == RPC_SERVER_GEN0_THRESHOLD


def test_the_commitlog_process_writes_the_memory_report(tmp_path: Path) -> None:
    """The memory report is part of every service's start-up (the commitlog's included)."""
    reports = tmp_path / "reports"
    server = start_commitlog(tmp_path / "store", {REPORT_DIR_ENV: str(reports), INTERVAL_ENV: "0.1"})
    try:
        report = reports / f"commitlog-{server.pid}.jsonl"
        wait_until(lambda: report.exists() and report.stat().st_size > 0, timeout_s=10)
    finally:
        stop_cleanly(server)
