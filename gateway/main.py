"""Process entry point of the gateway: ``mqstore gateway`` and ``python -m gateway``.

The gateway keeps no state on disk: the route table is read from the shards, tokens from the token
file. It starts even when a shard is down (calls routed there fail UNAVAILABLE until it is back).

TLS (optionally mutual) on the listen port: gateway/tls.py. The token file is reloaded when it changes
and on SIGHUP, without a restart: gateway/token_reload.py.

Exit codes: 0 after a clean stop, 2 for bad settings (including tokens missing on a non-loopback
address, or TLS files that cannot be used) or an address it cannot listen on. With ``--workers N``
(N > 1) this process is the supervisor of N gateway processes on the same port: see gateway/workers.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal

import grpc

from gateway.auth import TokenTable, load_token_table
from gateway.queue_selector import FaultTable, QueueSelector
from gateway.registration import add_to_server
from gateway.rocketmq5 import registration as rocketmq5
from gateway.rocketmq5.servicer import RocketMQ5Servicer
from gateway.route import RouteTable
from gateway.servicer import MessagingServicer
from gateway.settings import LATENCY, GatewayOptions, GatewaySettings, load_gateway_settings
from gateway.shard import ShardClient
from gateway.tls import TlsFiles, server_credentials, tls_files, tls_from_env
from gateway.token_reload import TokenReloader
from gateway.uniq_key_maker import UniqKeyGenerator
from gateway.wire import SERVICE_NAME, TRANSPORT_MAX_REQUEST_BYTES
from gateway.workers import WorkerIdentity, supervise, workers_from_env
from services.server.bootstrap import Bootstrap, ServiceProcess, load_process_settings
from services.server.gc_tuning import RPC_SERVER_GEN0_THRESHOLD
from services.server.grpc_server import (
    AioGrpcServer,
    ServerSettings,
    ShutdownSignal,
    is_loopback,
    serve_aio_until_signal,
    start_aio_service,
)
from services.server.process import EXIT_BAD_SETTINGS
from services.store.config import ConfigError

log = logging.getLogger("gateway")
MIB = 1024 * 1024
#: Public: clients bring their own tokens (gateway/auth.py), it takes no service credential.
PROCESS = ServiceProcess("gateway", gc_gen0_threshold=RPC_SERVER_GEN0_THRESHOLD, internal=False)


def serve(options: GatewayOptions) -> int:
    """Run the gateway until SIGTERM/SIGINT; returns the exit code. With more than one worker (the
    ``--workers`` flag, else MQSTORE_GATEWAY_WORKERS, else the settings file's ``workers``), this
    process supervises that many gateway processes on the same port (gateway/workers.py)."""
    boot = Bootstrap(PROCESS)
    try:
        settings, tokens = _checked_settings(options)
        tls = tls_files(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
        credentials = None if tls is None else server_credentials(tls)  # checks the files: exit 2 if unusable
        identity = WorkerIdentity.from_env()
        metrics_port = load_process_settings(PROCESS).metrics_port
        rocketmq5.check_settings()  # MQSTORE_RMQ5_*: exit 2 for a bad one
    except (ConfigError, ValueError) as exc:
        log.error("bad settings: %s", exc)
        return EXIT_BAD_SETTINGS
    if identity is None and settings.workers > 1:
        return supervise(options, settings, settings.workers, metrics_port)
    return boot.run(lambda: asyncio.run(_serve(settings, tokens, identity, metrics_port, tls, credentials)))


def _checked_settings(options: GatewayOptions) -> tuple[GatewaySettings, TokenTable]:
    """Settings (file < MQSTORE_GATEWAY_WORKERS, MQSTORE_GATEWAY_TLS_* < flags) and tokens, or
    ConfigError saying what to fix."""
    overrides = options.overrides()
    if overrides["workers"] is None:
        overrides["workers"] = workers_from_env()
    for name, value in tls_from_env().items():
        if overrides[name] is None:
            overrides[name] = value
    settings = load_gateway_settings(options.config_file, **overrides)
    tokens = load_token_table(settings.auth_file)
    if not tokens.enabled and not is_loopback(settings.listen) and not settings.allow_insecure:
        raise ConfigError(f"the gateway would listen on {settings.listen} without tokens: give auth_file "
                          "(see README, 'Authentication'), listen on loopback, or set allow_insecure: true")
    return settings, tokens


async def _serve(settings: GatewaySettings, tokens: TokenTable, identity: WorkerIdentity | None,
                 metrics_port: int | None, tls: TlsFiles | None = None,
                 credentials: grpc.ServerCredentials | None = None) -> int:
    signals = ShutdownSignal()
    signals.install_on_loop()
    reload_task = _start_token_reload(settings, tokens)
    shards = [ShardClient(i, s) for i, s in enumerate(settings.shards)]
    routes = RouteTable(shards, settings.route_refresh_ms / 1000, settings.backend_timeout_ms / 1000)
    faults = FaultTable(settings.fault_initial_backoff_ms / 1000, settings.fault_max_backoff_ms / 1000)
    worker = (0, 1) if identity is None else (identity.index, identity.count)
    selector = QueueSelector(settings.queue_selection == LATENCY, faults, worker=worker)
    servicer = MessagingServicer(settings, shards, routes, selector, tokens, UniqKeyGenerator())
    server_settings = dataclasses.replace(_server_settings(settings, reuse_port=identity is not None),
                                          credentials=credentials)
    v2: list[RocketMQ5Servicer] = []

    def register(server: grpc.aio.Server) -> None:
        add_to_server(servicer, server)
        started = rocketmq5.add_to_server(servicer, server)  # RocketMQ 5's protocol (docs/rocketmq5.md)
        v2.extend([started] if started is not None else [])

    names = [SERVICE_NAME, *([rocketmq5.SERVICE_NAME] if rocketmq5.enabled() else [])]
    server = AioGrpcServer(server_settings, names, register)

    async def stopped() -> None:
        if reload_task is not None:
            reload_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reload_task
        for started in v2:
            await started.close()
        await servicer.close()
        for shard in shards:
            await shard.close()

    bound = await start_aio_service(server, metrics_port, stopped)
    if bound is None:
        return EXIT_BAD_SETTINGS
    await _warm_up(routes, shards)
    log.info("gateway%s listening on %s; shards %s; queue selection %s; auth %s; %s",
             "" if identity is None else f" worker {identity.index}/{identity.count} (pid {os.getpid()})", bound,
             ", ".join(f"{s.name} (commitlog {s.settings.commitlog}, query {s.settings.query})" for s in shards),
             settings.queue_selection, f"{len(tokens)} tokens" if tokens.enabled else "off",
             "plaintext" if tls is None else tls.describe(),
             extra={"tls": tls is not None, "mutual_tls": tls is not None and tls.mutual, "listen": bound,
                    "worker": None if identity is None else identity.index})
    def stopping() -> None:  # end the streams that would hold the stop for its whole drain grace
        servicer.stopping()
        for started in v2:
            started.stopping()

    return await serve_aio_until_signal(server, signals, on_stopping=stopping, on_stopped=stopped)


def _start_token_reload(settings: GatewaySettings, tokens: TokenTable) -> asyncio.Task[None] | None:
    """Reload the token file on SIGHUP and, every auth_reload_ms, when it changed. Without a token
    file SIGHUP only logs that there is nothing to reload (instead of killing the gateway)."""
    loop = asyncio.get_running_loop()
    if settings.auth_file is None:
        loop.add_signal_handler(signal.SIGHUP, lambda: log.info("SIGHUP: no token file to reload (auth is off)"))
        return None
    reloader = TokenReloader(settings.auth_file, tokens, settings.auth_reload_ms / 1000)
    loop.add_signal_handler(signal.SIGHUP, reloader.on_sighup)
    return loop.create_task(reloader.run(), name="token-reload")


async def _warm_up(routes: RouteTable, shards: list[ShardClient]) -> None:
    """Read routes and store hosts once, so the first calls do not pay for it. Failures are logged:
    a shard that is still starting is asked again on demand."""
    try:
        await routes.refresh()
        for shard in shards:
            await shard.learn_store_host(2.0)
    except Exception as exc:  # noqa: BLE001 - any backend trouble only delays the warm-up
        log.warning("warm-up: %s (shards are asked again on demand)", exc)


def _server_settings(settings: GatewaySettings, reuse_port: bool = False) -> ServerSettings:
    return ServerSettings(listen=settings.listen, max_concurrent_rpcs=settings.max_concurrent_rpcs,
                          max_receive_message_bytes=TRANSPORT_MAX_REQUEST_BYTES,
                          max_send_message_bytes=128 * MIB, reuse_port=reuse_port)
