"""Process entry point of the indexer: ``mqstore indexer`` and ``python -m services.indexer``.

Exit codes as the commitlog service's: 0 clean stop, 2 bad settings or address, 3 store locked.
"""

from __future__ import annotations

import functools
import logging
import os
import struct
from pathlib import Path

import grpc

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, indexer_pb2_grpc
from services.indexer import metrics as indexer_metrics
from services.indexer.indexer_store import IndexerStore
from services.indexer.reput import ReputService, ReputSource
from services.indexer.servicer import SERVICE_NAME, ArrivalHub, IndexerServicer
from services.server.bootstrap import Bootstrap, ServiceProcess
from services.server.channels import sync_channel
from services.server.grpc_server import (
    BindError,
    GrpcServer,
    ServerSettings,
    ShutdownSignal,
    serve_until_signal,
)
from services.server.metrics import MetricsServer, start_metrics_server
from services.server.process import EXIT_BAD_SETTINGS, EXIT_STORE_LOCKED, BadSettings, load_service_settings
from services.store.formats.record import SYSFLAG_POS, store_timestamp_pos
from services.store.store_root import StoreLockedError

log = logging.getLogger("services.indexer")

# Enough of a record to reach STORETIMESTAMP even behind an IPv6 born host.
_STORE_TIME_PREFIX = 48 + 20 + 8
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
PROCESS = ServiceProcess("indexer")


def reput_source_from_env() -> tuple[ReputSource, Path | None]:
    """MQSTORE_INDEXER_REPUT_SOURCE (auto, files, tail; default auto) and MQSTORE_INDEXER_COMMITLOG_DIR
    (the commitlog directory when it is mounted elsewhere than the service's store root says);
    BadSettings naming the accepted values."""
    value = os.environ.get("MQSTORE_INDEXER_REPUT_SOURCE", "auto").strip().lower() or "auto"
    try:
        source = ReputSource(value)
    except ValueError:
        choices = ", ".join(s.value for s in ReputSource)
        log.error("bad settings: MQSTORE_INDEXER_REPUT_SOURCE is %r: use one of %s", value, choices)
        raise BadSettings(value) from None
    directory = os.environ.get("MQSTORE_INDEXER_COMMITLOG_DIR", "").strip()
    return source, Path(directory) if directory else None


class CommitLogReader:
    """What the offset-by-time query needs from the commitlog service: records' store times (its
    binary search) and the commitlog's min offset (units below it are passed over unread)."""

    def __init__(self, address: str) -> None:
        self._channel = sync_channel(address)
        self._stub = commitlog_pb2_grpc.CommitLogServiceStub(self._channel)

    def store_time_of(self, commitlog_offset: int, size: int) -> int:
        """-1 when the record cannot be read, as RocketMQ's pickupStoreTimestamp: the query then
        answers 0. Only times that were read are cached."""
        try:
            return self._read_store_time(commitlog_offset, size)
        except (grpc.RpcError, struct.error):
            return -1

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one reader per process, lives as long as it
    def _read_store_time(self, commitlog_offset: int, size: int) -> int:
        data = self._stub.Read(commitlog_pb2.ReadRequest(offset=commitlog_offset,
                                                         size=min(size, _STORE_TIME_PREFIX)), timeout=5).data
        sys_flag = _I32.unpack_from(data, SYSFLAG_POS)[0]
        return int(_I64.unpack_from(data, store_timestamp_pos(sys_flag))[0])

    def min_offset(self) -> int:
        """The commitlog's min offset now (RocketMQ's getMinPhyOffset); 0 when it cannot be asked."""
        try:
            return int(self._stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5).min_offset)
        except grpc.RpcError:
            return 0

    def close(self) -> None:
        self._channel.close()


def serve(store: str, config_file: str | None, listen: str | None, commitlog: str | None) -> int:
    """Run the indexer on ``store`` following the commitlog service at ``commitlog``."""
    return Bootstrap(PROCESS).run(lambda: _serve(store, config_file, listen, commitlog))


def _serve(store: str, config_file: str | None, listen: str | None, commitlog: str | None) -> int:
    signals = ShutdownSignal()
    signals.install()
    try:
        config, process = load_service_settings(config_file, PROCESS)
        source, commitlog_dir = reput_source_from_env()
    except BadSettings:
        return EXIT_BAD_SETTINGS
    commitlog_address = commitlog or config.commitlog_listen
    indexer = IndexerStore(config, store)
    try:
        indexer.start()
    except StoreLockedError as exc:
        log.error("cannot start: %s", exc)
        return EXIT_STORE_LOCKED
    hub = ArrivalHub()
    indexer.add_arrival_listener(hub.publish)
    reput = ReputService(indexer, commitlog_address, source=source, commitlog_dir=commitlog_dir)
    indexer_metrics.bind(indexer, reput)
    reader = CommitLogReader(commitlog_address)
    servicer = IndexerServicer(indexer, reput, hub, reader.store_time_of, reader.min_offset)
    address = listen or config.indexer_listen
    server = GrpcServer(ServerSettings(listen=address).as_internal(), [SERVICE_NAME],
                        lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(servicer, s))
    metrics_server: MetricsServer | None = None
    try:
        port = server.start()
        metrics_server = start_metrics_server(process.metrics_port)
    except (BindError, OSError) as exc:
        log.error("%s", exc)
        server.stop(grace_s=0)
        indexer.shutdown()
        return EXIT_BAD_SETTINGS
    reput.start()
    bound = f"{address.rpartition(':')[0]}:{port}"
    log.info("indexer listening on %s, store %s, following the commitlog at %s", bound, store, commitlog_address,
             extra={"listen": bound, "store": str(Path(store).resolve()), "commitlog": commitlog_address})

    def stopping() -> None:
        servicer.stopping.set()
        hub.end_streams()
        reput.stop()

    def stopped() -> None:
        indexer.shutdown()
        reader.close()
        if metrics_server is not None:
            metrics_server.stop()

    return serve_until_signal(server, signals, on_stopping=stopping, on_stopped=stopped)
