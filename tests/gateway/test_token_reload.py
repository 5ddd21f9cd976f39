"""The token file reloads without a restart, with real processes: ``mqstore gateway`` in front of the
shard of a ``mqstore up`` system. A changed file is picked up by the poll, SIGHUP to a worker group
reloads every worker, a bad file keeps the old tokens and says why, and no token or digest of one ever
reaches the logs.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from bench.services import free_port_block
from mqstore.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS, commitlog_env, mqstore_command
from tests.gateway.system_process import UpProcess

ALPHA, BETA, GAMMA = "tok-alpha-0001", "tok-beta-00002", "tok-gamma-0003"
LEAKY = "tok-leaky-9999"  # only ever in files the gateway must refuse


def _tokens(*entries: tuple[str, str]) -> str:
    return "tokens:\n" + "".join(f"  - name: {name}\n    token: \"{token}\"\n    produce: [\"reload-*\"]\n"
                                 for name, token in entries)


def _write(path: Path, text: str) -> None:
    """Replace the file in one step, as an editor or a Kubernetes Secret update does."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _send(address: str, token: str) -> grpc.StatusCode:
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        try:
            gateway_pb2_grpc.MessagingServiceStub(channel).Send(
                gateway_pb2.SendRequest(message=common_pb2.Message(topic="reload-a", body=b"x")),
                metadata=(("authorization", f"Bearer {token}"),), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout_s}s: {what}"
        time.sleep(0.05)


def _start(up: UpProcess, directory: Path, reload_ms: int, workers: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    (directory / "gateway.yaml").write_text(f"auth_reload_ms: {reload_ms}\n")
    address = f"127.0.0.1:{free_port_block(1)}"
    log_path = directory / "gateway.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([*mqstore_command(), "gateway", "--config", str(directory / "gateway.yaml"),
                                 "--listen", address, "--commitlog", up.commitlog, "--query", up.query,
                                 "--auth-file", str(directory / "tokens.yaml"), "--workers", str(workers)],
                                env=commitlog_env(), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    _wait(lambda: log_path.read_text().count(" listening on ") == workers, "the gateway listening", 60)
    return proc, address, log_path


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def _assert_no_secret_in(logs: str) -> None:
    for token in (ALPHA, BETA, GAMMA, LEAKY):
        digest = hashlib.sha256(token.encode()).digest()
        for secret in (token, digest.hex(), base64.b64encode(digest).decode(), repr(digest)[2:-1]):
            assert secret not in logs, f"a token or its digest is in the logs: {secret}"


def test_a_changed_token_file_is_reloaded_and_a_bad_one_keeps_the_old_tokens(up: UpProcess, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(_tokens(("alpha", ALPHA)))
    proc, address, log_path = _start(up, tmp_path, reload_ms=100, workers=1)
    logs = log_path.read_text
    try:
        assert _send(address, ALPHA) == grpc.StatusCode.OK
        assert _send(address, BETA) == grpc.StatusCode.UNAUTHENTICATED

        _write(tokens, _tokens(("beta", BETA), ("gamma", GAMMA)))
        _wait(lambda: "reloaded (the file changed): 2 tokens" in logs(), "the reload log line")
        assert _send(address, BETA) == grpc.StatusCode.OK
        assert _send(address, GAMMA) == grpc.StatusCode.OK
        assert _send(address, ALPHA) == grpc.StatusCode.UNAUTHENTICATED  # a removed token stops working

        # A YAML error on the line holding a token: PyYAML would quote that line; the log must not.
        _write(tokens, f"tokens:\n  - name: leaky\n    token: {LEAKY}: x\n")
        _wait(lambda: logs().count("not reloaded") == 1, "the refusal of the bad YAML")
        assert "keeping the 2 tokens loaded before" in logs() and "not valid YAML" in logs()
        # A valid YAML file with an invalid entry, then an empty file (an editor mid-save).
        _write(tokens, _tokens(("leaky", LEAKY), ("again", LEAKY)))
        _wait(lambda: logs().count("not reloaded") == 2, "the refusal of a repeated token")
        _write(tokens, "")
        _wait(lambda: logs().count("not reloaded") == 3, "the refusal of an empty file")
        time.sleep(0.5)  # further polls of the same bad file log nothing more
        assert logs().count("not reloaded") == 3
        assert _send(address, BETA) == grpc.StatusCode.OK
        assert _send(address, LEAKY) == grpc.StatusCode.UNAUTHENTICATED

        tokens.write_text(_tokens(("alpha", ALPHA)))  # written in place this time
        _wait(lambda: "reloaded (the file changed): 1 tokens" in logs(), "the reload after the bad versions")
        assert _send(address, ALPHA) == grpc.StatusCode.OK
        assert _send(address, BETA) == grpc.StatusCode.UNAUTHENTICATED
        assert _stop(proc) == 0, logs()[-3000:]
        _assert_no_secret_in(logs())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sighup_to_a_worker_group_reloads_every_worker(up: UpProcess, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(_tokens(("alpha", ALPHA)))
    proc, address, log_path = _start(up, tmp_path, reload_ms=0, workers=2)  # 0: SIGHUP only
    logs = log_path.read_text
    try:
        _write(tokens, _tokens(("beta", BETA)))
        time.sleep(0.5)
        assert _send(address, ALPHA) == grpc.StatusCode.OK  # not polled: the old tokens stay until SIGHUP
        proc.send_signal(signal.SIGHUP)
        _wait(lambda: logs().count("reloaded (SIGHUP): 1 tokens") == 2, "both workers reloading")
        codes = {(_send(address, ALPHA), _send(address, BETA)) for _ in range(8)}  # 8 connections each
        assert codes == {(grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OK)}

        _write(tokens, "tokens: [")
        proc.send_signal(signal.SIGHUP)
        _wait(lambda: logs().count("not reloaded (SIGHUP)") == 2, "both workers refusing the bad file")
        assert _send(address, BETA) == grpc.StatusCode.OK
        assert len(set(re.findall(r"gateway worker (\d+)/2 started", logs()))) == 2
        assert "exited with" not in logs()  # SIGHUP killed no worker
        assert _stop(proc) == 0, logs()[-3000:]
        _assert_no_secret_in(logs())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
