"""Gateway settings: where the shards are, how queues are picked, deadlines, auth.

A YAML file (``mqstore gateway --config gateway.yaml``) may set any field; without one the gateway
runs the embedded default: one shard made of the services ``mqstore up`` starts on 127.0.0.1.

    listen: 127.0.0.1:9876
    shards:
      - {name: shard-0, commitlog: 127.0.0.1:9901, query: 127.0.0.1:9903}  # scheduler, indexer: see below
    queue_selection: round_robin        # or latency (avoid queues whose sends were slow or failing)
    auth_file: tokens.yaml              # bearer tokens; without it every call is allowed
    tls_cert: /etc/mqstore/tls.crt      # TLS on the listen port (gateway/tls.py), with tls_key
    tls_key: /etc/mqstore/tls.key
    tls_client_ca: /etc/mqstore/ca.crt  # mutual TLS: clients need a certificate this CA signed
    workers: 2                          # gateway processes sharing the port (gateway/workers.py)

A replicated shard (``mqstore up --replicas``, docs/replication.md) names etcd and every replica; the
gateway sends to the one etcd names leader and reads from an in-sync one when the leader is down
(``commitlog``/``query`` are then the first replica's, used until etcd names a leader):

    shards:
      - name: shard-0
        etcd: 127.0.0.1:9970
        broker_name: broker-a           # the replicas' brokerName: their keys in etcd
        replicas:
          - {name: replica-0, commitlog: 127.0.0.1:9911, query: 127.0.0.1:9913, scheduler: ..., indexer: ...}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.store.config import ConfigError

DEFAULT_LISTEN = "127.0.0.1:9876"
ROUND_ROBIN = "round_robin"
LATENCY = "latency"
# More processes than this on one port is a typo, not a plan (a bigger host runs more pods).
MAX_WORKERS = 256


@dataclass(slots=True, frozen=True)
class ReplicaSettings:
    """One replica of a replicated shard: its name in etcd (the commitlog's haReplicaName) and its services."""

    name: str
    commitlog: str
    query: str
    scheduler: str
    indexer: str


@dataclass(slots=True, frozen=True)
class ShardSettings:
    """One shard: a commitlog service and the query service reading it (its indexer stays behind it)."""

    name: str
    commitlog: str
    query: str
    #: The shard's scheduler (transaction ends and checks, docs/transactions.md); empty: the port after
    #: the query service's, where ``mqstore up`` puts it (query base+3, scheduler base+4).
    scheduler: str = ""
    #: The shard's indexer (``mqstore status`` asks it for the dispatch lag); empty: the port after the
    #: commitlog's, where ``mqstore up`` puts it (commitlog base+1, indexer base+2).
    indexer: str = ""
    #: A replicated shard: etcd's endpoint, the replicas' brokerName and the replicas (empty: one copy).
    etcd: str = ""
    broker_name: str = ""
    replicas: tuple[ReplicaSettings, ...] = ()

    @property
    def indexer_address(self) -> str:
        return self.indexer or _next_port(self.commitlog)

    @property
    def scheduler_address(self) -> str:
        return self.scheduler or _next_port(self.query)


def _next_port(address: str) -> str:
    """``host:port+1``: where ``mqstore up`` puts the service after the one at ``address``."""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + 1}" if port.isdigit() else address


