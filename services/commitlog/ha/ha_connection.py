"""One follower's connection on the leader: RocketMQ 4.9.8's HAConnection.

Two threads per follower, as 4.9.8's ReadSocketService and WriteSocketService: the reader takes the
follower's offset reports (after the handshake, in mqstore mode) and acknowledges them to the
:class:`GroupTransfer`; the writer streams the commitlog from where the follower asked, in frames of
at most ``haTransferBatchSize`` within one file, and a heartbeat frame after
``haSendHeartbeatInterval`` without one. Either closes the connection when the other side goes quiet
for ``haHousekeepingInterval`` or breaks the protocol.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from services.commitlog.commit_log import CommitLog
from services.commitlog.ha import ha_metrics, handshake
from services.commitlog.ha.epoch_file import LeaderEpoch
from services.commitlog.ha.group_transfer import Follower, GroupTransfer
from services.commitlog.ha.wire import encode_frame_header, read_report
from services.store.config import HA_PROTOCOL_MQSTORE, MessageStoreConfig

log = logging.getLogger(__name__)
#: The most bytes one send carries, in as many frames as it takes: a burst of puts goes out in one
#: system call (and is answered by one report) rather than one per haTransferBatchSize frame.
SEND_BYTES_MAX = 1024 * 1024


class HAConnection:
    def __init__(self, sock: socket.socket, address: str, engine: CommitLog, transfer: GroupTransfer,
                 token: str | None, on_closed: Callable[[HAConnection], None],
                 leader_epoch: LeaderEpoch | None = None) -> None:
        self._sock = sock
        self.address = address
        self._engine = engine
        self._config: MessageStoreConfig = engine.config
        self._transfer = transfer
        self._token = token
        self._on_closed = on_closed
        self._leader_epoch = leader_epoch
        self._replica = ""  # the follower's name in the in-sync set (a version 2 handshake)
        self._follower: Follower | None = None
        self._requested = threading.Event()  # the first report arrived: the writer knows where to start
        self._request_offset = -1
        self._sent_offset = 0  # the end of what the writer sent
        # The follower's last report, and what of it was acknowledged: a report can arrive before the
        # writer thread has recorded the send it answers; the writer then acknowledges it (else the put
        # would wait for the follower's next report, a heartbeat away).
        self._reported = -1
        self._held = -1
        self._ack_lock = threading.Lock()
        self._closed = threading.Event()
        self._threads = [threading.Thread(target=self._read_loop, name=f"ha-read-{address}", daemon=True),
                         threading.Thread(target=self._write_loop, name=f"ha-write-{address}", daemon=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self, why: str = "") -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._requested.set()
        if why:
            log.info("HA connection from %s closed: %s", self.address, why, extra={"follower": self.address})
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if self._follower is not None:
            self._transfer.remove(self._follower)
        self._on_closed(self)

    def join(self, timeout_s: float) -> None:
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout_s)

    # -- reading the follower ---------------------------------------------------------------
    def _read_loop(self) -> None:
        try:
            self._sock.settimeout(self._config.ha_housekeeping_interval / 1000)
            if self._config.ha_protocol == HA_PROTOCOL_MQSTORE and not self._authenticate():
                return
            follower = self._transfer.add(self.address, self._replica)
            self._follower = follower
            if self._closed.is_set():  # closed while joining: do not stay listed
                self._transfer.remove(follower)
                return
            while not self._closed.is_set():
                offset = read_report(self._sock)
                if self._request_offset < 0:
                    self._request_offset = offset
                    self._requested.set()
                self._reported = offset
                held = self._acknowledge(follower)
                if self._leader_epoch is not None:
                    self._leader_epoch.on_report(self._replica, held)
        except TimeoutError:
            self.close(f"no offset report within haHousekeepingInterval ({self._config.ha_housekeeping_interval} ms)")
        except (OSError, ValueError) as exc:
            self.close(str(exc) if not self._closed.is_set() else "")
        except Exception:
            log.exception("HA connection from %s failed", self.address, extra={"follower": self.address})
        finally:
            self.close()

    def _authenticate(self) -> bool:
        """The mqstore handshake; a failure is logged (WARNING), answered and the connection closed."""
        try:
            hello = handshake.read_hello(self._sock)
            epoch = self._leader_epoch.epoch if self._leader_epoch is not None else handshake.CURRENT_EPOCH
            handshake.check_hello(hello, self._config.broker_name, epoch, self._token)
        except (handshake.HandshakeRefused, OSError, ValueError) as exc:
            ha_metrics.REFUSED_CONNECTIONS.inc()
            log.warning("HA connection from %s REFUSED: %s; closing it, none of its offsets count", self.address,
                        exc, extra={"follower": self.address})
            with contextlib.suppress(OSError):
                self._sock.sendall(handshake.encode_answer(handshake.REFUSED, str(exc)))
            self.close()
            return False
        leader_log = None
        if hello.version >= 2:
            entries = self._leader_epoch.epochs.entries if self._leader_epoch is not None else []
            leader_log = handshake.LeaderLog(self._engine.max_offset, entries, self._engine.quarantine.ranges)
        self._replica = hello.replica
        self._sock.sendall(handshake.encode_answer(handshake.ACCEPTED, leader_log=leader_log,
                                                   version=hello.version))
        log.info("HA follower %s authenticated for shard %s, epoch %d", self.address, hello.shard, hello.epoch,
                 extra={"follower": self.address})
        return True

    # -- streaming to the follower ----------------------------------------------------------
    def _write_loop(self) -> None:
        try:
            self._requested.wait()
            if self._closed.is_set():
                return
            start = self._start_offset(self._request_offset)
            if start is not None:
                self._sent_offset = start
                if self._follower is not None:  # it holds what it asked for, up to where the stream starts
                    self._acknowledge(self._follower)
                self._stream_from(start)
        except (OSError, ValueError) as exc:
            self.close(str(exc) if not self._closed.is_set() else "")
        except Exception:
            log.exception("HA stream to %s failed", self.address, extra={"follower": self.address})
        finally:
            self.close()

    def _acknowledge(self, follower: Follower) -> int:
        """Acknowledge what the follower reported, but never more than was sent: a report beyond it is
        no proof of holding anything. Returns the offset held."""
        with self._ack_lock:
            held = min(self._reported, self._sent_offset)
            if held > self._held:
                self._held = held
                self._transfer.acknowledge(follower, held)
            return held

    def _start_offset(self, requested: int) -> int | None:
        """Where the stream starts: the follower's offset; for an empty follower, 4.9.8 starts at the
        leader's last file (a bare 4.9.8 slave expects that), an mqstore follower gets the whole log (so
        its ConsumeQueues and index match the leader's)."""
        engine = self._engine
        if requested == 0:
            if self._config.ha_protocol == HA_PROTOCOL_MQSTORE:
                start = engine.min_offset
            else:
                max_offset = engine.max_offset
                start = max(0, max_offset - max_offset % self._config.mapped_file_size_commit_log)
        else:
            start = requested
        if start > engine.max_offset:
            log.error("HA follower %s reports offset %d, beyond this leader's max offset %d: its log diverged "
                      "(under etcd leadership a follower cuts that itself before following; without etcd it cannot "
                      "know where): closing the connection", self.address, start, engine.max_offset,
                      extra={"follower": self.address})
            return None
        if start < engine.min_offset:
            log.error("HA follower %s asks for offset %d, below this leader's min offset %d (those files were "
                      "deleted): rebuild it from a copy of the store; closing the connection", self.address, start,
                      engine.min_offset, extra={"follower": self.address})
            return None
        log.info("HA: streaming to %s from offset %d (it reported %d)", self.address, start, requested,
                 extra={"follower": self.address})
        return start

    def _stream_from(self, offset: int) -> None:
        engine, cfg = self._engine, self._config
        batch = cfg.ha_transfer_batch_size
        heartbeat_s = cfg.ha_send_heartbeat_interval / 1000
        last_write = time.monotonic()
        send = self._sock.sendall
        while not self._closed.is_set():
            data = self._read_from(offset, SEND_BYTES_MAX)
            if data:  # frames of at most haTransferBatchSize, as 4.9.8 cuts them, sent with one call
                view = memoryview(data)  # the bytes are copied once, by the join
                send(b"".join(part for i in range(0, len(data), batch)
                              for part in (encode_frame_header(offset + i, min(batch, len(data) - i)),
                                           view[i:i + batch])))
                offset += len(data)
                self._sent_offset = offset
                if self._reported > self._held and self._follower is not None:  # answered before recorded
                    self._acknowledge(self._follower)
                last_write = time.monotonic()
                continue
            if time.monotonic() - last_write >= heartbeat_s:
                send(encode_frame_header(offset, 0))
                last_write = time.monotonic()
            engine.wait_for_data(offset, min(heartbeat_s, 0.5))

    def _read_from(self, offset: int, limit: int) -> bytes:
        """Up to ``limit`` readable bytes of the file that holds ``offset`` (never across files)."""
        mapped = self._engine.mfq.find_by_offset(offset)
        if mapped is None:
            return b""
        position = offset - mapped.file_from_offset
        end = min(mapped.read_position, position + limit)
        if end <= position:
            return b""
        return mapped.read(position, end - position)

