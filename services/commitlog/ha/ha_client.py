"""A follower's link to its leader: RocketMQ 4.9.8's HAService.HAClient.

Connects to ``haMasterAddress``, passes the mqstore handshake (unless ``haProtocol=rocketmq``),
reports its max physical offset, and appends every frame the leader sends at the offset it names
(:class:`ReplicaAppender`). It reports again after every frame that moved its log and at least every
``haSendHeartbeatInterval``; a leader silent for ``haHousekeepingInterval`` is dropped and dialled
again. What it reports is what it holds: with ``flushDiskType=SYNC_FLUSH`` the bytes are flushed
before they are reported, with ASYNC_FLUSH they are reported once written (its flush service makes
them durable later). A SYNC_MASTER leader acknowledges on these reports.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time

from services.commitlog.commit_log import CommitLog
from services.commitlog.ha import handshake
from services.commitlog.ha.epoch_file import EpochFile, consistent_point
from services.commitlog.ha.replica_append import ReplicaAppender, ReplicationError
from services.commitlog.ha.truncation import truncate_log
from services.commitlog.ha.wire import ConnectionClosed, encode_report, read_frame
from services.store.config import HA_PROTOCOL_MQSTORE, split_host_port

log = logging.getLogger(__name__)
#: How long a failed connection waits before the next try (4.9.8 waits 5 s), doubling while tries
#: get no frame (a leader that is down, or that refuses this follower) up to the maximum.
RECONNECT_DELAY_S = 1.0
MAX_RECONNECT_DELAY_S = 30.0
#: A frame holds at most haTransferBatchSize bytes; allow some slack for a leader configured larger.
MAX_FRAME_BYTES = 64 * 1024 * 1024
#: Frames already received are appended together up to this many bytes.
APPEND_BYTES_MAX = 4 * 1024 * 1024


class HAClient:
    """``leader``, ``epoch``, ``epochs``: under etcd leadership, the leader etcd names, its epoch and this
    replica's epoch file (before following, the log is cut back to where it stops being the leader's);
    otherwise ``haMasterAddress`` and epoch 0."""

    def __init__(self, engine: CommitLog, token: str | None, leader: str = "",
                 epoch: int = handshake.CURRENT_EPOCH, epochs: EpochFile | None = None, replica: str = "") -> None:
        self._engine = engine
        self._config = engine.config
        self._token = token
        self.leader = leader or self._config.ha_master_address
        self.epoch = epoch
        self._epochs = epochs
        self._replica = replica
        self._host, self._port = split_host_port(self.leader)
        self._appender = ReplicaAppender(engine)
        self._got_frame = False  # this connection received a frame: the next failure retries soon
        self._stopped = threading.Event()
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="ha-client", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)

    def _run(self) -> None:
        delay = RECONNECT_DELAY_S
        while not self._stopped.is_set():
            self._got_frame = False
            try:
                self._follow()
            except handshake.HandshakeRefused as exc:
                log.error("HA: %s (leader %s)", exc, self.leader, extra={"leader": self.leader})
            except (OSError, ReplicationError) as exc:
                if not self._stopped.is_set():
                    log.warning("HA: the link to leader %s broke: %s; reconnecting", self.leader, exc,
                                extra={"leader": self.leader})
            except Exception:  # a full disk, a bug: never stop following silently
                log.exception("HA: following leader %s failed; reconnecting", self.leader,
                              extra={"leader": self.leader})
            finally:
                self.connected.clear()
                self._appender.reset()
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
            if self._got_frame:
                delay = RECONNECT_DELAY_S
            self._stopped.wait(delay)
            delay = min(2 * delay, MAX_RECONNECT_DELAY_S)

    def _follow(self) -> None:
        cfg = self._config
        sock = socket.create_connection((self._host, self._port), timeout=cfg.ha_housekeeping_interval / 1000)
        self._sock = sock
        if self._stopped.is_set():
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if cfg.ha_protocol == HA_PROTOCOL_MQSTORE:
            sock.sendall(handshake.encode_hello(handshake.Hello(cfg.broker_name, self.epoch,
                                                                (self._token or "").encode(), self._replica)))
            handshake.read_answer(sock)
            leader_log = handshake.read_leader_log(sock)
            if self._epochs is not None:
                self._cut_divergent_suffix(leader_log)
            self._appender.adopt_quarantine(leader_log.quarantined, self.leader)
        reported = self._appender.log_end
        sock.sendall(encode_report(reported))
        last_report = time.monotonic()
        log.info("HA: following leader %s from offset %d", self.leader, reported, extra={"leader": self.leader})
        self.connected.set()
        heartbeat_s = cfg.ha_send_heartbeat_interval / 1000
        while not self._stopped.is_set():
            try:
                offset, data = read_frame(sock, MAX_FRAME_BYTES)
            except TimeoutError:
                raise ConnectionClosed(f"nothing from the leader within haHousekeepingInterval "
                                       f"({cfg.ha_housekeeping_interval} ms)") from None
            self._got_frame = True
            if data:
                end = self._appender.append(offset, self._more_frames(sock, offset, data))
                if self._engine.sync_flush:
                    self._engine.mfq.flush_until(end)
            else:  # a heartbeat: where the leader's stream is
                self._appender.accept_start(offset)
                end = self._appender.log_end
            if end != reported or time.monotonic() - last_report >= heartbeat_s:
                sock.sendall(encode_report(end))
                reported, last_report = end, time.monotonic()

    def _more_frames(self, sock: socket.socket, offset: int, data: bytes) -> bytes:
        """``data`` and the frames after it that have already arrived (up to APPEND_BYTES_MAX), as one
        run of bytes from ``offset``: a burst is appended, flushed and reported once, not per frame.
        A heartbeat among them is checked against the run's end; a gap is a ReplicationError."""
        pieces, end = [data], offset + len(data)
        while end - offset < APPEND_BYTES_MAX and select.select([sock], [], [], 0)[0]:
            at, more = read_frame(sock, MAX_FRAME_BYTES)
            if at != end:
                raise ReplicationError(f"the leader sent offset {at} after a frame that ended at {end}")
            pieces.append(more)
            end += len(more)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _cut_divergent_suffix(self, leader_log: handshake.LeaderLog) -> None:
        """Cut this log back to the point it shares with the leader's, then take the leader's epochs."""
        assert self._epochs is not None
        end = self._appender.log_end
        cut = consistent_point(self._epochs.entries, end, leader_log.epochs, leader_log.max_offset)
        if cut < end:
            log.warning("HA: this replica's log diverges from leader %s (epoch %d) after offset %d: cutting %d bytes "
                        "that were never acknowledged", self.leader, self.epoch, cut, end - cut,
                        extra={"leader": self.leader})
            truncate_log(self._engine, self._epochs, cut)
        self._epochs.replace(leader_log.epochs)
