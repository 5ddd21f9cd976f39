"""gRPC server plumbing shared by every mqstore service: health, reflection, limits, shutdown.

Two flavours with the same shape. :class:`GrpcServer` is grpc's thread-pool server (the indexer's
sync servicer); :class:`AioGrpcServer` is a ``grpc.aio`` server on the running event loop (the
commitlog service, whose appends are grouped by coroutines). With tracing on
(:mod:`services.server.tracing`, initialised before the server is built) both carry OpenTelemetry's
server interceptor; with it off, none. A service registers its servicers,
starts the server, and hands control to :func:`serve_until_signal` (or its ``_aio`` twin), which
waits for SIGTERM or SIGINT and then stops in the order that loses nothing: health NOT_SERVING (load
balancers stop sending), the service's own stopping hook (wake long polls), ``server.stop(grace)``
(drain RPCs in flight), and finally the engine shutdown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from types import FrameType
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # missing from the stubs
from grpc_reflection.v1alpha import reflection

from services.server import service_auth, tracing
from services.server.metrics import MetricsServer, start_metrics_server

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:9901"
MIB = 1024 * 1024


@dataclass(slots=True, frozen=True)
class ServerSettings:
    """Bounds of one gRPC server. ``max_workers``: for :class:`GrpcServer` the RPC worker pool (every
    streaming RPC holds a worker for its whole life, so it is sized for long polls rather than CPU);
    for :class:`AioGrpcServer` the event loop's default executor, i.e. how many blocking engine calls
    (``asyncio.to_thread``, each perhaps waiting for its fsync) run at once."""

    listen: str = DEFAULT_LISTEN
    max_workers: int = 64
    # RPCs beyond this many in flight fail fast with RESOURCE_EXHAUSTED instead of queueing unbounded.
    max_concurrent_rpcs: int = 512
    max_receive_message_bytes: int = 64 * MIB
    max_send_message_bytes: int = 128 * MIB
    shutdown_grace_s: float = 10.0
    keepalive_time_ms: int = 60_000
    keepalive_timeout_ms: int = 20_000
    # An internal service (commitlog, indexer, query) checks the deployment's service credential on
    # every call, and without one refuses to listen beyond loopback. The gateway is public: False.
    internal: bool = False
    service_token: str | None = None
    # SO_REUSEPORT: only a gateway worker sets it, so that its siblings share the port (gateway/workers.py).
    reuse_port: bool = False
    # TLS (only the gateway offers it, gateway/tls.py): listen with these credentials instead of plaintext.
    credentials: grpc.ServerCredentials | None = None

    def as_internal(self) -> ServerSettings:
        """These settings for an internal service, with the service credential from the environment
        (raises :class:`~services.server.service_auth.ServiceTokenError` if it is unusable)."""
        return dataclasses.replace(self, internal=True, service_token=service_auth.load_service_token())


#: Set by ``mqstore up`` for each child it starts (and inherited by a gateway's workers): the child's
#: health check answers it in its trailing metadata, so ``up`` can tell its own child from another
#: process that already listens on the port (services/runner.py).
INSTANCE_ENV = "MQSTORE_INSTANCE_ID"
INSTANCE_METADATA = "mqstore-instance"


def _instance_metadata() -> tuple[tuple[str, str], ...]:
    instance = os.environ.get(INSTANCE_ENV, "").strip()
    return ((INSTANCE_METADATA, instance),) if instance else ()


class _HealthServicer(health.HealthServicer):
    """The standard health service, whose Check names this process's instance (see INSTANCE_ENV)."""

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext) -> Any:
        context.set_trailing_metadata(_instance_metadata())
        return super().Check(request, context)


class _AioHealthServicer(health_aio.HealthServicer):  # type: ignore[misc]
    """The grpc.aio health service, whose Check names this process's instance (see INSTANCE_ENV)."""

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        context.set_trailing_metadata(_instance_metadata())
        return await super().Check(request, context)


class BindError(RuntimeError):
    """The server could not listen on the configured address."""


