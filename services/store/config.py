"""Store settings: RocketMQ MessageStoreConfig names and defaults, from YAML and the environment.

Attributes are the snake_case form of RocketMQ's names (``flushIntervalCommitLog`` ->
``flush_interval_commit_log``). A YAML file may use either form; an environment variable is the
upper snake form with the ``MQSTORE_`` prefix (``MQSTORE_FLUSH_DISK_TYPE=SYNC_FLUSH``).
Precedence: defaults < YAML file < environment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ENV_PREFIX = "MQSTORE_"
# MQSTORE_* variables that are not store settings, by their owner. Every process loads the store
# settings and sees the whole environment (``mqstore up`` passes it to every child), so a variable one
# process owns must not be warned about by the others; tests/test_config_env.py checks that every name
# the code reads is here.
_NON_SETTING_ENV = {"LOG_LEVEL", "METRICS_PORT", "METRICS_HOST", "METRICS_MAX_SERIES",  # services/server
                    "METRICS_LAG_INTERVAL_MS",  # services/query/lag.py
                    "SERVICE_TOKEN", "SERVICE_TOKEN_FILE", "INSTANCE_ID",
                    "MEMORY_REPORT_DIR", "MEMORY_REPORT_INTERVAL_S", "MEMORY_REPORT_TYPES_EVERY",
                    "INDEXER_REPUT_SOURCE", "INDEXER_COMMITLOG_DIR",  # services/indexer/main.py
                    "QUERY_READ_FROM",  # services/cli.py (the query service)
                    "TRANSACTION_TIMEOUT_MS", "TRANSACTION_CHECK_MAX",  # services/scheduler/transaction_check.py
                    "TRANSACTION_CHECK_INTERVAL_MS",
                    "GATEWAY_WORKERS", "GATEWAY_WORKER",  # gateway/workers.py
                    "GATEWAY_TLS_CERT", "GATEWAY_TLS_KEY", "GATEWAY_TLS_CLIENT_CA",  # gateway/tls.py
                    "RMQ5", "RMQ5_MAX_DELIVERY_ATTEMPTS",  # gateway/rocketmq5/registration.py
                    "RMQ5_DEFAULT_INVISIBLE_MS", "RMQ5_RENEW_MAX_MS",
                    "GATEWAY", "TOKEN", "TLS", "TLS_CA", "TLS_CERT", "TLS_KEY",  # mqstore/client/connection.py
                    "PROGRESS",  # mqstore/client/progress.py
                    "EXPORT_CRASH_AFTER_BYTES"}  # pipeline/export.py: the tests' mid-write crash
log = logging.getLogger(__name__)
ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"
# brokerRole (services/commitlog/ha/, docs/replication.md).
ASYNC_MASTER = "ASYNC_MASTER"
SYNC_MASTER = "SYNC_MASTER"
SLAVE = "SLAVE"
# haProtocol: mqstore replicas authenticate before any offset counts; rocketmq is 4.9.8's bare wire.
HA_PROTOCOL_MQSTORE = "mqstore"
HA_PROTOCOL_ROCKETMQ = "rocketmq"


class ConfigError(ValueError):
    """A setting that is unknown or has a value of the wrong kind."""


@dataclass(slots=True)
class MessageStoreConfig:
    """Settings of the store. Names follow RocketMQ 4.9.8's MessageStoreConfig; defaults are its defaults."""

    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * 20
    flush_disk_type: str = ASYNC_FLUSH
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 10_000
    flush_commit_log_timed: bool = True
    commit_interval_commit_log: int = 200
    commit_commit_log_least_pages: int = 4
    commit_commit_log_thorough_interval: int = 200
    sync_flush_timeout: int = 5_000
    # A put waiting behind one that has held the put lock this long fails fast as "broker busy".
    os_page_cache_busy_time_out_mills: int = 1_000
    # Not in RocketMQ: how long a group-commit leader lets runnable producers append before it flushes.
    group_commit_gather_us: int = 0
    transient_store_pool_enable: bool = False
    transient_store_pool_size: int = 5
    fast_fail_if_no_buffer_in_store_pool: bool = False
    flush_interval_consume_queue: int = 1_000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 60_000
    max_message_size: int = 1024 * 1024 * 4
    check_crc_on_recover: bool = True
    # Not in RocketMQ: what recovery does with a damaged record that has intact records after it.
    # "quarantine" steps over it (services/store/formats/quarantine.py: reads of it answer DATA_LOSS, the
    # records after it stay); "cut" ends the log there as RocketMQ does. A torn tail is cut either way.
    recover_corruption_mode: str = "quarantine"
    # Not in RocketMQ: when the store's own records (the checkpoint, the queue-offset snapshot, the
    # indexer's dispatch checkpoint) show the log reached further than recovery found it, refuse to
    # start (the files are left untouched for a look) until an operator accepts the loss by starting
    # once with this off (services/commitlog/recovery.py find_missing_log; docs/operations.md).
    refuse_start_on_missing_log: bool = True
    # Not in RocketMQ (whose consumer offsets are written every flushConsumerOffsetInterval whatever the
    # flush mode): "auto" answers a consumer offset commit only once a write holding it is durable when
    # flushDiskType is SYNC_FLUSH (one write for every commit waiting, services/query/state_file.py),
    # "true" always, "false" never (the periodic write only: a power cut can roll an offset back).
    sync_consumer_offset_commit: str = "auto"
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    # RocketMQ 5's timerMaxDelaySec: how far ahead a timer message (TIMER_DELIVER_MS) may be (7 days).
    timer_max_delay_sec: int = 7 * 24 * 3600
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 5_000_000 * 4
    max_msgs_num_batch: int = 64
    message_index_enable: bool = True
    message_index_safe: bool = False
    disk_max_used_space_ratio: int = 75
    disk_space_warning_level_ratio: float = 0.90
    clean_resource_interval: int = 10_000
    file_reserved_time: int = 72
    delete_when: str = "04"
    # Above diskSpaceCleanForciblyRatio (0.85) RocketMQ deletes the oldest commitlog files before
    # fileReservedTime, consumed or not (protectUnconsumedData false, its default). Here the default
    # is true: a file some consumer group has not consumed is kept and writes are refused instead
    # (RESOURCE_EXHAUSTED naming the groups); false restores the forced cleaning. Files past
    # fileReservedTime are deleted either way. See services/commitlog/clean_commitlog.py.
    protect_unconsumed_data: bool = True
    warm_mapped_file_enable: bool = False
    # Not in RocketMQ: map the commitlog's page cache in the background (MADV_POPULATE_READ), a window
    # ahead of the writer and the next file's start, so appends do not allocate pages on the put path.
    # Costs page cache (clean, reclaimable), no I/O (services/store/formats/mapped_file.py).
    prefault_mapped_file: bool = True
    # Not in RocketMQ (whose files are sparse): commitlog files are sparse too, and blocks are reserved
    # (fallocate) this many bytes ahead of the write position, so a put never writes into a hole a full
    # disk has no blocks for (a SIGBUS). 0 allocates each file whole when it is created.
    reserve_ahead_commit_log: int = 16 * 1024 * 1024
    # How far behind the commitlog's end (this percent of the machine's memory) a pull reads before
    # the leader suggests a follower for the next one, with slaveReadEnable (services/store/rules/cold_read.py).
    access_message_in_memory_max_ratio: float = 40.0
    # Not in MessageStoreConfig: the broker-level settings the store needs.
    # BrokerConfig's slaveReadEnable: pulls that read cold data go to an in-sync follower.
    slave_read_enable: bool = False
    broker_ip: str = "127.0.0.1"
    listen_port: int = 10911
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 8
    commitlog_listen: str = "127.0.0.1:9901"
    indexer_listen: str = "127.0.0.1:9902"
    # Replication (services/commitlog/ha/, docs/replication.md): RocketMQ 4.9.8's names and defaults,
    # except haListenPort: 0 (the default here) runs no HA listener, so one host runs many shards.
    broker_role: str = ASYNC_MASTER
    broker_name: str = "broker-a"  # the shard a replica belongs to: the handshake compares it
    ha_listen_port: int = 0
    ha_master_address: str = ""  # a SLAVE's leader, host:port of its HA listener
    ha_protocol: str = HA_PROTOCOL_MQSTORE
    ha_send_heartbeat_interval: int = 5_000
    ha_housekeeping_interval: int = 20_000
    ha_transfer_batch_size: int = 32 * 1024
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024
    # How long a SYNC_MASTER put waits for its followers (4.9.8 waits syncFlushTimeout).
    ha_send_timeout: int = 5_000
    # RocketMQ 5's: replicas that hold a record before SYNC_MASTER acks it, the leader included; a
    # SYNC_MASTER ack always needs at least one follower, whatever this says.
    min_in_sync_replicas: int = 1
    # Leadership through etcd (docs/replication.md): with an endpoint (host:port of etcd's gRPC API),
    # etcd decides which replica leads (brokerRole then only says SYNC_MASTER or ASYNC_MASTER acks);
    # haReplicaName names this replica in the in-sync set (default brokerIP1:haListenPort).
    etcd_endpoint: str = ""
    ha_replica_name: str = ""
    ha_lease_ttl_seconds: int = 5
    # Not in RocketMQ: the host:port followers dial, written into etcd's leader key (default
    # brokerIP1:haListenPort); set it when followers reach this replica through a proxy, NAT or Service.
    ha_advertised_address: str = ""

    @property
    def store_host(self) -> str:
        """``ip:port`` written into every record as STOREHOSTADDRESS (brokerIP1:listenPort)."""
        return f"[{self.broker_ip}]:{self.listen_port}" if ":" in self.broker_ip else \
            f"{self.broker_ip}:{self.listen_port}"

    @property
    def consumer_offset_commit_sync(self) -> bool:
        """Whether a consumer offset commit is answered only once it is durable (syncConsumerOffsetCommit)."""
        if self.sync_consumer_offset_commit == "auto":
            return self.flush_disk_type == SYNC_FLUSH
        return self.sync_consumer_offset_commit == "true"

    def validate(self) -> None:
        if self.flush_disk_type not in (ASYNC_FLUSH, SYNC_FLUSH):
            raise ConfigError(f"flushDiskType must be {ASYNC_FLUSH} or {SYNC_FLUSH}, not {self.flush_disk_type!r}")
        if self.recover_corruption_mode not in ("quarantine", "cut"):
            raise ConfigError("recoverCorruptionMode must be quarantine or cut, not "
                              f"{self.recover_corruption_mode!r}")
        if self.sync_consumer_offset_commit not in ("auto", "true", "false"):
            raise ConfigError("syncConsumerOffsetCommit must be auto (sync under SYNC_FLUSH), true or false, not "
                              f"{self.sync_consumer_offset_commit!r}")
        self._validate_replication()
        if self.mapped_file_size_commit_log < 4096:
            raise ConfigError("mappedFileSizeCommitLog must be at least 4096 bytes")
        if self.reserve_ahead_commit_log < 0:
            raise ConfigError("reserveAheadCommitLog must be 0 (allocate whole files) or a number of bytes")
        if not 0 <= self.access_message_in_memory_max_ratio <= 100:
            raise ConfigError("accessMessageInMemoryMaxRatio must be a percent of memory, 0..100")
        for name in ("flush_interval_commit_log", "commit_interval_commit_log", "sync_flush_timeout",
                     "timer_max_delay_sec"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{camel_name(name)} must be positive")

    def _validate_replication(self) -> None:
        if self.broker_role not in (ASYNC_MASTER, SYNC_MASTER, SLAVE):
            raise ConfigError(f"brokerRole must be {ASYNC_MASTER}, {SYNC_MASTER} or {SLAVE}, not {self.broker_role!r}")
        if self.ha_protocol not in (HA_PROTOCOL_MQSTORE, HA_PROTOCOL_ROCKETMQ):
            raise ConfigError(f"haProtocol must be {HA_PROTOCOL_MQSTORE} or {HA_PROTOCOL_ROCKETMQ}, "
                              f"not {self.ha_protocol!r}")
        if self.broker_role == SLAVE and not self.ha_master_address:
            raise ConfigError("brokerRole SLAVE needs haMasterAddress: the leader's HA listener, host:port")
        if self.ha_master_address:
            split_host_port(self.ha_master_address)
        if self.ha_advertised_address and not _is_host_port(self.ha_advertised_address):
            raise ConfigError(f"haAdvertisedAddress {self.ha_advertised_address!r} must look like host:port")
        if self.etcd_endpoint:
            split_host_port(self.etcd_endpoint)
            if self.ha_listen_port <= 0 or self.broker_role == SLAVE:
                raise ConfigError("etcdEndpoint needs haListenPort (any replica may be elected and then listens "
                                  "there) and brokerRole SYNC_MASTER or ASYNC_MASTER (etcd decides who leads)")
        if self.broker_role == SYNC_MASTER and self.ha_listen_port <= 0:
            raise ConfigError("brokerRole SYNC_MASTER needs haListenPort: its followers connect there")
        if not 0 <= self.ha_listen_port <= 65535:
            raise ConfigError(f"haListenPort {self.ha_listen_port} must be within 0..65535 (0: no HA listener)")
        for name in ("ha_send_heartbeat_interval", "ha_housekeeping_interval", "ha_transfer_batch_size",
                     "ha_slave_fallbehind_max", "ha_send_timeout", "min_in_sync_replicas", "ha_lease_ttl_seconds"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{camel_name(name)} must be positive")

    def with_overrides(self, **values: Any) -> MessageStoreConfig:
        return dataclasses.replace(self, **values)


_FIELDS = {f.name: f for f in dataclasses.fields(MessageStoreConfig)}


def _is_host_port(address: str) -> bool:
    try:
        split_host_port(address)
    except ConfigError:
        return False
    return True


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) -> (host, port); ConfigError saying what to fix."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"address {address!r} must look like host:port (haMasterAddress)")
    return host, int(port)


def snake_name(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def camel_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _coerce(name: str, raw: Any) -> Any:
    kind = _FIELDS[name].type
    try:
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return text in ("true", "1", "yes")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return str(raw)
    except ValueError:
        raise ConfigError(f"{camel_name(name)}: {raw!r} is not a valid {kind}") from None


def _apply(values: dict[str, Any], source: Mapping[str, Any], origin: str) -> None:
    for key, raw in source.items():
        name = snake_name(key)
        if name not in _FIELDS:
            raise ConfigError(f"{origin}: unknown setting {key!r}")
        values[name] = _coerce(name, raw)


def is_known_env(key: str) -> bool:
    """Whether some mqstore process or the client reads this MQSTORE_* variable."""
    name = key.removeprefix(ENV_PREFIX)
    return name.lower() in _FIELDS or name in _NON_SETTING_ENV


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None,
                **overrides: Any) -> MessageStoreConfig:
    """Defaults, then the YAML file, then ``MQSTORE_*`` environment variables, then ``overrides``."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read settings file {path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"settings file {path} must hold a mapping of setting: value")
        _apply(values, loaded, str(path))
    env = os.environ if environ is None else environ
    from_env = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name in _FIELDS:
            from_env[name] = value
        elif not is_known_env(key):
            log.warning("ignoring %s: no mqstore setting or service reads it (store settings: "
                        "services/store/config.py)", key)
    _apply(values, from_env, "environment")
    values.update(overrides)
    config = MessageStoreConfig(**values)
    config.validate()
    return config
