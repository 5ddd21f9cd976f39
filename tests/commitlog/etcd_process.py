"""A real single-member etcd (Debian's etcd-server, ``make etcd``) on dynamic loopback ports, for the
replica leadership tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from services.server.etcd_client import EtcdClient, EtcdError
from tests.commitlog.commitlog_process import free_port

READY_TIMEOUT_S = 20.0


@contextmanager
def running_etcd(data_dir: Path) -> Iterator[str]:
    """Start etcd with its data in ``data_dir``; yields its client endpoint ``127.0.0.1:port``."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.fail("etcd is not installed: run `make etcd` (Debian's etcd-server)")
    client_port, peer_port = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    log = (data_dir.parent / f"{data_dir.name}.log").open("wb")
    process = subprocess.Popen(
        [binary, "--name", "t", "--data-dir", str(data_dir), "--listen-client-urls", client_url,
         "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
         "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"t={peer_url}",
         "--heartbeat-interval", "50", "--election-timeout", "500"],
        stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"127.0.0.1:{client_port}"
    try:
        _wait_ready(endpoint, process)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_ready(endpoint: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    host, port = endpoint.rsplit(":", 1)
    while True:  # the port first: a gRPC channel that dialled too early backs off for seconds
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    client = EtcdClient(endpoint)
    try:
        while True:
            try:
                client.put(b"/ready", b"1")
                return
            except EtcdError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        client.close()
