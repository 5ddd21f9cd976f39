"""Process entry point of the query service: ``mqstore serve query`` and ``python -m services.query``.

The service runs on one asyncio event loop (a ``grpc.aio`` server and aio clients of the indexer and
the commitlog service). Its store root holds only ``lock``, ``config/consumerOffset.json`` and
``config/popCheckpoint.json`` (RocketMQ 5 pop consumption: services/query/pop_checkpoints.py).
Metrics on ``MQSTORE_METRICS_PORT`` like the other services (services/query/metrics.py).

Data reads come from the store files when the shard's store is mounted here (``--store-root``: the
commitlog service's store root; the indexer's is ``STORE_ROOT/indexer`` unless ``--indexer-store``
says otherwise), over gRPC from the indexer and the commitlog service otherwise (``--read-from grpc``,
or no store root: a query service on another machine). See services/query/local_files.py.

Exit codes: 0 after a clean stop, 2 for bad settings or an address it cannot listen on, 3 when
another process holds the store's lock, 4 when the consumer offsets (or pop checkpoint) file and its backup
are unreadable.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import REGISTRY

from mqstore.v1 import query_pb2_grpc
from services.query import DEFAULT_LISTEN
from services.query import metrics as query_metrics
from services.query.arrivals import ArrivalWatcher
from services.query.backends import CommitLogClient, IndexerClient
from services.query.consumer_offsets import ConsumerOffsetTable, OffsetFileError
from services.query.lag import LagMonitor, lag_settings_from_env
from services.query.local_files import LocalCommitLog, LocalIndexer
from services.query.lookup import MessageLookup
from services.query.offset_log import OffsetLog
from services.query.pop_checkpoints import PopCheckpointTable
from services.query.pull import Puller
from services.query.queue_offset_lookup import QueueOffsets
from services.query.servicer import SERVICE_NAME, QueryServicer
from services.query.store_view import StoreView
from services.server.bootstrap import Bootstrap, ServiceProcess, load_process_settings
from services.server.gc_tuning import RPC_SERVER_GEN0_THRESHOLD
from services.server.grpc_server import (
    AioGrpcServer,
    ServerSettings,
    ShutdownSignal,
    serve_aio_until_signal,
    start_aio_service,
    use_blocking_executor,
)
from services.server.process import EXIT_BAD_SETTINGS, EXIT_STORE_LOCKED
from services.store.config import ConfigError, MessageStoreConfig, load_config
from services.store.metadata_log import replicates_metadata
from services.store.rules.cold_read import cold_read_threshold
from services.store.rules.pull_request import DEFAULT_MAX_LONG_POLL_MS
from services.store.store_root import StoreLock, StoreLockedError

log = logging.getLogger("services.query")

EXIT_BAD_OFFSETS_FILE = 4
MIB = 1024 * 1024
DEFAULT_PERSIST_INTERVAL_MS = 5000
# Long polls are coroutines: allow many more calls in flight than a thread-pool server would.
MAX_CONCURRENT_RPCS = 4096
# Only consumer offset writes go to threads.
BLOCKING_WORKERS = 4
# Reads from the files learn of expired commitlog files and quarantined ranges through GetStoreInfo.
STORE_VIEW_REFRESH_S = 1.0
PROCESS = ServiceProcess("query", gc_gen0_threshold=RPC_SERVER_GEN0_THRESHOLD)


@dataclass(slots=True, frozen=True)
class QueryOptions:
    store: str
    config_file: str | None = None
    listen: str | None = None
    commitlog: str | None = None
    indexer: str | None = None
    persist_interval_ms: int = DEFAULT_PERSIST_INTERVAL_MS
    max_long_poll_ms: int = DEFAULT_MAX_LONG_POLL_MS
    #: the commitlog service's store root (the shard's shared volume), for reads from the files
    store_root: str | None = None
    #: the indexer's store root (default STORE_ROOT/indexer)
    indexer_store: str | None = None
    #: "files", "grpc", or None: files when a store root is given, else grpc
    read_from: str | None = None

    def reads_files(self) -> bool:
        """Whether data reads come from the files; ConfigError for a combination that cannot work."""
        mode = self.read_from or ("files" if self.store_root else "grpc")
        if mode not in ("files", "grpc"):
            raise ConfigError(f"--read-from {mode!r}: give files or grpc")
        if mode == "files" and not self.store_root:
            raise ConfigError("--read-from files needs --store-root (the commitlog service's store root, mounted "
                              "here)")
        return mode == "files"


def serve(options: QueryOptions) -> int:
    """Run the query service until SIGTERM/SIGINT; returns the exit code."""
    return Bootstrap(PROCESS).run(lambda: asyncio.run(_serve(options)))


async def _serve(options: QueryOptions) -> int:
    signals = ShutdownSignal()
    signals.install_on_loop()
    try:
        config = load_config(options.config_file)
        metrics_port = load_process_settings(PROCESS).metrics_port
        lag_settings_from_env()
        if options.persist_interval_ms <= 0 or options.max_long_poll_ms < 0:
            raise ConfigError("--persist-interval-ms must be positive and --max-long-poll-ms not negative")
        options.reads_files()
    except (ConfigError, ValueError) as exc:
        log.error("bad settings: %s", exc)
        return EXIT_BAD_SETTINGS
    root = Path(options.store)
    lock = StoreLock(root)
    try:
        lock.acquire()
    except StoreLockedError as exc:
        log.error("cannot start: %s", exc, extra={"store": options.store})
        return EXIT_STORE_LOCKED
    offsets = ConsumerOffsetTable(root / "config")
    pops = PopCheckpointTable(root / "config")
    try:
        offsets.load()
        pops.load()
    except (OffsetFileError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        lock.release()
        return EXIT_BAD_OFFSETS_FILE
    try:
        return await _run(options, config, offsets, pops, signals, metrics_port)
    finally:
        lock.release()


def _backends(options: QueryOptions, config: MessageStoreConfig) -> tuple[IndexerClient, CommitLogClient]:
    indexer_address = options.indexer or config.indexer_listen
    commitlog_address = options.commitlog or config.commitlog_listen
    if not options.reads_files():
        return IndexerClient(indexer_address), CommitLogClient(commitlog_address)
    assert options.store_root is not None
    root = Path(options.store_root)
    commitlog = LocalCommitLog(commitlog_address, root, config.mapped_file_size_commit_log)
    indexer_root = Path(options.indexer_store) if options.indexer_store else root / "indexer"
    return LocalIndexer(indexer_address, indexer_root, config, commitlog), commitlog


async def _run(options: QueryOptions, config: MessageStoreConfig, offsets: ConsumerOffsetTable,
               pops: PopCheckpointTable, signals: ShutdownSignal, metrics_port: int | None) -> int:
    use_blocking_executor(BLOCKING_WORKERS)
    cq_file_size = config.mapped_file_size_consume_queue
    indexer, commitlog = _backends(options, config)
    store = StoreView(commitlog)
    watcher = ArrivalWatcher(indexer)
    query_metrics.bind(lambda: watcher.waiting, lambda: watcher.connected)
    cold_threshold = cold_read_threshold(config.access_message_in_memory_max_ratio) \
        if config.slave_read_enable else None
    puller = Puller(indexer, commitlog, store, watcher, cq_file_size, cold_threshold)
    servicer = QueryServicer(puller, MessageLookup(indexer, commitlog, store), QueueOffsets(indexer, commitlog),
                             offsets, options.max_long_poll_ms, pops=pops,
                             sync_offset_commits=config.consumer_offset_commit_sync)
    if replicates_metadata(config):
        servicer.replicate_offsets(OffsetLog(offsets, commitlog, indexer, puller, pops))
    address = options.listen or DEFAULT_LISTEN
    settings = ServerSettings(listen=address, max_concurrent_rpcs=MAX_CONCURRENT_RPCS,
                              max_receive_message_bytes=MIB).as_internal()
    server = AioGrpcServer(settings, [SERVICE_NAME],
                           lambda s: query_pb2_grpc.add_QueryServiceServicer_to_server(servicer, s))
    watcher.start()
    persister = asyncio.create_task(_persist_periodically(offsets, pops, options.persist_interval_ms / 1000),
                                    name="persist-consumer-offsets")
    max_series, lag_interval_s = lag_settings_from_env()
    lag = LagMonitor(indexer, commitlog, offsets, max_series)
    REGISTRY.register(lag)
    background = [persister, asyncio.create_task(lag.run(lag_interval_s), name="consumer-lag")]
    if servicer.offset_log is not None:
        background.append(asyncio.create_task(servicer.offset_log.run(), name="apply-offset-log"))
    if isinstance(commitlog, LocalCommitLog):
        background.append(asyncio.create_task(store.keep_fresh(STORE_VIEW_REFRESH_S), name="refresh-store-view"))

    def stopping() -> None:
        servicer.begin_shutdown()
        watcher.begin_stop()

    async def stopped() -> None:
        for task in background:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        await watcher.stop()
        for table in (pops, offsets):
            try:
                await asyncio.to_thread(table.persist)
            except OSError:
                log.exception("cannot write %s at stop: changes since the last write are lost", table.path)
        await indexer.close()
        await commitlog.close()

    bound = await start_aio_service(server, metrics_port, stopped)
    if bound is None:
        return EXIT_BAD_SETTINGS
    log.info("query service listening on %s, store %s, indexer %s, commitlog %s, data reads from %s", bound,
             options.store, indexer.address, commitlog.address,
             "the files under " + str(options.store_root) if isinstance(commitlog, LocalCommitLog) else "gRPC",
             extra={"listen": bound, "store": str(Path(options.store).resolve())})
    return await serve_aio_until_signal(server, signals, on_stopping=stopping, on_stopped=stopped)


async def _persist_periodically(offsets: ConsumerOffsetTable, pops: PopCheckpointTable, interval_s: float) -> None:
    """RocketMQ's flushConsumerOffsetInterval: write each table when it changed. Both are snapshot in
    one step of the loop, so the files agree (the pop state's committed offsets are the offsets').
    A failed write is logged and tried again next interval (the stop path writes once more)."""
    while True:
        await asyncio.sleep(interval_s)
        writes: list[tuple[Path, Callable[[], None]]] = []
        if pops.dirty:
            writes.append((pops.path, functools.partial(pops.write, pops.snapshot())))
        if offsets.dirty:
            writes.append((offsets.path, functools.partial(offsets.write, offsets.snapshot())))
        for path, write in writes:
            try:
                await asyncio.to_thread(write)
            except OSError:
                log.exception("cannot write %s; retrying in %.1fs", path, interval_s)
