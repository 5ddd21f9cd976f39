"""The ``mqstore`` command line: run the system or one service, use it (send, pull, query...), inspect
store files offline."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import cast

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    from mqstore.client.admin_cli import add_version_option
    from mqstore.client.cli import CommandParser

    parser = CommandParser(prog="mqstore", description=__doc__)
    add_version_option(parser)
    # Subcommand parsers are CommandParsers too (one-line errors); the adders take the base type.
    commands = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
                    parser.add_subparsers(dest="command", required=True))
    _add_run(commands)
    _add_inspect(commands)
    _add_pipeline(commands)
    _add_export_rocketmq_store(commands)
    from mqstore.client.cli import add_client_commands

    add_client_commands(commands)
    from bench.cli import add_bench_command

    add_bench_command(commands)
    return parser


def _add_pipeline(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # The job arguments are parsed by pipeline.cli, so other commands never import Spark.
    pipeline = commands.add_parser("pipeline", add_help=False,
                                   help="Spark jobs over store files: export, reindex, verify, stats")
    pipeline.add_argument("pipeline_args", nargs=argparse.REMAINDER)
    pipeline.set_defaults(handler=_pipeline)


def _pipeline(args: argparse.Namespace) -> int:
    from pipeline.cli import main as pipeline_main

    return pipeline_main(args.pipeline_args)


_EXPORT_EPILOG = """\
DEST gets RocketMQ 4.9.8's store layout: commitlog/, consumequeue/ and index/ (from SRC/indexer),
one checkpoint (the commitlog's physicMsgTimestamp, the indexer's logics and index timestamps) and
config/ (topics.json, consumerOffset.json from SRC/query, delayOffset.json when delayed messages
exist). Files are hard-linked when DEST is on SRC's filesystem, except the newest file of each
directory, which is copied so that the two stores never write into each other; SRC is not modified.
SRC must be stopped cleanly (no service running, no abort file); DEST must be new or empty.
Progress goes to stderr; the summary and the settings to start RocketMQ with go to stdout.
Then: storePathRootDir=DEST plus the printed mappedFileSize*/maxHashSlotNum/maxIndexNum in broker.conf.
"""


def _add_export_rocketmq_store(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = commands.add_parser(
        "export-rocketmq-store", help="write a RocketMQ 4.9.8 store directory from a stopped mqstore store",
        description="Write a store directory that RocketMQ 4.9.8 loads as its storePathRootDir from a cleanly "
                    "stopped mqstore store (docs/formats.md, \"Moving a store to RocketMQ\").",
        epilog=_EXPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    export.add_argument("src", metavar="SRC", help="the mqstore store root (what mqstore up --store was given)")
    export.add_argument("dest", metavar="DEST", help="the RocketMQ store directory to write (new or empty)")
    export.add_argument("--indexer", default=None, help="the indexer's store root (default SRC/indexer)")
    export.add_argument("--query", default=None, help="the query service's store root (default SRC/query)")
    export.add_argument("--copy", action="store_true", help="copy every file, never hard-link")
    export.add_argument("--progress-interval", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between progress lines on stderr (default 1)")
    export.set_defaults(handler=_export_rocketmq_store)


def _export_rocketmq_store(args: argparse.Namespace) -> int:
    from services.store.tools.rocketmq_layout_export import SourceStore
    from services.store.tools.rocketmq_layout_export import main as export_main

    return export_main(SourceStore.at(args.src, args.indexer, args.query), args.dest, args.copy,
                       args.progress_interval)


def _add_run(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name in ("up", "run"):
        up = commands.add_parser(name, help="run the whole system on an embedded default (127.0.0.1)"
                                 + (" (same as up)" if name == "run" else ""))
        up.add_argument("--store", default="./data", help="store root directory (default ./data)")
        up.add_argument("--config", help="YAML settings file (MessageStoreConfig names)")
        up.add_argument("--base-port", type=int, default=None,
                        help="gateway on this port, commitlog/indexer/query/scheduler on the next four "
                             "(default: gateway 9876, commitlog 9901, indexer 9902, query 9903, scheduler 9904)")
        up.add_argument("--auth-file", default=None, help="bearer tokens for the gateway (see README)")
        up.add_argument("--metrics-base-port", type=int, default=9910,
                        help="Prometheus /metrics of commitlog, indexer, query, gateway (one port per worker), "
                             "scheduler on the next ports (default 9910: 9911..9915)")
        up.add_argument("--no-metrics", action="store_true", help="no /metrics endpoints")
        up.add_argument("--gateway-workers", type=int, default=None, metavar="N",
                        help="gateway processes sharing its port (default: $MQSTORE_GATEWAY_WORKERS, else 1); "
                             "worker i serves /metrics on the gateway's metrics port + i")
        up.add_argument("--replicas", type=int, default=None, metavar="N",
                        help="N replicas of the shard on a local etcd (installed when missing): the gateway "
                             "follows the leader etcd names (docs/replication.md); without it, one copy")
        up.set_defaults(handler=_run)

    serve = commands.add_parser("serve", help="run one service alone: commitlog, indexer, query, scheduler or gateway")
    services = serve.add_subparsers(dest="service", required=True)
    _add_services(services, ("commitlog", "indexer", "query", "scheduler", "gateway"))
    # Shortcuts for the services whose names no client command takes (``mqstore query`` finds messages).
    _add_services(commands, ("commitlog", "indexer", "gateway"))


def _add_services(commands: argparse._SubParsersAction[argparse.ArgumentParser], names: Sequence[str]) -> None:
    if "commitlog" in names:
        commitlog = commands.add_parser("commitlog", help="run the commitlog service alone")
        commitlog.add_argument("--store", default="./data", help="store root directory")
        commitlog.add_argument("--config", help="YAML settings file (MessageStoreConfig names)")
        commitlog.add_argument("--listen", default=None, help="host:port to listen on (default 127.0.0.1:9901)")
        commitlog.set_defaults(handler=_serve_commitlog)
    if "indexer" in names:
        indexer = commands.add_parser("indexer", help="run the indexer alone (ConsumeQueue and IndexFile)")
        indexer.add_argument("--store", default="./data/indexer", help="the indexer's own store root")
        indexer.add_argument("--config", help="YAML settings file (MessageStoreConfig names)")
        indexer.add_argument("--listen", default=None, help="host:port to listen on (default 127.0.0.1:9902)")
        indexer.add_argument("--commitlog", default=None, help="the commitlog service (default 127.0.0.1:9901)")
        indexer.set_defaults(handler=_serve_indexer)
    if "query" in names:
        query = commands.add_parser("query", help="run the query service alone (pull, lookups, consumer offsets)")
        query.add_argument("--store", default="./data/query", help="the query service's own store root")
        query.add_argument("--config", help="YAML settings file (MessageStoreConfig names)")
        query.add_argument("--listen", default=None, help="host:port to listen on (default 127.0.0.1:9903)")
        query.add_argument("--commitlog", default=None, help="the commitlog service (default 127.0.0.1:9901)")
        query.add_argument("--indexer", default=None, help="the indexer (default 127.0.0.1:9902)")
        query.add_argument("--persist-interval-ms", type=int, default=5000,
                           help="how often changed consumer offsets are written (default 5000)")
        query.add_argument("--max-long-poll-ms", type=int, default=15000,
                           help="the longest a pull may wait for messages (default 15000)")
        query.add_argument("--store-root", default=None,
                           help="the commitlog service's store root, mounted here (one pod per shard sharing the "
                                "volume): pulls and lookups read the store files directly")
        query.add_argument("--indexer-store", default=None,
                           help="the indexer's store root for reads from the files (default STORE_ROOT/indexer)")
        query.add_argument("--read-from", choices=("files", "grpc"), default=os.environ.get("MQSTORE_QUERY_READ_FROM"),
                           help="where data reads come from (default $MQSTORE_QUERY_READ_FROM, else files with "
                                "--store-root, else grpc)")
        query.set_defaults(handler=_serve_query)
    if "scheduler" in names:
        scheduler = commands.add_parser("scheduler", help="run the scheduler alone (delivers delayed messages)")
        scheduler.add_argument("--store", default="./data/scheduler",
                               help="the scheduler's own store root (config/delayOffset.json)")
        scheduler.add_argument("--store-root", default="./data",
                               help="the commitlog service's store root, mounted here: SCHEDULE_TOPIC_XXXX's units "
                                    "and records are read from its files (default ./data)")
        scheduler.add_argument("--indexer-store", default=None,
                               help="the indexer's store root (default STORE_ROOT/indexer)")
        scheduler.add_argument("--config", help="YAML settings file (MessageStoreConfig names: messageDelayLevel)")
        scheduler.add_argument("--listen", default=None, help="host:port to listen on (default 127.0.0.1:9904)")
        scheduler.add_argument("--commitlog", default=None, help="the commitlog service (default 127.0.0.1:9901)")
        scheduler.add_argument("--indexer", default=None, help="the indexer (default 127.0.0.1:9902)")
        scheduler.add_argument("--persist-interval-ms", type=int, default=10000,
                               help="how often delayOffset.json is written when it changed (default 10000, "
                                    "RocketMQ's flushDelayOffsetInterval); after kill -9 the deliveries of the last "
                                    "interval may repeat")
        scheduler.set_defaults(handler=_serve_scheduler)
    if "gateway" in names:
        gateway = commands.add_parser("gateway", help="run the gateway alone (the public endpoint)")
        gateway.add_argument("--config",
                             help="gateway settings YAML (shards, queue selection, auth; see gateway/settings.py)")
        gateway.add_argument("--listen", default=None, help="host:port to listen on (default 127.0.0.1:9876)")
        gateway.add_argument("--commitlog", default=None, help="one shard's commitlog service (with --query)")
        gateway.add_argument("--query", default=None, help="one shard's query service (with --commitlog)")
        gateway.add_argument("--auth-file", default=None, help="bearer tokens YAML; without it auth is off")
        gateway.add_argument("--queue-selection", choices=("round_robin", "latency"), default=None,
                             help="how sends without a sharding key pick a queue (default round_robin)")
        gateway.add_argument("--default-topic-queue-nums", type=int, default=None,
                             help="queues of a topic created by its first send; must match the store's "
                                  "defaultTopicQueueNums (default 8)")
        gateway.add_argument("--workers", type=int, default=None, metavar="N",
                             help="gateway processes sharing the listen port with SO_REUSEPORT; worker i serves "
                                  "/metrics on MQSTORE_METRICS_PORT + i (default: $MQSTORE_GATEWAY_WORKERS, else the "
                                  "settings file's workers, else 1; see gateway/workers.py)")
        gateway.add_argument("--tls-cert", default=None, metavar="PEM",
                             help="TLS certificate (chain) of the listen port, with --tls-key (default "
                                  "$MQSTORE_GATEWAY_TLS_CERT; see docs/security.md)")
        gateway.add_argument("--tls-key", default=None, metavar="PEM",
                             help="its unencrypted private key (default $MQSTORE_GATEWAY_TLS_KEY)")
        gateway.add_argument("--tls-client-ca", default=None, metavar="PEM",
                             help="mutual TLS: require client certificates signed by this CA (default "
                                  "$MQSTORE_GATEWAY_TLS_CLIENT_CA)")
        gateway.set_defaults(handler=_serve_gateway)


def _run(args: argparse.Namespace) -> int:
    from services.runner import run

    if args.replicas is not None:
        from services.replica_set import run_replicated

        return run_replicated(store=args.store, config_file=args.config, replicas=args.replicas,
                              base_port=args.base_port, auth_file=args.auth_file,
                              metrics_base_port=None if args.no_metrics else args.metrics_base_port,
                              gateway_workers=args.gateway_workers)
    return run(store=args.store, config_file=args.config, base_port=args.base_port, auth_file=args.auth_file,
               metrics_base_port=None if args.no_metrics else args.metrics_base_port,
               gateway_workers=args.gateway_workers)


def _serve_gateway(args: argparse.Namespace) -> int:
    from gateway.main import serve
    from gateway.settings import GatewayOptions

    if (args.commitlog is None) != (args.query is None):
        print("mqstore gateway: give both --commitlog and --query (one shard), or neither", file=sys.stderr)
        return 2
    return serve(GatewayOptions(config_file=args.config, listen=args.listen, auth_file=args.auth_file,
                                queue_selection=args.queue_selection,
                                shard=None if args.commitlog is None else (args.commitlog, args.query),
                                default_topic_queue_nums=args.default_topic_queue_nums, workers=args.workers,
                                tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca))


def _serve_indexer(args: argparse.Namespace) -> int:
    from services.indexer.main import serve

    return serve(store=args.store, config_file=args.config, listen=args.listen, commitlog=args.commitlog)


def _serve_query(args: argparse.Namespace) -> int:
    from services.query.main import QueryOptions, serve

    return serve(QueryOptions(store=args.store, config_file=args.config, listen=args.listen, commitlog=args.commitlog,
                              indexer=args.indexer, persist_interval_ms=args.persist_interval_ms,
                              max_long_poll_ms=args.max_long_poll_ms, store_root=args.store_root,
                              indexer_store=args.indexer_store, read_from=args.read_from))


def _serve_scheduler(args: argparse.Namespace) -> int:
    from services.scheduler.main import SchedulerOptions, serve

    return serve(SchedulerOptions(store=args.store, store_root=args.store_root, config_file=args.config,
                                  listen=args.listen, commitlog=args.commitlog, indexer=args.indexer,
                                  indexer_store=args.indexer_store, persist_interval_ms=args.persist_interval_ms))


def _serve_commitlog(args: argparse.Namespace) -> int:
    from services.commitlog.main import serve

    return serve(store=args.store, config_file=args.config, listen=args.listen)


def _add_inspect(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inspect = commands.add_parser("inspect", help="decode store files offline")
    kinds = inspect.add_subparsers(dest="kind", required=True)
    from services.store.formats.geometry import add_geometry_arguments

    commitlog = kinds.add_parser("commitlog", help="decode every record of a commitlog directory")
    commitlog.add_argument("dir", help="a store root or its commitlog directory (mqstore's or RocketMQ's)")
    commitlog.add_argument("--from", dest="from_offset", type=int, default=None,
                           help="start at this commitlog offset (a record boundary)")
    commitlog.add_argument("--json", action="store_true", help="one JSON object per record")
    _json_names_argument(commitlog)
    commitlog.add_argument("--allow-corrupt", action="store_true",
                           help="exit 0 even if the data ends at a damaged record with intact records after it")
    add_geometry_arguments(commitlog, commitlog=True)
    commitlog.set_defaults(handler=_inspect_commitlog)
    consumequeue = kinds.add_parser("consumequeue", help="print the units of ConsumeQueue files")
    consumequeue.add_argument("dir", help="a store root (mqstore's or RocketMQ's), a consumequeue directory, "
                                          "a topic's or a queue's directory")
    consumequeue.add_argument("--json", action="store_true", help="one JSON object per unit")
    _json_names_argument(consumequeue)
    add_geometry_arguments(consumequeue, consumequeue=True)
    consumequeue.set_defaults(handler=_inspect_consumequeue)
    index = kinds.add_parser("index", help="print an IndexFile: header, then entries")
    index.add_argument("file", help="one index file (mqstore's or RocketMQ's)")
    index.add_argument("--json", action="store_true", help="one JSON object per line")
    _json_names_argument(index)
    index.add_argument("--slots", action="store_true", help="also print the non-empty hash slots")
    add_geometry_arguments(index, index=True)
    index.set_defaults(handler=_inspect_index)


def _json_names_argument(parser: argparse.ArgumentParser) -> None:
    from services.store.tools.inspect_output import JSON_NAMES, SNAKE_CASE

    parser.add_argument("--json-names", choices=JSON_NAMES, default=SNAKE_CASE,
                        help="--json field names: snake_case like every mqstore command (default), or rocketmq: "
                             "the camelCase names of RocketMQ's reference dumps")


def _inspect_commitlog(args: argparse.Namespace) -> int:
    from services.store.formats.geometry import options_of
    from services.store.tools.inspect_commitlog import main as inspect_main

    return inspect_main(args.dir, args.from_offset, args.json, options_of(args), allow_corrupt=args.allow_corrupt,
                        json_names=args.json_names)


def _inspect_consumequeue(args: argparse.Namespace) -> int:
    from services.store.formats.geometry import options_of
    from services.store.tools.inspect_consumequeue import main as inspect_main

    return inspect_main(args.dir, args.json, options_of(args), json_names=args.json_names)


def _inspect_index(args: argparse.Namespace) -> int:
    from services.store.formats.geometry import options_of
    from services.store.tools.inspect_index import main as inspect_main

    return inspect_main(args.file, args.json, args.slots, options_of(args), json_names=args.json_names)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pipeline"]:
        # Every argument belongs to the job (argparse's REMAINDER would refuse a leading --help).
        return _pipeline(argparse.Namespace(pipeline_args=argv[1:]))
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