@dataclass(slots=True, frozen=True)
class GatewaySettings:
    listen: str = DEFAULT_LISTEN
    shards: tuple[ShardSettings, ...] = (ShardSettings("shard-0", "127.0.0.1:9901", "127.0.0.1:9903"),)
    queue_selection: str = ROUND_ROBIN
    # Bearer tokens (see gateway/auth.py); None = no auth, allowed only on a loopback listen address
    # unless allow_insecure is set.
    auth_file: str | None = None
    allow_insecure: bool = False
    # How often the token file is checked for changes (it is reloaded when it changed, and on SIGHUP;
    # see gateway/token_reload.py). 0: on SIGHUP only.
    auth_reload_ms: int = 2_000
    # TLS (gateway/tls.py): PEM certificate and key; with a client CA, mutual TLS. The command line and
    # MQSTORE_GATEWAY_TLS_CERT / _KEY / _CLIENT_CA come before these.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    # Create a topic on every shard at its first send (RocketMQ's autoCreateTopicEnable).
    auto_create_topic: bool = True
    default_topic_queue_nums: int = 8
    # Deadline of one backend call when the client gave none (or a longer one).
    backend_timeout_ms: int = 5_000
    # Attempts of a retryable backend call (reads; sends only when nothing can have been written).
    retry_attempts: int = 3
    retry_initial_backoff_ms: int = 50
    retry_max_backoff_ms: int = 1_000
    # How long the route table trusts what it read from the shards.
    route_refresh_ms: int = 30_000
    # Latency-aware selection: a failing queue is avoided for this long, doubled per further failure.
    fault_initial_backoff_ms: int = 1_000
    fault_max_backoff_ms: int = 60_000
    max_concurrent_rpcs: int = 4096
    # Gateway processes sharing the listen port with SO_REUSEPORT (gateway/workers.py). The command
    # line (--workers) and MQSTORE_GATEWAY_WORKERS come before this.
    workers: int = 1

    def validate(self) -> None:
        if not self.shards:
            raise ConfigError("shards: give at least one shard (name, commitlog, query)")
        names = [s.name for s in self.shards]
        if len(set(names)) != len(names):
            raise ConfigError(f"shards: names must be unique, got {names}")
        if self.queue_selection not in (ROUND_ROBIN, LATENCY):
            raise ConfigError(f"queue_selection must be {ROUND_ROBIN!r} or {LATENCY!r}, got {self.queue_selection!r}")
        for name in ("backend_timeout_ms", "retry_attempts", "route_refresh_ms", "default_topic_queue_nums",
                     "fault_initial_backoff_ms", "fault_max_backoff_ms", "max_concurrent_rpcs", "workers"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.auth_reload_ms < 0:
            raise ConfigError(f"auth_reload_ms must be 0 (reload on SIGHUP only) or positive, "
                              f"got {self.auth_reload_ms}")
        if self.workers > MAX_WORKERS:
            raise ConfigError(f"workers must be at most {MAX_WORKERS}, got {self.workers}")


@dataclass(slots=True, frozen=True)
class GatewayOptions:
    """What the command line gave ``mqstore gateway`` (None: not given). A worker group passes them on
    to each worker, so every worker loads the same settings."""

    config_file: str | None = None
    listen: str | None = None
    auth_file: str | None = None
    queue_selection: str | None = None
    # (commitlog, query) addresses of a single shard, instead of the settings file's shards.
    shard: tuple[str, str] | None = None
    default_topic_queue_nums: int | None = None
    workers: int | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None

    def overrides(self) -> dict[str, Any]:
        """The settings these options override (None values are ignored by load_gateway_settings)."""
        values: dict[str, Any] = {"listen": self.listen, "auth_file": self.auth_file,
                                  "queue_selection": self.queue_selection,
                                  "default_topic_queue_nums": self.default_topic_queue_nums, "workers": self.workers,
                                  "tls_cert": self.tls_cert, "tls_key": self.tls_key,
                                  "tls_client_ca": self.tls_client_ca}
        if self.shard is not None:
            values["shards"] = [{"name": "shard-0", "commitlog": self.shard[0], "query": self.shard[1]}]
        return values


def load_gateway_settings(path: str | Path | None, **overrides: Any) -> GatewaySettings:
    """Defaults < YAML file < explicit overrides (command-line flags; None means not given)."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read gateway settings {path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of settings")
        values.update(loaded)
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(GatewaySettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown gateway settings {unknown}; known: {sorted(known)}")
    if "shards" in values:
        values["shards"] = tuple(_shard(i, raw) for i, raw in enumerate(values["shards"] or ()))
    try:
        settings = GatewaySettings(**values)
    except TypeError as exc:
        raise ConfigError(f"bad gateway settings: {exc}") from None
    settings.validate()
    return settings


def _shard(index: int, raw: Any) -> ShardSettings:
    if isinstance(raw, ShardSettings):
        return raw
    if not isinstance(raw, dict) or not {"commitlog", "query"} <= set(raw):
        raise ConfigError(f"shards[{index}]: expected a mapping with commitlog and query addresses, got {raw!r}")
    extra = set(raw) - {"name", "commitlog", "query", "scheduler", "indexer", "etcd", "broker_name", "replicas"}
    if extra:
        raise ConfigError(f"shards[{index}]: unknown keys {sorted(extra)}")
    replicas = tuple(_replica(index, i, r) for i, r in enumerate(raw.get("replicas") or ()))
    etcd, broker_name = str(raw.get("etcd") or ""), str(raw.get("broker_name") or "")
    if replicas and not (etcd and broker_name):
        raise ConfigError(f"shards[{index}]: replicas need etcd (host:port) and broker_name (the replicas' "
                          "brokerName), which say who leads")
    if len({r.name for r in replicas}) != len(replicas):
        raise ConfigError(f"shards[{index}]: replica names must be unique, got {[r.name for r in replicas]}")
    return ShardSettings(str(raw.get("name", f"shard-{index}")), str(raw["commitlog"]), str(raw["query"]),
                         str(raw.get("scheduler") or ""), str(raw.get("indexer") or ""), etcd, broker_name, replicas)


def _replica(shard: int, index: int, raw: Any) -> ReplicaSettings:
    keys = {"name", "commitlog", "query", "scheduler", "indexer"}
    if not isinstance(raw, dict) or set(raw) != keys:
        raise ConfigError(f"shards[{shard}].replicas[{index}]: expected a mapping of exactly {sorted(keys)}, "
                          f"got {raw!r}")
    return ReplicaSettings(*(str(raw[k]) for k in ("name", "commitlog", "query", "scheduler", "indexer")))


