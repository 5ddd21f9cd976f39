"""The leader's HA listener: RocketMQ 4.9.8's HAService.AcceptSocketService.

Listens on ``haListenPort`` (at brokerIP1), starts an :class:`HAConnection` per follower, and owns the
:class:`GroupTransfer` that SYNC_MASTER puts wait on. Like the internal gRPC services, it listens
beyond loopback only when the deployment has a service token (services/server/service_auth.py):
without one, the handshake proves nothing.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading

from services.commitlog.commit_log import CommitLog
from services.commitlog.ha import ha_metrics
from services.commitlog.ha.epoch_file import LeaderEpoch
from services.commitlog.ha.group_transfer import GroupTransfer, ReplicaAckError
from services.commitlog.ha.ha_connection import HAConnection
from services.server.service_auth import TOKEN_ENV
from services.store.config import HA_PROTOCOL_MQSTORE, SYNC_MASTER

log = logging.getLogger(__name__)


class HAServiceError(RuntimeError):
    """The HA listener cannot start with these settings (a bad address, a port in use, no token)."""


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class HAService:
    def __init__(self, engine: CommitLog, token: str | None, leader_epoch: LeaderEpoch | None = None) -> None:
        cfg = engine.config
        self._engine = engine
        self._token = token
        self.leader_epoch = leader_epoch
        self.host = cfg.broker_ip
        self.port = cfg.ha_listen_port
        # RocketMQ 5 counts the leader among the in-sync replicas; a SYNC_MASTER ack needs a follower.
        self.transfer = GroupTransfer(cfg.broker_name, lambda: engine.max_offset,
                                      max(1, cfg.min_in_sync_replicas - 1), cfg.ha_send_timeout / 1000,
                                      cfg.ha_slave_fallbehind_max)
        self._connections: set[HAConnection] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        cfg = self._engine.config
        if cfg.ha_protocol == HA_PROTOCOL_MQSTORE and not self._token and not _is_loopback(self.host):
            raise HAServiceError(f"the HA listener would listen on {self.host}:{self.port} without a service "
                                 f"token: set {TOKEN_ENV} on every replica (or listen on loopback)")
        try:
            listener = socket.create_server((self.host, self.port), reuse_port=False)
        except OSError as exc:
            raise HAServiceError(f"cannot listen for HA followers on {self.host}:{self.port}: {exc.strerror}") \
                from None
        self.port = listener.getsockname()[1]
        listener.settimeout(0.5)  # the accept loop looks at the stop flag this often
        self._listener = listener
        self._accepting = threading.Thread(target=self._accept_loop, name="ha-accept", daemon=True)
        self._accepting.start()
        ha_metrics.bind_followers(self.transfer, lambda: self._engine.max_offset)
        if cfg.broker_role == SYNC_MASTER and self.leader_epoch is None:  # else the in-sync set's rule
            self._engine.wait_for_replicas = self._wait_for_replicas
        log.info("HA listener on %s:%d (%s, haProtocol %s)", self.host, self.port, cfg.broker_role, cfg.ha_protocol,
                 extra={"ha_listen": f"{self.host}:{self.port}"})

    def _wait_for_replicas(self, end: int) -> None:
        try:
            self.transfer.wait_for_replicas(end)
        except ReplicaAckError as exc:
            ha_metrics.UNREPLICATED_PUTS.labels(exc.status.name).inc()
            raise

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            address = f"{peer[0]}:{peer[1]}"
            log.info("HA connection from %s", address, extra={"follower": address})
            connection = HAConnection(sock, address, self._engine, self.transfer, self._token, self._forget,
                                      self.leader_epoch)
            with self._lock:
                self._connections.add(connection)
            connection.start()

    def _forget(self, connection: HAConnection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def stop(self) -> None:
        """Stop accepting, close every follower's connection. Puts still waiting then fail (no follower)."""
        self._stopped.set()
        if self._listener is not None:
            self._listener.close()
        if self._accepting is not None:
            self._accepting.join(5)
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.close("the leader is stopping")
        for connection in connections:
            connection.join(5)
