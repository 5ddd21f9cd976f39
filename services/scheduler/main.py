"""Process entry point of the scheduler: ``mqstore serve scheduler`` and ``python -m services.scheduler``.

One asyncio event loop: the delivery loop (services/scheduler/delivery.py), a ``grpc.aio`` server
with only health and reflection (the scheduler answers no RPC of its own), Prometheus metrics on
``MQSTORE_METRICS_PORT``. It reads the shard's files (``--store-root``: the commitlog service's store
root; the indexer's is ``STORE_ROOT/indexer`` unless ``--indexer-store`` says otherwise) and writes
only under its own ``--store``: ``config/delayOffset.json`` (delay levels) and ``timer/`` (timer
messages, services/scheduler/timer_delivery.py; docs/scheduling.md).

Exit codes: 0 after a clean stop, 2 for bad settings or an address it cannot listen on, 3 when
another process holds its store's lock, 4 when delayOffset.json and its backup, or the timer store,
are unreadable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from services.scheduler import DEFAULT_LISTEN
from services.scheduler.delivery import DelayScheduler
from services.scheduler.peers import CommitLogPeer, IndexerPeer
from services.scheduler.replicated_state import ReplicatedStateFile
from services.scheduler.store_reader import ScheduleFiles
from services.scheduler.timer_delivery import PROGRESS_NAME as TIMER_PROGRESS_NAME
from services.scheduler.timer_delivery import TimerScheduler
from services.scheduler.transaction_check import FILE_NAME as TX_OFFSETS_FILE
from services.scheduler.transaction_check import SERVICE_NAME as TX_SERVICE_NAME
from services.scheduler.transaction_check import CheckSettings, TransactionChecker
from services.scheduler.transaction_check import register as register_transactions
from services.server.bootstrap import Bootstrap, ServiceProcess, load_process_settings
from services.server.grpc_server import (
    AioGrpcServer,
    ServerSettings,
    ShutdownSignal,
    serve_aio_until_signal,
    start_aio_service,
)
from services.server.process import EXIT_BAD_SETTINGS, EXIT_STORE_LOCKED
from services.store.config import ConfigError, load_config
from services.store.formats.delay_offsets_file import FILE_NAME
from services.store.formats.message import parse_delay_levels
from services.store.formats.store_layout import INDEXER_DIR
from services.store.metadata_log import replicates_metadata
from services.store.store_root import StoreLock, StoreLockedError

log = logging.getLogger("services.scheduler")

EXIT_BAD_OFFSETS_FILE = 4
#: RocketMQ's flushDelayOffsetInterval
DEFAULT_PERSIST_INTERVAL_MS = 10_000
#: Its collector keeps CPython's threshold: the scheduler's loop makes few short-lived objects.
PROCESS = ServiceProcess("scheduler", gc_gen0_threshold=None)


@dataclass(slots=True, frozen=True)
class SchedulerOptions:
    store: str
    store_root: str
    config_file: str | None = None
    listen: str | None = None
    commitlog: str | None = None
    indexer: str | None = None
    indexer_store: str | None = None
    persist_interval_ms: int = DEFAULT_PERSIST_INTERVAL_MS


def serve(options: SchedulerOptions) -> int:
    """Run the scheduler until SIGTERM/SIGINT; returns the exit code."""
    return Bootstrap(PROCESS).run(lambda: asyncio.run(_serve(options)))


async def _serve(options: SchedulerOptions) -> int:
    signals = ShutdownSignal()
    signals.install_on_loop()
    try:
        config = load_config(options.config_file)
        levels = parse_delay_levels(config.message_delay_level)
        metrics_port = load_process_settings(PROCESS).metrics_port
        if options.persist_interval_ms <= 0:
            raise ConfigError("--persist-interval-ms must be positive")
        check_settings = dataclasses.replace(CheckSettings.from_env(),
                                             file_reserved_ms=config.file_reserved_time * 3_600_000)
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
    try:
        store_root = Path(options.store_root)
        files = ScheduleFiles(store_root, Path(options.indexer_store) if options.indexer_store else
                              store_root / INDEXER_DIR, config.mapped_file_size_commit_log,
                              config.mapped_file_size_consume_queue)
        indexer = IndexerPeer(options.indexer or config.indexer_listen)
        commitlog = CommitLogPeer(options.commitlog or config.commitlog_listen)
        scheduler = DelayScheduler(levels, root / "config" / FILE_NAME, files, indexer, commitlog,
                                   options.persist_interval_ms / 1000)
        if replicates_metadata(config):
            scheduler.replicated = ReplicatedStateFile(FILE_NAME, files, indexer, commitlog)
        # Timer messages (services/scheduler/timer_delivery.py): rmq_sys_wheel_timer, state under ROOT/timer.
        timers = TimerScheduler(root, files, indexer, commitlog, options.persist_interval_ms / 1000,
                                config.timer_max_delay_sec)
        if replicates_metadata(config):
            timers.replicated = ReplicatedStateFile(TIMER_PROGRESS_NAME, files, indexer, commitlog)
        # Transactions (services/scheduler/transaction_check.py): ends and check-backs of the shard's halves.
        checker = TransactionChecker(check_settings, files, Path(options.indexer_store) if options.indexer_store else
                                     store_root / INDEXER_DIR, config.mapped_file_size_consume_queue, indexer,
                                     options.commitlog or config.commitlog_listen, root / "config" / TX_OFFSETS_FILE,
                                     config.mapped_file_size_commit_log)
        try:
            scheduler.load()
            timers.load()
            checker.load()
        except ValueError as exc:
            log.error("cannot start: %s", exc)
            return EXIT_BAD_OFFSETS_FILE
        return await _run(options, scheduler, files, indexer, commitlog, signals, metrics_port, checker, timers)
    finally:
        lock.release()


async def _run(options: SchedulerOptions, scheduler: DelayScheduler, files: ScheduleFiles, indexer: IndexerPeer,
               commitlog: CommitLogPeer, signals: ShutdownSignal, metrics_port: int | None,
               checker: TransactionChecker, timers: TimerScheduler) -> int:
    settings = ServerSettings(listen=options.listen or DEFAULT_LISTEN).as_internal()
    server = AioGrpcServer(settings, [TX_SERVICE_NAME], register_transactions(checker))

    async def stopped() -> None:
        await checker.stop()
        await timers.stop()
        await scheduler.stop()
        await indexer.close()
        await commitlog.close()
        files.close()

    scheduler.start()
    timers.start()
    checker.start()
    bound = await start_aio_service(server, metrics_port, stopped)
    if bound is None:
        return EXIT_BAD_SETTINGS
    log.info("scheduler listening on %s, store %s, %d delay levels from %s, indexer %s, commitlog %s", bound,
             options.store, len(scheduler.delay_levels_ms), scheduler.offsets_path, indexer.address,
             commitlog.address, extra={"listen": bound, "store": str(root_of(options))})
    return await serve_aio_until_signal(server, signals, on_stopping=checker.stopping, on_stopped=stopped)


def root_of(options: SchedulerOptions) -> Path:
    return Path(options.store).resolve()
