"""The channel to the gateway, shared by Producer, PullConsumer and Client.

Every call goes through :meth:`Connection.call` (or :meth:`Connection.future`) so that each one
carries the bearer token and a deadline, and every failure becomes an :class:`MqstoreError`.

A gateway with TLS on (docs/security.md) is reached with ``tls=Tls(ca="ca.crt")`` (plus ``cert`` and
``key`` when it requires client certificates), or the environment: $MQSTORE_TLS_CA, $MQSTORE_TLS_CERT,
$MQSTORE_TLS_KEY, or MQSTORE_TLS=1 for a server certificate the system's CAs sign.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc

from mqstore.client.errors import InvalidArgumentError, MqstoreError, from_rpc_error
from mqstore.v1 import gateway_pb2_grpc

ENV_GATEWAY = "MQSTORE_GATEWAY"
ENV_TOKEN = "MQSTORE_TOKEN"
ENV_TLS = "MQSTORE_TLS"
ENV_TLS_CA = "MQSTORE_TLS_CA"
ENV_TLS_CERT = "MQSTORE_TLS_CERT"
ENV_TLS_KEY = "MQSTORE_TLS_KEY"
DEFAULT_PORT = 9876
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
#: Deadline of a call that does not wait on purpose: the gateway retries backends within it.
DEFAULT_TIMEOUT_S = 10.0
MIB = 1024 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    # A pull answers up to 32 MiB (plus one message of any size); a key query up to 64 messages.
    ("grpc.max_receive_message_length", 512 * MIB),
    # The gateway accepts 65 MiB; batches are cut well below that (see Producer.send_batch).
    ("grpc.max_send_message_length", 64 * MIB),
    # A restarted gateway is found again quickly instead of after gRPC's default back-off of up to 2 min.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
    ("grpc.primary_user_agent", "mqstore-client/0.1"),
)
Metadata = tuple[tuple[str, str], ...]


def resolve_address(address: str | None = None) -> str:
    """The gateway to use: the argument, else $MQSTORE_GATEWAY, else 127.0.0.1:9876; a bare host gets 9876."""
    address = (address or os.environ.get(ENV_GATEWAY) or DEFAULT_ADDRESS).strip()
    if address.startswith("["):
        return address if "]:" in address else f"{address}:{DEFAULT_PORT}"
    if ":" not in address:
        return f"{address}:{DEFAULT_PORT}"
    return address


def resolve_token(token: str | None = None) -> str | None:
    """The bearer token: the argument, else $MQSTORE_TOKEN, else none (the gateway may run without auth)."""
    token = token if token is not None else os.environ.get(ENV_TOKEN)
    return (token.strip() or None) if token else None


def auth_metadata(token: str | None) -> Metadata:
    return (("authorization", f"Bearer {token}"),) if token else ()


@dataclass(frozen=True, slots=True)
class Tls:
    """TLS to the gateway: PEM file paths. ``ca``: the CA that signed the gateway's certificate (None:
    the system's CAs); ``cert`` + ``key``: this client's certificate, for a gateway that requires one
    (mutual TLS)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """grpc channel credentials; raises MqstoreError (INVALID_ARGUMENT) for a file it cannot use."""
        if (self.cert is None) != (self.key is None):
            raise InvalidArgumentError("INVALID_ARGUMENT", "a client certificate needs its key and a key its "
                                       "certificate: give both tls cert and tls key (or neither)")
        return grpc.ssl_channel_credentials(root_certificates=_pem(self.ca, "CA"),
                                            private_key=_pem(self.key, "key"),
                                            certificate_chain=_pem(self.cert, "certificate"))


