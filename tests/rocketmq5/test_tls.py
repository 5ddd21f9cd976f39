"""RocketMQ 5's protocol over the gateway's TLS (the same port and certificate as mqstore.v1): the
official Python client with ``tls_enable=True`` sends and receives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.system_process import UpProcess
from tests.gateway.test_tls import Certs, TlsGateway, certs  # noqa: F401 - certs is a fixture
from tests.rocketmq5.test_official_python_client import official
from tests.rocketmq5.topics import create_topic


@pytest.fixture(scope="module")
def tls_gateway(up: UpProcess, certs: Certs, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
                ) -> Iterator[TlsGateway]:
    create_topic(up, "rmq5-tls", 1)  # before the second gateway reads its route table
    gateway = TlsGateway(up, tmp_path_factory.mktemp("tls") / "gateway.log",
                         ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)])
    try:
        gateway.wait_listening()
        yield gateway
        assert gateway.stop() == 0, gateway.logs()[-3000:]
    finally:
        if gateway.proc.poll() is None:
            gateway.proc.kill()
            gateway.proc.wait()


def test_official_client_over_tls(up: UpProcess, tls_gateway: TlsGateway, certs: Certs,  # noqa: F811
                                  tmp_path: Path) -> None:
    result = official("tls", tls_gateway.address, tmp_path, topic="rmq5-tls", group="rmq5-tls-group", wait_s=30,
                      extra_env={"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(certs.ca)})
    assert result["received"] == [result["sent"]]
