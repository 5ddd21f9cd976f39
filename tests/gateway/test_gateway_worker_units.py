"""Gateway workers, the parts without processes: each worker's round-robin start, the worker identity
and the worker count's sources (flag, environment, settings file)."""

from __future__ import annotations

import collections
import socket
from pathlib import Path

import pytest

from gateway.main import _checked_settings
from gateway.queue_selector import FaultTable, QueueSelector
from gateway.settings import GatewayOptions, GatewaySettings
from gateway.workers import WORKER_ENV, WORKERS_ENV, WorkerIdentity, ensure_port_free, worker_args
from services.cli import build_parser
from services.store.config import ConfigError
from tests.gateway.test_gateway_units import route


def test_each_worker_starts_a_topics_rotation_at_its_share_of_the_queues() -> None:
    """Two workers that each see four sends to an 8-queue topic fill all eight queues, once each (before,
    both started at queue 0 and queues 4..7 got nothing)."""
    r = route(("a", 8, 8, 0))
    counts: collections.Counter[int] = collections.Counter()
    for index in range(2):
        selector = QueueSelector(latency_aware=False, faults=FaultTable(1, 60), worker=(index, 2))
        counts.update(selector.select(r).queue_id for _ in range(4))
    assert counts == collections.Counter(range(8))


def test_a_single_gateway_still_starts_at_queue_zero_and_stays_even() -> None:
    selector = QueueSelector(latency_aware=False, faults=FaultTable(1, 60))
    r = route(("a", 4, 4, 0), ("b", 4, 4, 0))
    picked = [selector.select(r).queue_id for _ in range(16)]
    assert picked[:8] == list(range(8)) and collections.Counter(picked) == collections.Counter(list(range(8)) * 2)


def test_a_worker_group_refuses_port_zero_and_a_port_something_listens_on() -> None:
    with pytest.raises(ConfigError, match="fixed port"):
        ensure_port_free("127.0.0.1:0")
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # even a SO_REUSEPORT listener counts
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            ensure_port_free(f"127.0.0.1:{port}")
    ensure_port_free(f"127.0.0.1:{port}")  # closed: free again


@pytest.mark.parametrize(("text", "expected"), [("", None), ("0/2", WorkerIdentity(0, 2)),
                                                 ("3/4", WorkerIdentity(3, 4))])
def test_the_worker_identity_comes_from_the_supervisors_variable(monkeypatch: pytest.MonkeyPatch, text: str,
                                                                  expected: WorkerIdentity | None) -> None:
    monkeypatch.setenv(WORKER_ENV, text)
    assert WorkerIdentity.from_env() == expected


@pytest.mark.parametrize("text", ["2", "2/2", "-1/2", "a/b"])
def test_a_bad_worker_identity_is_a_settings_error(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(WORKER_ENV, text)
    with pytest.raises(ConfigError, match=WORKER_ENV):
        WorkerIdentity.from_env()


def test_the_worker_count_flag_beats_the_environment_which_beats_the_settings_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("workers: 3\n")
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert _checked_settings(GatewayOptions(config_file=str(config)))[0].workers == 3
    monkeypatch.setenv(WORKERS_ENV, "2")
    assert _checked_settings(GatewayOptions(config_file=str(config)))[0].workers == 2
    assert _checked_settings(GatewayOptions(config_file=str(config), workers=4))[0].workers == 4
    monkeypatch.setenv(WORKERS_ENV, "many")
    with pytest.raises(ConfigError, match=WORKERS_ENV):
        _checked_settings(GatewayOptions())
    with pytest.raises(ConfigError, match="workers must be positive"):
        _checked_settings(GatewayOptions(workers=0))


def test_each_worker_gets_the_supervisors_options_and_one_worker_each() -> None:
    options = GatewayOptions(config_file="g.yaml", listen="0.0.0.0:9876", auth_file="t.yaml",
                             queue_selection="latency", shard=("c:1", "q:2"), default_topic_queue_nums=4, workers=2)
    settings = GatewaySettings(listen="0.0.0.0:9876", workers=2)
    args = build_parser().parse_args(["gateway", *worker_args(options, settings)])
    assert (args.config, args.listen, args.auth_file, args.queue_selection, args.commitlog, args.query,
            args.default_topic_queue_nums, args.workers) == ("g.yaml", "0.0.0.0:9876", "t.yaml", "latency", "c:1",
                                                             "q:2", 4, 1)