def is_loopback(listen: str) -> bool:
    """True if the host of ``host:port`` is a loopback address or ``localhost``."""
    host = listen.rpartition(":")[0].removeprefix("[").removesuffix("]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _channel_options(settings: ServerSettings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", settings.max_receive_message_bytes),
        ("grpc.max_send_message_length", settings.max_send_message_bytes),
        # Without this a second server on the same port binds silently and steals connections; gateway
        # workers turn it on on purpose (their supervisor first checks that the port is free).
        ("grpc.so_reuseport", int(settings.reuse_port)),
        ("grpc.keepalive_time_ms", settings.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.keepalive_timeout_ms),
    ]


def _add_port(server: grpc.Server | grpc.aio.Server, settings: ServerSettings) -> int:
    listen = settings.listen
    if settings.internal and not settings.service_token and not is_loopback(listen):
        raise BindError(f"refusing to listen on {listen} without a service credential: anyone reaching "
                        f"it could bypass the gateway. Set {service_auth.TOKEN_ENV} (or "
                        f"{service_auth.TOKEN_FILE_ENV}) to the same secret in every mqstore process, "
                        "or listen on a loopback address")
    try:
        if settings.credentials is not None:
            return server.add_secure_port(listen, settings.credentials)
        return server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise BindError(f"cannot listen on {listen}: {exc} "
                        "(is the port in use, or the address not local?)") from None


def _server_interceptors(settings: ServerSettings) -> list[Any]:
    interceptors: list[Any] = [*tracing.server_interceptors()]
    if settings.internal and settings.service_token:
        interceptors.append(service_auth.ServiceTokenInterceptor(settings.service_token))
    return interceptors


def _aio_server_interceptors(settings: ServerSettings) -> list[Any]:
    interceptors: list[Any] = [*tracing.aio_server_interceptors()]
    if settings.internal and settings.service_token:
        interceptors.append(service_auth.AioServiceTokenInterceptor(settings.service_token))
    return interceptors


class GrpcServer:
    """A ``grpc.server`` with the health and reflection services, bound to exactly one address."""

    def __init__(self, settings: ServerSettings, service_names: Sequence[str],
                 register: Callable[[grpc.Server], None]) -> None:
        self.settings = settings
        self.service_names = tuple(service_names)
        self.port = 0
        self._executor = futures.ThreadPoolExecutor(max_workers=settings.max_workers,
                                                    thread_name_prefix="grpc-worker")
        # No interceptor at all with tracing off: grpc then skips the interceptor pipeline.
        self._server = grpc.server(self._executor, maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
                                   options=_channel_options(settings),
                                   interceptors=_server_interceptors(settings) or None)
        self.health = _HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        register(self._server)
        reflection.enable_server_reflection(
            (*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server)

    def start(self) -> int:
        """Bind and start serving; returns the bound port (useful with port 0)."""
        self.port = _add_port(self._server, self.settings)
        self._server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ("", *self.service_names):
            self.health.set(name, serving)
        return self.port

    def stop(self, on_stopping: Callable[[], None] | None = None, grace_s: float | None = None) -> None:
        """NOT_SERVING, ``on_stopping`` (end long polls), then drain RPCs for up to the grace period."""
        self.health.enter_graceful_shutdown()
        if on_stopping is not None:
            on_stopping()
        grace = self.settings.shutdown_grace_s if grace_s is None else grace_s
        self._server.stop(grace).wait()
        self._executor.shutdown(wait=False, cancel_futures=True)


class AioGrpcServer:
    """A ``grpc.aio`` server with the health and reflection services, bound to exactly one address.

    Create it inside the event loop that will run it: handlers are coroutines on that loop, so a
    handler must never block; blocking engine calls go to the loop's default executor.
    """

    def __init__(self, settings: ServerSettings, service_names: Sequence[str],
                 register: Callable[[grpc.aio.Server], None]) -> None:
        self.settings = settings
        self.service_names = tuple(service_names)
        self.port = 0
        self._server = grpc.aio.server(maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
                                       options=_channel_options(settings),
                                       interceptors=_aio_server_interceptors(settings) or None)
        self.health = _AioHealthServicer()
        self.metrics: MetricsServer | None = None
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        register(self._server)
        reflection.enable_server_reflection(
            (*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server)

    async def start(self) -> int:
        """Bind and start serving; returns the bound port (useful with port 0)."""
        self.port = _add_port(self._server, self.settings)
        await self._server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, serving)
        return self.port

    async def stop(self, on_stopping: Callable[[], None] | None = None, grace_s: float | None = None) -> None:
        """NOT_SERVING, ``on_stopping`` (end long polls), then drain RPCs for up to the grace period."""
        await self.health.enter_graceful_shutdown()
        if on_stopping is not None:
            on_stopping()
        await self._server.stop(self.settings.shutdown_grace_s if grace_s is None else grace_s)
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None


def use_blocking_executor(max_workers: int) -> None:
    """Bound the running loop's default executor (``asyncio.to_thread``): blocking engine calls beyond
    ``max_workers`` queue instead of starting threads without limit."""
    executor = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="blocking")
    asyncio.get_running_loop().set_default_executor(executor)


