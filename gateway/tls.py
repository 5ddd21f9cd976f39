"""TLS on the gateway's public port, optionally mutual TLS (client certificates required).

The gateway is the one mqstore endpoint clients reach, so it is the one that speaks TLS; the internal
services sit behind it on a private network (and check the service credential, see
services/server/service_auth.py). Three PEM files configure it, each from the settings file
(``tls_cert``, ``tls_key``, ``tls_client_ca``), else the environment (``MQSTORE_GATEWAY_TLS_CERT``,
``..._KEY``, ``..._CLIENT_CA``: what a Kubernetes Secret mounted as files is pointed at), else the
command line, which wins (``--tls-cert``, ``--tls-key``, ``--tls-client-ca``):

* certificate + key: the port speaks TLS only; a plaintext client's handshake fails (UNAVAILABLE).
* + client CA: mutual TLS. A client must present a certificate signed by that CA, or the handshake
  fails. It authenticates the connection only: bearer tokens (gateway/auth.py) still decide which
  topics a call may touch.

The files are checked before the gateway listens (a key that does not match its certificate, an
encrypted key, a file that is not PEM: exit 2 with the file named), because grpc would otherwise
only say "failed to add port". Workers (gateway/workers.py) each load the same files.

Rotation without a restart (cert-manager renews a Secret, an operator replaces the files): grpc asks
:class:`CertificateReloader` at each new connection's handshake; when a file changed (inode, size or
times), the files are read and checked again. Good files serve every new connection from then on
(connections already open keep theirs) and log ``TLS certificate reloaded``; bad ones (say the
certificate renewed but the key not yet) keep the files loaded before and log why, once per version.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from gateway.token_reload import file_signature
from services.store.config import ConfigError

log = logging.getLogger("gateway.tls")

TLS_CERT_ENV = "MQSTORE_GATEWAY_TLS_CERT"
TLS_KEY_ENV = "MQSTORE_GATEWAY_TLS_KEY"
TLS_CLIENT_CA_ENV = "MQSTORE_GATEWAY_TLS_CLIENT_CA"
# The settings each environment variable fills when neither the command line nor the file set it.
ENV_SETTINGS = {"tls_cert": TLS_CERT_ENV, "tls_key": TLS_KEY_ENV, "tls_client_ca": TLS_CLIENT_CA_ENV}


def tls_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The TLS settings the environment gives (None for a variable unset or empty)."""
    env = os.environ if environ is None else environ
    return {name: (env.get(var, "").strip() or None) for name, var in ENV_SETTINGS.items()}


@dataclass(slots=True, frozen=True)
class TlsFiles:
    """The PEM files of the gateway's TLS; ``client_ca`` set = mutual TLS."""

    cert: str
    key: str
    client_ca: str | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def describe(self) -> str:
        """For the start-up log line: whether and how TLS is on (file names only, never contents)."""
        return f"tls on ({self.cert}" + (f"; client certificates required, CA {self.client_ca})"
                                          if self.mutual else ")")


def tls_files(cert: str | None, key: str | None, client_ca: str | None) -> TlsFiles | None:
    """The TLS the settings ask for, None for plaintext; ConfigError when they are incomplete."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ConfigError("tls_client_ca (--tls-client-ca) needs the gateway's own certificate and key: "
                              "give tls_cert and tls_key (--tls-cert, --tls-key) too")
        return None
    if cert is None or key is None:
        missing = "tls_cert (--tls-cert)" if cert is None else "tls_key (--tls-key)"
        raise ConfigError(f"TLS needs both a certificate and its private key: give {missing} too")
    return TlsFiles(cert, key, client_ca)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """grpc credentials of ``files``, reloaded when they change; ConfigError when they cannot be used."""
    reloader = CertificateReloader(files)
    # grpc-stubs say the fetcher returns a configuration; grpc documents None as "no change".
    return grpc.dynamic_ssl_server_credentials(reloader.initial, reloader,  # type: ignore[arg-type]
                                               require_client_authentication=files.mutual)


class CertificateReloader:
    """grpc's certificate fetcher: a new configuration when the files changed and are good, else None
    (grpc then keeps the current one). Called at every handshake, so it only stats the files unless
    one changed."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._seen = self._signature()
        self.initial = certificate_configuration(files)

    def _signature(self) -> tuple[object, ...]:
        return tuple(file_signature(p) for p in (self.files.cert, self.files.key, self.files.client_ca) if p)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            signature = self._signature()
            if signature == self._seen:
                return None
            self._seen = signature
            configuration = certificate_configuration(self.files)
        except ConfigError as exc:
            log.warning("TLS files not reloaded: %s; new connections keep the certificate loaded before", exc)
            return None
        except Exception:  # an exception must not escape into grpc's handshake
            log.exception("TLS files not reloaded; new connections keep the certificate loaded before")
            return None
        log.info("TLS certificate reloaded from %s: new connections use it", self.files.cert,
                 extra={"tls_cert": self.files.cert})
        return configuration


def certificate_configuration(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    """The grpc configuration of ``files`` after checking them with Python's ssl module, so that a bad
    file is reported by name and reason (grpc itself only fails the handshake or the port)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert, key = _read(files.cert, "certificate"), _read(files.key, "private key")
    try:
        # A callable password: an encrypted key fails here instead of prompting on the terminal.
        context.load_cert_chain(files.cert, files.key, password=_no_password)
    except (ssl.SSLError, TypeError, ValueError) as exc:
        raise ConfigError(f"TLS certificate {files.cert} with key {files.key}: {_reason(exc)} (both must be "
                          "PEM, the key unencrypted and belonging to the certificate)") from None
    ca = None
    if files.client_ca is not None:
        ca = _read(files.client_ca, "client CA")
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"TLS client CA {files.client_ca}: {_reason(exc)} (expected PEM "
                              "certificates)") from None
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def _read(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the TLS {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"the TLS {what} {path} is not PEM (no '-----BEGIN' line)")
    return data


def _no_password() -> bytes:
    raise ValueError("the key is encrypted: give an unencrypted key (e.g. openssl pkey -in KEY -out KEY.plain)")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return str(exc)