def _pem(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgumentError("INVALID_ARGUMENT",
                                   f"cannot read the TLS {what} {path}: {exc.strerror}") from None


def resolve_tls(tls: Tls | bool | None = None, environ: Mapping[str, str] | None = None) -> Tls | None:
    """TLS settings: the argument (True = the system's CAs, False = plaintext), else $MQSTORE_TLS_CA,
    $MQSTORE_TLS_CERT, $MQSTORE_TLS_KEY (any of them set turns TLS on), else MQSTORE_TLS=1 (system
    CAs), else none (plaintext)."""
    if isinstance(tls, Tls):
        return tls
    if tls is not None:
        return Tls() if tls else None
    env = os.environ if environ is None else environ
    ca, cert, key = ((env.get(name, "").strip() or None) for name in (ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY))
    if ca or cert or key:
        return Tls(ca, cert, key)
    return Tls() if env.get(ENV_TLS, "").strip().lower() in ("1", "true", "yes", "on") else None


def open_channel(address: str, tls: Tls | None, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
    """A plaintext or TLS channel to ``address``."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.credentials(), options=options)


class Connection:
    """One gRPC channel to the gateway, its token and its default deadline; thread-safe."""

    def __init__(self, address: str | None = None, token: str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT_S, options: Sequence[tuple[str, Any]] = (),
                 tls: Tls | bool | None = None) -> None:
        self.address = resolve_address(address)
        self.token = resolve_token(token)
        self.timeout = timeout
        self.metadata = auth_metadata(self.token)
        self.tls = resolve_tls(tls)
        self.channel = open_channel(self.address, self.tls, [*CHANNEL_OPTIONS, *options])
        self.stub = gateway_pb2_grpc.MessagingServiceStub(self.channel)
        self._closed = False

    def call(self, method: str, request: Any, timeout: float | None = None,
             metadata: Sequence[tuple[str, str]] | None = None) -> Any:
        """One unary call; raises MqstoreError. ``metadata``: instead of the token's alone (it must
        include it), e.g. with a ``traceparent`` (mqstore/client/tracing.py)."""
        deadline = self.timeout if timeout is None else timeout
        try:
            return getattr(self.stub, method)(request, timeout=deadline,
                                              metadata=self.metadata if metadata is None else metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address, deadline) from None

    def future(self, method: str, request: Any, timeout: float | None = None) -> grpc.Future:  # type: ignore[type-arg]
        """A call in flight (for concurrent pulls); read it with :meth:`result`."""
        deadline = self.timeout if timeout is None else timeout
        future: grpc.Future = getattr(self.stub, method).future(  # type: ignore[type-arg]
            request, timeout=deadline, metadata=self.metadata)
        return future

    def result(self, future: grpc.Future, timeout: float | None = None) -> Any:  # type: ignore[type-arg]
        """The answer of :meth:`future`, or its error as MqstoreError."""
        try:
            return future.result()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address, timeout) from None

    def call_many(self, method: str, requests: Sequence[Any],
                  timeout: float | None = None) -> list[Any | MqstoreError]:
        """The same method for several requests at once: one round trip instead of one per request.
        Each answer is the response or the error of that request."""
        futures = [self.future(method, request, timeout) for request in requests]
        answers: list[Any | MqstoreError] = []
        for future in futures:
            try:
                answers.append(self.result(future, timeout))
            except MqstoreError as exc:
                answers.append(exc)
        return answers

    def stream(self, method: str, requests: Any, timeout: float | None = None) -> Any:
        """A streaming call (its errors surface while iterating: wrap with :func:`from_rpc_error`)."""
        return getattr(self.stub, method)(requests, timeout=timeout, metadata=self.metadata)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.channel.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Connection({self.address!r}, token={'set' if self.token else 'none'}, tls={self.tls is not None})"


class Endpoint:
    """Base of the client classes: uses a given Connection (left open) or opens its own (closed by close())."""

    def __init__(self, address: str | None = None, token: str | None = None, *,
                 connection: Connection | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 tls: Tls | bool | None = None) -> None:
        self._owns_connection = connection is None
        self.connection = (connection if connection is not None
                           else Connection(address, token, timeout=timeout, tls=tls))

    def close(self) -> None:
        if self._owns_connection:
            self.connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
