"""The operator commands of ``mqstore``: ``status``, ``topics delete`` and ``--version``.

``mqstore status`` is mqadmin's clusterList and brokerStatus in one table: a row per shard with its
services' health, the commitlog's offsets, flush lag (written, not yet flushed), dispatch lag (the
indexer's reput offset behind the commitlog's max), disk use against the watermarks where cleaning
starts early and writes are refused, and topic and group counts; a replicated shard adds a row per
replica: its role and epoch as etcd names them, max offset, lag behind the leader, in-sync membership.
It exits 1 when anything is down or a disk refuses writes, so scripts and probes can use it as it is.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from mqstore.client import admin
from mqstore.client.client import Client
from mqstore.client.output import Printer

PROG = "mqstore"
EXIT_OK, EXIT_ERROR = 0, 1
#: ``mqstore.client.cli``'s helpers, handed in by it (this module does not import it: no cycle).
ClientFactory = Callable[[argparse.Namespace], Client]
Handler = Callable[[argparse.Namespace], int]

SERVICES = ("commitlog", "indexer", "query", "scheduler")
#: How a service's health shows in the table.
_STATE = {"SERVING": "up", "NOT_SERVING": "NOT SERVING", "UNREACHABLE": "DOWN"}


def version() -> str:
    """The installed package's version (``mqstore --version``)."""
    try:
        return metadata.version("mqstore")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def add_version_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}",
                        help="print the mqstore version and exit")


def add_status_command(commands: Any, command: Callable[..., Any], common: Callable[..., None],
                       client: ClientFactory) -> None:
    """``mqstore status`` (``command``, ``common``: cli's ``_command`` and ``_common``)."""
    status = command(commands, "status", "every shard's services, offsets, disk, flush and dispatch lag (exit 1 "
                                         "when something is down)", lambda args: _status(args, client))
    common(status)


def add_topic_delete(actions: Any, handled: Callable[[Handler], Handler], common: Callable[..., None],
                     client: ClientFactory) -> None:
    """``mqstore topics delete NAME`` (``actions``: the topics command's subparsers)."""
    delete = actions.add_parser("delete", allow_abbrev=False,
                                help="delete a topic's config and ConsumeQueues on every shard (admin token)")
    delete.set_defaults(handler=handled(lambda args: _delete_topic(args, client)), client_parser=delete)
    delete.add_argument("name", metavar="TOPIC")
    common(delete, nested=True)


def _delete_topic(args: argparse.Namespace, client_of: ClientFactory) -> int:
    printer = Printer(args.json)
    with client_of(args) as client:
        result = admin.delete_topic(client, args.name)
    if printer.json_mode:
        printer.json(result)
    else:
        printer.table(("topic", "shards", "deleted_queues"),
                      [(result["topic"], ",".join(result["shards"]), result["deleted_queues"])])
    return EXIT_OK


def _status(args: argparse.Namespace, client_of: ClientFactory) -> int:
    printer = Printer(args.json)
    with client_of(args) as client:
        status = admin.cluster_status(client)
    if printer.json_mode:
        printer.json(status)
    else:
        printer.table(("shard", *SERVICES, "min_offset", "max_offset", "flush_lag", "dispatch_lag", "disk_used",
                       "clean_at", "refuse_at", "topics", "groups"),
                      [_row(shard) for shard in status["shards"]], empty="no shards")
        replicas: list[Sequence[Any]] = [
            [shard["name"], r["name"], r["role"], r["epoch"], r["max_offset"], r["lag_bytes"],
             "yes" if r["in_sync"] else "no"] for shard in status["shards"] for r in shard["replicas"]]
        if replicas:  # a replicated shard (mqstore up --replicas): who leads, who is in sync, how far behind
            printer.table(("shard", "replica", "role", "epoch", "max_offset", "lag", "in_sync"), replicas)
        for shard in status["shards"]:
            for replica in shard["replicas"]:
                if replica["error"]:
                    printer.note(f"{shard['name']} {replica['name']} ({replica['commitlog']}): {replica['error']}")
            for service in shard["services"]:
                if service["error"]:
                    printer.note(f"{shard['name']} {service['name']} ({service['address']}): {service['error']}")
            if shard["disk_full"]:
                printer.note(f"{shard['name']}: the commitlog refuses writes (disk full)")
        if not args.quiet:
            printer.note(f"{len(status['shards'])} shards, {status['topic_count']} topics, "
                         f"{status['group_count']} groups: {'healthy' if status['healthy'] else 'NOT HEALTHY'}")
    return EXIT_OK if status["healthy"] else EXIT_ERROR


def _row(shard: dict[str, Any]) -> list[Any]:
    states = {s["name"]: _STATE.get(s["state"], s["state"]) for s in shard["services"]}
    lag_ms = f" ({shard['dispatch_lag_ms']} ms)" if shard["dispatch_lag_ms"] else ""
    return [shard["name"], *(states.get(name, "-") for name in SERVICES), shard["min_offset"], shard["max_offset"],
            shard["flush_lag_bytes"], f"{shard['dispatch_lag_bytes']}{lag_ms}", _ratio(shard["disk_used_ratio"]),
            _ratio(shard["disk_clean_ratio"]), _ratio(shard["disk_refuse_ratio"]), shard["topic_count"],
            shard["group_count"]]


def _ratio(value: float) -> str:
    return f"{value * 100:.1f}%" if value else "-"