class ShutdownSignal:
    """Turns the first SIGTERM or SIGINT into an event the main thread (or the event loop) waits on.
    A second signal exits at once without a clean stop (the abort file stays, so the next start
    recovers)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._loop_event: asyncio.Event | None = None
        self.received: str | None = None

    def install(self) -> None:
        """Must be called from the main thread (a Python rule for signal handlers)."""
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def install_on_loop(self) -> None:
        """The asyncio form: the handler runs on the running loop (main thread), so it can wake
        :meth:`wait_async`. Keep the loop responsive (blocking work in threads) for a second signal."""
        loop = asyncio.get_running_loop()
        self._loop_event = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._handle, signum, None)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._event.is_set():
            log.error("second %s during shutdown: exiting now without a clean stop", name)
            os._exit(128 + signum)
        self.received = name
        self._event.set()
        if self._loop_event is not None:
            self._loop_event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self) -> str:
        """Block until a signal arrives; returns its name. Waits in slices so the handler always runs."""
        while not self._event.wait(1.0):
            pass
        return self.received or "signal"

    async def wait_async(self) -> str:
        """Wait on the loop until a signal arrives (after :meth:`install_on_loop`); returns its name."""
        if self._loop_event is None:
            raise RuntimeError("install_on_loop() first")
        await self._loop_event.wait()
        return self.received or "signal"


def serve_until_signal(server: GrpcServer, signals: ShutdownSignal, on_stopping: Callable[[], None],
                       on_stopped: Callable[[], None]) -> int:
    """Block until SIGTERM/SIGINT, then stop gracefully; returns the process exit code (0)."""
    name = signals.wait()
    log.info("%s received: stopping (grace %.0fs)", name, server.settings.shutdown_grace_s)
    server.stop(on_stopping)
    on_stopped()
    log.info("stopped cleanly")
    return 0


async def start_aio_service(server: AioGrpcServer, metrics_port: int | None,
                            on_stopped: Callable[[], Awaitable[None]]) -> str | None:
    """Bind the gRPC server, then the metrics endpoint (if a port is given). Returns the bound
    ``host:port``; on failure logs why, undoes what started (``on_stopped`` included) and returns None."""
    try:
        port = await server.start()
        server.metrics = start_metrics_server(metrics_port)
    except (BindError, OSError) as exc:
        log.error("%s", exc)
        await server.stop(grace_s=0)
        await on_stopped()
        return None
    return f"{server.settings.listen.rpartition(':')[0]}:{port}"


async def serve_aio_until_signal(server: AioGrpcServer, signals: ShutdownSignal, on_stopping: Callable[[], None],
                                 on_stopped: Callable[[], Awaitable[None]]) -> int:
    """The asyncio form of :func:`serve_until_signal`: wait for SIGTERM/SIGINT, then stop gracefully."""
    name = await signals.wait_async()
    log.info("%s received: stopping (grace %.0fs)", name, server.settings.shutdown_grace_s)
    await server.stop(on_stopping)
    await on_stopped()
    log.info("stopped cleanly")
    return 0
