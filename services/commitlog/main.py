"""Process entry point of the commitlog service: ``mqstore commitlog`` and ``python -m services.commitlog``.

The service runs on one asyncio event loop (a ``grpc.aio`` server). Blocking work, the engine's
start and shutdown included, runs in the loop's bounded executor, so the loop always answers health
checks and a second SIGTERM/SIGINT.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT), 2 for bad settings or an address it cannot
listen on, 3 when another process holds the store's lock.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from mqstore.v1 import commitlog_pb2_grpc
from services.commitlog import metrics
from services.commitlog.ha.ha_service import HAServiceError
from services.commitlog.ha.replication import report_readiness, start_replication
from services.commitlog.ha.truncation import finish_interrupted_truncation
from services.commitlog.message_store import MessageStore
from services.commitlog.recovery import MissingLogError
from services.commitlog.servicer import MAX_BATCH_BYTES, SERVICE_NAME, CommitLogServicer
from services.server.bootstrap import Bootstrap, ServiceProcess
from services.server.grpc_server import (
    AioGrpcServer,
    ServerSettings,
    ShutdownSignal,
    serve_aio_until_signal,
    start_aio_service,
    use_blocking_executor,
)
from services.server.process import EXIT_BAD_SETTINGS, EXIT_STORE_LOCKED, BadSettings, load_service_settings
from services.store.config import MessageStoreConfig
from services.store.formats.mapped_file_queue import FileSizeMismatchError
from services.store.store_root import StoreLockedError

log = logging.getLogger("services.commitlog")

MIB = 1024 * 1024
#: Recovery found less log than the store's records say existed (refuseStartOnMissingLog).
EXIT_MISSING_LOG = 4
PROCESS = ServiceProcess("commitlog")


def server_settings(config: MessageStoreConfig, listen: str) -> ServerSettings:
    """Receive limit: the largest of a full AppendBatch and a single maxMessageSize message, plus
    room for the protobuf framing around it."""
    receive = max(MAX_BATCH_BYTES, config.max_message_size) + MIB
    return ServerSettings(listen=listen, max_receive_message_bytes=receive,
                          max_send_message_bytes=max(128 * MIB, 2 * receive)).as_internal()


def serve(store: str, config_file: str | None, listen: str | None) -> int:
    """Run the commitlog service on ``store`` until SIGTERM/SIGINT; returns the exit code."""
    return Bootstrap(PROCESS).run(lambda: asyncio.run(_serve(store, config_file, listen)))


async def _serve(store: str, config_file: str | None, listen: str | None) -> int:
    signals = ShutdownSignal()
    signals.install_on_loop()
    try:
        config, process = load_service_settings(config_file, PROCESS)
    except BadSettings:
        return EXIT_BAD_SETTINGS
    address = listen or config.commitlog_listen
    settings = server_settings(config, address)
    use_blocking_executor(settings.max_workers)
    engine = MessageStore(config, store)
    try:
        await asyncio.to_thread(finish_interrupted_truncation, Path(store), config)  # a replica killed mid-cut
        await asyncio.to_thread(engine.start)
    except StoreLockedError as exc:
        log.error("cannot start: %s", exc, extra={"store": store})
        return EXIT_STORE_LOCKED
    except FileSizeMismatchError as exc:
        log.error("bad settings: %s", exc, extra={"store": store})
        return EXIT_BAD_SETTINGS
    except MissingLogError:  # logged with what is missing and how to accept it
        return EXIT_MISSING_LOG
    try:  # before the servicer: it reads whether puts wait for followers
        replication = await asyncio.to_thread(start_replication, engine.commit_log, process.service_token)
    except HAServiceError as exc:
        log.error("bad settings: %s", exc, extra={"store": store})
        await asyncio.to_thread(engine.shutdown)
        return EXIT_BAD_SETTINGS
    metrics.bind_commitlog(engine.stats, config.mapped_file_size_commit_log, lambda: engine.disk_full)
    servicer = CommitLogServicer(engine)
    await servicer.start()
    server = AioGrpcServer(settings, [SERVICE_NAME],
                           lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(servicer, s))

    async def stopped() -> None:
        await servicer.close()
        await asyncio.to_thread(replication.stop)
        await asyncio.to_thread(engine.shutdown)

    bound = await start_aio_service(server, process.metrics_port, stopped)
    if bound is None:
        return EXIT_BAD_SETTINGS
    readiness = asyncio.create_task(report_readiness(server.health, replication))
    log.info("commitlog service listening on %s, store %s", bound, store,
             extra={"listen": bound, "store": str(Path(store).resolve()), "incarnation": engine.incarnation})
    try:
        return await serve_aio_until_signal(server, signals, on_stopping=servicer.begin_shutdown,
                                            on_stopped=stopped)
    finally:
        readiness.cancel()
