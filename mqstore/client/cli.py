"""The client commands of ``mqstore``: send, pull, get, query (by key), offset and topics.

They talk to the gateway (``--gateway``, else $MQSTORE_GATEWAY, else 127.0.0.1:9876) with an
optional bearer token (``--token`` or $MQSTORE_TOKEN). Output is an aligned table, or with
``--json`` one JSON object per line. A refused call prints ``mqstore: error: CODE: what to fix``
and exits 1; so does a malformed command line (one line naming the mistake and the ``--help`` to read).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, BinaryIO, NoReturn, TypeAlias, TypeVar, cast

from mqstore.client import admin_cli
from mqstore.client.client import Client
from mqstore.client.connection import DEFAULT_TIMEOUT_S, ENV_GATEWAY, ENV_TOKEN, Tls
from mqstore.client.consumer import DEFAULT_LONG_POLL_MS, PullConsumer
from mqstore.client.dead_letters import list_dead_letters, resend_dead_letter, show_dead_letter
from mqstore.client.errors import MqstoreError
from mqstore.client.groups import describe_groups
from mqstore.client.limits import MAX_BATCH_MESSAGES
from mqstore.client.models import PERM_READ, PERM_WRITE, Message, OutgoingMessage, SendReceipt, perm_text
from mqstore.client.output import MAX_CELL, Printer, cell, format_record, timestamp
from mqstore.client.producer import Producer
from mqstore.client.progress import Progress
from mqstore.client.transaction_producer import TransactionProducer, TransactionState

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[argparse.Namespace], int]
T = TypeVar("T")
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 130
PROG = "mqstore"
_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)(ms|s|m|h|d)(?: ?ago)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: Messages per pull of one queue: bigger than the client's default, since the CLI prints whole topics.
PULL_BATCH = 256
#: Where the store parks a delayed (DELAY) or timer (TIMER_*) message until it is due
#: (services/store/rules/names.py; the client imports no server code, so they are named here).
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
PARKING_TOPICS = frozenset({SCHEDULE_TOPIC, "rmq_sys_wheel_timer"})
MESSAGE_COLUMNS = ("queue", "offset", "uniq_key", "offset_msg_id", "tags", "keys", "stored", "body")


class UsageError(Exception):
    """A command line that parses but does not make sense; reported like argparse's errors (exit 1)."""


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose mistakes are one line on stderr and exit code 1, like every other error
    of the command (argparse's own would print the whole usage and exit 2). Subcommand parsers made by
    ``add_subparsers`` are of the parent's class, so one parser at the top makes the whole tree so."""

    def error(self, message: str) -> NoReturn:
        _error(f"{message} (see {self.prog} --help)", prog=self.prog)
        sys.exit(EXIT_ERROR)


# -- argument helpers ----------------------------------------------------------------------------------


def parse_time(text: str) -> int:
    """Milliseconds since the epoch from ``1718000000000`` (ms), ``now``, an age (``15m``, ``2h``,
    ``1d``, also ``15m ago`` or ``-15m``) or an ISO 8601 time (``2024-06-10T08:00``; local time
    unless it has an offset or Z)."""
    value = text.strip()
    if re.fullmatch(r"\d+", value):
        return int(value)
    if value == "now":
        return int(time.time() * 1000)
    relative = _RELATIVE.match(value)
    if relative:
        return int(time.time() * 1000 - float(relative.group(1)) * _UNIT_MS[relative.group(2)])
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: give ms since the epoch, an ISO time (2024-06-10T08:00:00), "
            "'now' or an age like 15m, 2h, 1d") from None
    return int(moment.astimezone().timestamp() * 1000) if moment.tzinfo is None else int(moment.timestamp() * 1000)


def parse_property(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"property {text!r} must be NAME=VALUE")
    return name, value


def parse_perm(text: str) -> int:
    """``rw``, ``r``, ``w`` or RocketMQ's number (6, 4, 2)."""
    value = text.strip().lower()
    if value.isdigit() and int(value) in (2, 4, 6):
        return int(value)
    letters = value.replace("-", "")
    if letters and set(letters) <= {"r", "w"}:
        return (PERM_READ if "r" in letters else 0) | (PERM_WRITE if "w" in letters else 0)
    raise argparse.ArgumentTypeError(f"permission {text!r} must be rw, r, w (or 6, 4, 2)")


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must not be negative")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _common(parser: argparse.ArgumentParser, nested: bool = False) -> None:
    """Options every client command takes. A nested subcommand leaves them unset unless given, so
    ``mqstore topics --json route x`` and ``mqstore topics route x --json`` mean the same."""
    unset: Any = argparse.SUPPRESS
    group = parser.add_argument_group("connection and output")
    group.add_argument("--gateway", metavar="ADDR", default=unset if nested else None,
                       help=f"the gateway host:port (default ${ENV_GATEWAY}, else 127.0.0.1:9876)")
    group.add_argument("--token", default=unset if nested else None,
                       help=f"bearer token when the gateway has auth on (default ${ENV_TOKEN})")
    group.add_argument("--tls-ca", metavar="PEM", default=unset if nested else None,
                       help="TLS to the gateway, trusting this CA (default $MQSTORE_TLS_CA; MQSTORE_TLS=1: system CAs)")
    group.add_argument("--tls-cert", metavar="PEM", default=unset if nested else None,
                       help="client certificate, for a gateway with mutual TLS (default $MQSTORE_TLS_CERT)")
    group.add_argument("--tls-key", metavar="PEM", default=unset if nested else None,
                       help="its private key (default $MQSTORE_TLS_KEY)")
    group.add_argument("--timeout", metavar="SECONDS", type=float, default=unset if nested else DEFAULT_TIMEOUT_S,
                       help=f"deadline of each call (default {DEFAULT_TIMEOUT_S:g})")
    group.add_argument("--json", action="store_true", default=unset if nested else False,
                       help="one JSON object per line instead of a table")
    group.add_argument("-q", "--quiet", action="store_true", default=unset if nested else False,
                       help="no progress bar, no summary lines on stderr")


def _topic_arguments(parser: argparse.ArgumentParser, positional: bool) -> None:
    parser.add_argument("--topic", "-t", dest="topic_option", metavar="TOPIC", help="the topic")
    if positional:
        parser.add_argument("topic", nargs="?", help="the topic (or --topic)")


def _topic(args: argparse.Namespace) -> str:
    option = getattr(args, "topic_option", None)
    positional = getattr(args, "topic", None)
    if option and positional and option != positional:
        raise UsageError(f"two topics given ({positional!r} and --topic {option!r})")
    topic = option or positional
    if not topic:
        raise UsageError("give the topic (--topic TOPIC)")
    return str(topic)


def _client(args: argparse.Namespace) -> Client:
    return Client(args.gateway, args.token, timeout=args.timeout, tls=_tls(args))


def _tls(args: argparse.Namespace) -> Tls | None:
    """TLS from --tls-ca/--tls-cert/--tls-key; None (the environment decides) when none is given."""
    files = [getattr(args, name, None) for name in ("tls_ca", "tls_cert", "tls_key")]
    return Tls(*files) if any(files) else None


def _handled(handler: Handler) -> Handler:
    """Runs a command: refused calls and bad input become one line on stderr, never a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except UsageError as exc:
            parser: argparse.ArgumentParser = args.client_parser
            _error(f"{exc} (see {parser.prog} --help)", prog=parser.prog)
            return EXIT_ERROR
        except MqstoreError as exc:
            _error(f"{exc.code}: {exc.message}")
            return EXIT_ERROR
        except (ValueError, OSError) as exc:
            if isinstance(exc, BrokenPipeError):
                _silence_stdout()
                return EXIT_OK
            _error(str(exc) if not isinstance(exc, OSError) else _os_error(exc))
            return EXIT_ERROR
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    return run


def _error(message: str, prog: str = PROG) -> None:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)


def _os_error(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _silence_stdout() -> None:
    """After EPIPE (``mqstore pull ... | head``) point stdout at /dev/null so exiting does not fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _command(commands: Subcommands, name: str, help_text: str, handler: Handler, **kwargs: Any) -> Any:
    # No abbreviated options: with subcommands, a prefix ("--to") would be matched against the
    # parent's options ("--topic", "--token") before the subcommand sees it.
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text,
                                                          allow_abbrev=False, **kwargs)
    parser.set_defaults(handler=_handled(handler), client_parser=parser)
    return parser


# -- registration ----------------------------------------------------------------------------------------


def add_client_commands(commands: Subcommands) -> None:
    """Registers send, pull, get, query, offset, topics and dlq on ``mqstore``'s subcommands (the query
    *service* runs as ``mqstore serve query``)."""
    _add_send(commands)
    _add_pull(commands)
    _add_get(commands)
    _add_query(commands)
    _add_offset(commands)
    _add_topics(commands)
    _add_dlq(commands)
    _add_groups(commands)
    admin_cli.add_status_command(commands, _command, _common, _client)


class _IntermixedParser(CommandParser):
    """``send``'s parser: options may come between the topic and the bodies (``send T -p K=V text``).

    Plain argparse gives the topic and the (empty) bodies their values at the first positional, so a
    body after an option was "unrecognized"; ``parse_known_intermixed_args`` collects them all."""

    _intermixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._intermixing:  # parse_known_intermixed_args calls back here for its two passes
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _add_send(commands: Subcommands) -> None:
    send = _command(commands, "send", "send messages: text arguments, or one message per line of a file",
                    _send)
    send.__class__ = _IntermixedParser
    _topic_arguments(send, positional=True)
    send.add_argument("messages", nargs="*", metavar="MESSAGE", help="message bodies (after the topic)")
    send.add_argument("--file", "-f", metavar="PATH", help="one message per line (empty lines skipped); - = stdin")
    send.add_argument("--tags", help="the TAGS property (what consumers filter on)")
    send.add_argument("--keys", help="KEYS: space-separated keys to find the messages by (mqstore query)")
    send.add_argument("--sharding-key", help="same key, same queue: consumers see those messages in send order")
    send.add_argument("--queue", type=non_negative, metavar="QUEUE_ID", help="send to this queue")
    send.add_argument("--property", "-p", action="append", type=parse_property, default=[], metavar="NAME=VALUE",
                      help="a user property (repeatable)")
    send.add_argument("--delay-level", type=non_negative,
                      help="RocketMQ delay level (1 = 1 s ... 18 = 2 h; a higher level is stored at the last one, "
                           "with a warning, as RocketMQ does); for any other time use a timer property: "
                           "-p TIMER_DELAY_SEC=N, or -p TIMER_DELIVER_MS=<epoch ms> (docs/scheduling.md)")
    send.add_argument("--batch", type=positive, metavar="N",
                      help=f"send N messages per SendBatch call, each call to one queue "
                           f"(at most {MAX_BATCH_MESSAGES}); default: pipelined on one SendStream")
    send.add_argument("--transaction", choices=("commit", "rollback", "unknown"),
                      help="send each message as a transaction (a half), then end it so; unknown leaves it to be "
                           "checked with --producer-group's producers (docs/transactions.md)")
    send.add_argument("--producer-group", default="mqstore-cli", help="the transaction's producer group")
    _common(send)


def _add_pull(commands: Subcommands) -> None:
    pull = _command(commands, "pull", "read messages from a topic's queues (committing with --group)", _pull)
    _topic_arguments(pull, positional=True)
    pull.add_argument("--queue", type=non_negative, action="append", metavar="QUEUE_ID",
                      help="only this queue (repeatable; default every readable queue)")
    pull.add_argument("--offset", type=non_negative,
                      help="start at this queue offset (default: the group's committed offset, else the oldest)")
    pull.add_argument("--latest", action="store_true", help="without a committed offset, start at the newest")
    pull.add_argument("--group", "-g", help="consumer group: start at its offsets and commit what was printed")
    pull.add_argument("--tags", "--subscription", dest="subscription", default="*",
                      help="tag filter: '*' (default) or 'TagA || TagB'")
    pull.add_argument("--max", "-n", type=non_negative, default=32,
                      help="stop after this many messages (default 32; 0 = no limit)")
    pull.add_argument("--wait-ms", type=non_negative, default=0,
                      help="when caught up, wait this long for new messages (default 0: stop at once)")
    pull.add_argument("--follow", "-F", action="store_true", help="keep waiting for new messages (Ctrl-C stops)")
    _common(pull)


def _add_get(commands: Subcommands) -> None:
    get = _command(commands, "get", "show a message by its msg id (UNIQ_KEY) or offset msg id", _get)
    get.add_argument("msg_ids", nargs="+", metavar="MSG_ID")
    get.add_argument("--topic", "-t", help="the topic (narrows a UNIQ_KEY search)")
    get.add_argument("--kind", choices=("offset", "uniq_key"), help="which id it is (default: try both)")
    _common(get)


def _add_query(commands: Subcommands) -> None:
    query = _command(commands, "query", "find messages by key (KEYS or UNIQ_KEY) through the gateway", _query_by_key)
    _topic_arguments(query, positional=True)
    query.add_argument("--key", "-k", help="a key (KEYS) or msg id (UNIQ_KEY)")
    query.add_argument("--begin", type=parse_time, default=0, help="stored at or after (ms, ISO time, or an age: 1h)")
    query.add_argument("--end", type=parse_time, default=0, help="stored at or before (default: no bound)")
    query.add_argument("--max", type=positive, default=32, help="at most this many (default 32, at most 64)")
    _common(query)


def _add_offset(commands: Subcommands) -> None:
    offset = _command(commands, "offset",
                      "queue offsets (min, max), a group's committed offsets and lag, offsets by time", _offset)
    _offset_arguments(offset, nested=False)
    offset.add_argument("--commit", type=str, metavar="OFFSET",
                        help="deprecated: use 'offset commit --to OFFSET' (it does the same)")
    actions = offset.add_subparsers(dest="offset_action", metavar="{show,commit}")
    show = actions.add_parser("show", allow_abbrev=False,
                              help="a group's committed offsets and lag (same as --group without action)")
    show.set_defaults(handler=_handled(_offset), client_parser=show)
    _offset_arguments(show, nested=True)
    commit = actions.add_parser("commit", allow_abbrev=False,
                                help="set a group's committed offset (rewind, skip ahead)")
    commit.set_defaults(handler=_handled(_offset), client_parser=commit)
    _offset_arguments(commit, nested=True)
    commit.add_argument("--to", required=True, metavar="OFFSET",
                        help="the new offset: a number, min, max, or a time (ISO, or an age: 1h) searched per queue")


def _offset_arguments(parser: argparse.ArgumentParser, nested: bool) -> None:
    unset: Any = argparse.SUPPRESS
    parser.add_argument("--topic", "-t", dest="topic_option", metavar="TOPIC", default=unset if nested else None,
                        help="the topic")
    parser.add_argument("--queue", type=non_negative, action="append", default=unset if nested else None,
                        metavar="QUEUE_ID", help="only this queue (repeatable; default every readable queue)")
    parser.add_argument("--group", "-g", default=unset if nested else None,
                        help="also show this consumer group's committed offset and lag")
    parser.add_argument("--time", type=parse_time, default=unset if nested else None,
                        help="also show the offset stored nearest this time (ms, ISO time, or an age: 1h)")
    _common(parser, nested)


def _add_topics(commands: Subcommands) -> None:
    topics = _command(commands, "topics", "list topics; create, update, or show a topic's route", _topics)
    _common(topics)
    actions = topics.add_subparsers(dest="topics_action", metavar="{list,create,update,route,delete}")
    listing = actions.add_parser("list", allow_abbrev=False, help="every topic the token may see (the default)")
    listing.set_defaults(handler=_handled(_topics), client_parser=listing)
    _common(listing, nested=True)
    for name, help_text in (("create", "create a topic on every shard"),
                            ("update", "change a topic's queue counts or permission")):
        sub = actions.add_parser(name, help=help_text, allow_abbrev=False)
        sub.set_defaults(handler=_handled(_topics), client_parser=sub)
        sub.add_argument("name", metavar="TOPIC")
        sub.add_argument("--queues", type=positive, default=8 if name == "create" else None,
                         help="read and write queues" + (" (default 8)" if name == "create" else ""))
        sub.add_argument("--read-queues", type=positive, help="read queues (overrides --queues)")
        sub.add_argument("--write-queues", type=positive, help="write queues (overrides --queues)")
        sub.add_argument("--perm", type=parse_perm, default=6 if name == "create" else None,
                         help="rw, r or w (default rw)" if name == "create" else "rw, r or w")
        _common(sub, nested=True)
    route = actions.add_parser("route", allow_abbrev=False, help="a topic's queues and the shard each lives on")
    route.set_defaults(handler=_handled(_topics), client_parser=route)
    route.add_argument("name", metavar="TOPIC")
    _common(route, nested=True)
    admin_cli.add_topic_delete(actions, _handled, _common, _client)


# -- send ----------------------------------------------------------------------------------------------


def _send(args: argparse.Namespace) -> int:
    messages: list[str] = list(args.messages)
    topic = args.topic_option or args.topic
    if args.topic_option and args.topic:
        # ``send --topic T text``: the first positional is a message, not the topic.
        messages.insert(0, args.topic)
        topic = args.topic_option
    if not topic:
        raise UsageError("give the topic: mqstore send TOPIC MESSAGE (or --topic TOPIC)")
    if args.file is not None and messages:
        raise UsageError("give message text or --file, not both")
    if args.file is None and not messages:
        raise UsageError("give the message text, or --file PATH (- reads stdin)")
    if args.queue is not None and args.sharding_key:
        raise UsageError("give --queue or --sharding-key, not both")
    if args.batch is not None and args.batch > MAX_BATCH_MESSAGES:
        raise UsageError(f"--batch is at most {MAX_BATCH_MESSAGES}")
    template = dict(tags=args.tags, keys=args.keys, properties=dict(args.property) or None)
    printer = Printer(args.json)
    if args.transaction is not None:
        return _send_transactions(args, topic, messages, template, printer)
    with Producer(args.gateway, args.token, timeout=args.timeout, tls=_tls(args)) as producer:
        if args.file is None:
            if args.batch is not None:
                receipts = producer.send_batch(topic, [OutgoingMessage(body=text, delay_level=args.delay_level,
                                                                       **template) for text in messages],
                                               sharding_key=args.sharding_key, queue_id=args.queue)
            else:
                receipts = [producer.send_message(OutgoingMessage(
                    body=text, topic=topic, sharding_key=args.sharding_key, queue_id=args.queue,
                    delay_level=args.delay_level, **template)) for text in messages]
            _print_receipts(printer, receipts)
            _warn_clamped_delay(args.delay_level, receipts)
            return _status_exit(receipts)
        return _send_file(args, producer, topic, template, printer)


def _send_transactions(args: argparse.Namespace, topic: str, messages: list[str], template: dict[str, Any],
                       printer: Printer) -> int:
    """``send --transaction``: a half per message, ended with the state asked for."""
    if args.file is not None or args.batch is not None or args.delay_level is not None:
        raise UsageError("--transaction sends message text one at a time: not with --file, --batch or --delay-level")
    state = TransactionState[args.transaction.upper()]
    with TransactionProducer(args.producer_group, lambda message, arg: state, address=args.gateway,
                             token=args.token, timeout=args.timeout, tls=_tls(args)) as producer:
        results = [producer.send(topic, text, sharding_key=args.sharding_key, queue_id=args.queue, **template)
                   for text in messages]
    if printer.json_mode:
        for r in results:
            printer.json({"transaction_id": r.transaction_id, "half_offset_msg_id": r.half.offset_msg_id,
                          "state": r.state.name, "applied": r.applied,
                          "committed": r.committed.to_json() if r.committed else None})
    else:
        printer.table(("transaction_id", "state", "applied", "queue", "offset", "half_offset_msg_id"),
                      [(r.transaction_id, r.state.name, r.applied, r.committed.queue_id if r.committed else "",
                        r.committed.queue_offset if r.committed else "", r.half.offset_msg_id) for r in results])
    return EXIT_OK


def _warn_clamped_delay(delay_level: int | None, receipts: Sequence[SendReceipt]) -> None:
    """A delay level beyond the store's last is stored at the last level, as RocketMQ's broker does; say
    so, or ``--delay-level 99`` reads as accepted. The level a message was parked at is its queue id + 1
    in SCHEDULE_TOPIC_XXXX, so the answer says it, whatever the store's messageDelayLevel holds."""
    if not delay_level:
        return
    parked = {r.queue_id + 1 for r in receipts if r.topic == SCHEDULE_TOPIC}
    if parked and max(parked) < delay_level:
        print(f"{PROG}: warning: --delay-level {delay_level} is beyond the store's last delay level "
              f"{max(parked)}: stored at level {max(parked)}, as RocketMQ does", file=sys.stderr, flush=True)


def _status_exit(receipts: Sequence[SendReceipt]) -> int:
    """Exit 1 when a message was stored without PUT_OK (e.g. FLUSH_DISK_TIMEOUT: written, not yet flushed)."""
    statuses = sorted({r.status for r in receipts if not r.ok})
    if not statuses:
        return EXIT_OK
    count = sum(not r.ok for r in receipts)
    _error(f"{count} message{'s' if count != 1 else ''} stored with status {', '.join(statuses)}, not PUT_OK")
    return EXIT_ERROR


def _print_receipts(printer: Printer, receipts: Sequence[SendReceipt]) -> None:
    if printer.json_mode:
        for receipt in receipts:
            printer.json(receipt.to_json())
        return
    headers: tuple[str, ...] = ("uniq_key", "queue", "offset", "status", "offset_msg_id", "shard")
    rows: list[Sequence[Any]] = [(r.uniq_key, r.queue_id, r.queue_offset, r.status, r.offset_msg_id, r.shard)
                                 for r in receipts]
    if any(r.topic in PARKING_TOPICS for r in receipts):
        # A delayed or timer message is stored in a parking topic until due, and queue/offset are that
        # topic's: say so, or "queue 1" reads as a queue of the topic sent to.
        headers += ("parked_in",)
        rows = [(*row, r.topic if r.topic in PARKING_TOPICS else "") for row, r in zip(rows, receipts, strict=True)]
    printer.table(headers, rows)


def _send_file(args: argparse.Namespace, producer: Producer, topic: str, template: dict[str, Any],
               printer: Printer) -> int:
    """Lines of a file (bytes as they are, without the newline) as messages, with a progress bar."""
    source: BinaryIO = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    total = None if args.file == "-" else _count_lines(args.file)
    per_queue: dict[int, list[int]] = {}
    not_ok = 0
    with source, Progress(total=total, desc=f"send {topic}", unit="msg", quiet=args.quiet) as bar:
        bodies = (line for line in _lines(source))
        if args.batch is not None:
            receipts: Iterator[SendReceipt] = _batched_receipts(producer, topic, bodies, args, template)
        else:
            items = (OutgoingMessage(body=body, topic=topic, delay_level=args.delay_level, **template)
                     for body in bodies)
            receipts = producer.send_stream(items, topic, sharding_key=args.sharding_key, queue_id=args.queue)
        clamped: list[SendReceipt] = []
        try:
            for receipt in receipts:
                bar.update()
                not_ok += not receipt.ok
                if not clamped and receipt.topic == SCHEDULE_TOPIC:
                    clamped.append(receipt)
                if printer.json_mode:
                    printer.json(receipt.to_json())
                else:
                    offsets = per_queue.setdefault(receipt.queue_id, [receipt.queue_offset, receipt.queue_offset, 0])
                    offsets[1] = receipt.queue_offset
                    offsets[2] += 1
        finally:
            bar.close()
            if not args.quiet:
                rate = f" ({bar.rate:,.0f} msg/s)" if bar.elapsed > 0 and bar.count else ""
                printer.note(f"sent {bar.count} message{'s' if bar.count != 1 else ''} to {topic} in "
                             f"{bar.elapsed:.2f} s{rate}" + (f", {not_ok} not PUT_OK" if not_ok else ""))
    _warn_clamped_delay(args.delay_level, clamped)
    if not printer.json_mode and per_queue:
        printer.table(("queue", "messages", "first_offset", "last_offset"),
                      [(q, c, first, last) for q, (first, last, c) in sorted(per_queue.items())])
    if not_ok:
        _error(f"{not_ok} message{'s' if not_ok != 1 else ''} stored without PUT_OK (--json shows each status)")
        return EXIT_ERROR
    return EXIT_OK


def _batched_receipts(producer: Producer, topic: str, bodies: Iterator[bytes], args: argparse.Namespace,
                      template: dict[str, Any]) -> Iterator[SendReceipt]:
    chunk: list[OutgoingMessage] = []
    for body in bodies:
        chunk.append(OutgoingMessage(body=body, delay_level=args.delay_level, **template))
        if len(chunk) >= args.batch:
            yield from producer.send_batch(topic, chunk, sharding_key=args.sharding_key, queue_id=args.queue)
            chunk = []
    if chunk:
        yield from producer.send_batch(topic, chunk, sharding_key=args.sharding_key, queue_id=args.queue)


def _lines(source: BinaryIO) -> Iterator[bytes]:
    for line in source:
        body = line.rstrip(b"\r\n")
        if body:
            yield body


def _count_lines(path: str) -> int | None:
    """Non-empty lines of a regular file, for the bar's total (None for pipes and devices)."""
    if not os.path.isfile(path):
        return None
    count = 0
    with open(path, "rb") as f:
        for line in f:
            count += bool(line.rstrip(b"\r\n"))
    return count


# -- pull ----------------------------------------------------------------------------------------------


class MessageRows:
    """Messages as table rows printed as they arrive (``pull --follow``): the first batch fixes the
    column widths, so later rows line up without holding everything in memory."""

    def __init__(self, printer: Printer) -> None:
        self.printer = printer
        self.widths: list[int] | None = None

    @staticmethod
    def row(m: Message) -> list[str]:
        return [str(m.queue_id), str(m.queue_offset), cell(m.uniq_key or None), m.offset_msg_id,
                cell(m.tags or None, 24), cell(" ".join(m.keys) or None, 32), timestamp(m.store_timestamp),
                cell(m.text, MAX_CELL)]

    def write(self, messages: Sequence[Message]) -> None:
        if self.printer.json_mode:
            for m in messages:
                self.printer.json(m.to_json())
        elif messages:
            rows = [self.row(m) for m in messages]
            if self.widths is None:
                self.widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(MESSAGE_COLUMNS)]
                self.printer.lines([_fixed([h.upper() for h in MESSAGE_COLUMNS], self.widths, header=True)])
            self.printer.lines(_fixed(r, self.widths) for r in rows)
        self.printer.flush()


def _fixed(row: Sequence[str], widths: Sequence[int], header: bool = False) -> str:
    """Queue and offset right-aligned like numbers, the rest left-aligned."""
    parts = [v.rjust(w) if i < 2 and not header else v.ljust(w)
             for i, (v, w) in enumerate(zip(row, widths, strict=True))]
    return "  ".join(parts).rstrip()


def _pull(args: argparse.Namespace) -> int:
    topic = _topic(args)
    if args.offset is not None and args.latest:
        raise UsageError("give --offset or --latest, not both")
    printer = Printer(args.json)
    rows = MessageRows(printer)
    limit = args.max or None
    printed = 0
    if args.follow:
        _interrupt_on_sigterm()
    with Client(args.gateway, args.token, timeout=args.timeout, tls=_tls(args)) as client:
        queue_ids = args.queue or client.route(topic).readable_queue_ids
        starts = {q: args.offset for q in queue_ids} if args.offset is not None else None
        consumer = PullConsumer(args.group, topic, connection=client.connection, queue_ids=queue_ids,
                                subscription=args.subscription, from_latest=args.latest, start_offsets=starts,
                                batch_size=min(limit or PULL_BATCH, PULL_BATCH), timeout=args.timeout)
        try:
            while limit is None or printed < limit:
                want = min(limit - printed, 1024) if limit is not None else 1024
                if args.follow:
                    messages = consumer.poll(want, timeout=DEFAULT_LONG_POLL_MS / 1000)
                else:
                    messages = consumer.poll(want, timeout=0)
                    if not messages and _caught_up(consumer) and args.wait_ms:
                        messages = consumer.poll(want, timeout=args.wait_ms / 1000)
                    if not messages and _caught_up(consumer):
                        break
                rows.write(messages)
                printed += len(messages)
        finally:
            consumer.close()
    if not printed and not args.json and not args.quiet:
        printer.note(f"no messages in {topic} from the starting offsets")
    return EXIT_OK


def _interrupt_on_sigterm() -> None:
    """``kill`` stops ``pull --follow`` like Ctrl-C does: the group's offsets are committed first."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not the main thread (an embedding program): leave it be
        signal.signal(signal.SIGTERM, interrupt)


def _caught_up(consumer: PullConsumer) -> bool:
    """Every queue pulled up to its max offset (filtered-out messages count as read)."""
    return not any(consumer.lag().values())


# -- get, query ----------------------------------------------------------------------------------------


def _message_record(m: Message) -> list[tuple[str, Any]]:
    properties = ", ".join(f"{k}={v}" for k, v in sorted(m.properties.items()))
    return [("topic", m.topic), ("queue", m.queue_id), ("queue offset", m.queue_offset),
            ("uniq key", m.uniq_key or None), ("offset msg id", m.offset_msg_id), ("tags", m.tags or None),
            ("keys", " ".join(m.keys) or None),
            ("properties", properties or None), ("born", f"{timestamp(m.born_timestamp)} from {m.born_host}"),
            ("stored", f"{timestamp(m.store_timestamp)} on {m.store_host}"),
            ("commitlog offset", m.commitlog_offset), ("store size", m.store_size),
            ("reconsume times", m.reconsume_times),
            ("body", f"({len(m.body)} bytes{', compressed' if m.body_compressed else ''}) {cell(m.text, 0)}")]


def _get(args: argparse.Namespace) -> int:
    printer = Printer(args.json)
    failures = 0
    with _client(args) as client:
        for i, msg_id in enumerate(args.msg_ids):
            try:
                message = client.get_message(msg_id, topic=args.topic, kind=args.kind)
            except MqstoreError as exc:
                if len(args.msg_ids) == 1:
                    raise
                _error(f"{exc.code}: {exc.message}")
                failures += 1
                continue
            if printer.json_mode:
                printer.json(message.to_json())
            else:
                if i:
                    printer.lines([""])
                printer.lines(format_record(_message_record(message)))
    return EXIT_ERROR if failures else EXIT_OK


def _query_by_key(args: argparse.Namespace) -> int:
    topic = _topic(args)
    if not args.key:
        raise UsageError("give the key to find (--key KEY)")
    if args.end and args.begin > args.end:
        raise UsageError("--begin is after --end")
    printer = Printer(args.json)
    with _client(args) as client:
        result = client.query(topic, args.key, begin_ms=args.begin, end_ms=args.end, max_num=min(args.max, 64))
    MessageRows(printer).write(result.messages)
    if not args.json and not args.quiet:
        if not result.messages:
            printer.note(f"no message of {topic} has key {args.key!r} in that time range")
        elif result.maybe_more:
            printer.note(f"{result.index_hits} index hits: older matches may exist (narrow --begin/--end)")
    return EXIT_OK


# -- offset --------------------------------------------------------------------------------------------


def _offset(args: argparse.Namespace) -> int:
    topic = _topic(args)
    action = args.offset_action or ("commit" if args.commit is not None else "show")
    if args.offset_action is None and args.commit is not None:
        print(f"{PROG}: warning: 'offset --commit' is deprecated: use 'offset commit --to {args.commit}'",
              file=sys.stderr, flush=True)
    target: str | None = getattr(args, "to", None) if args.offset_action == "commit" else args.commit
    if action == "commit" and not args.group:
        raise UsageError("committing an offset needs --group")
    if args.offset_action == "show" and not args.group:
        raise UsageError("offset show needs --group")
    printer = Printer(args.json)
    with _client(args) as client:
        queue_ids: list[int] = args.queue or client.route(topic).readable_queue_ids
        ranges = client.all_queue_offsets(topic, queue_ids)
        if action == "commit":
            assert target is not None
            return _commit_offsets(client, printer, args.group, topic, ranges, target)
        committed = client.committed_offsets(args.group, topic, queue_ids) if args.group else {}
        at_time = {q: client.search_offset(topic, q, args.time) for q in queue_ids} if args.time is not None else {}
    rows: list[dict[str, Any]] = []
    for r in ranges:
        row: dict[str, Any] = r.to_json()
        if args.group:
            known = committed.get(r.queue_id)
            row.update(group=args.group, committed_offset=known,
                       lag=None if known is None else max(r.max_offset - known, 0))
        if args.time is not None:
            row.update(time=args.time, offset_at_time=at_time[r.queue_id])
        rows.append(row)
    if printer.json_mode:
        for row in rows:
            printer.json(row)
        return EXIT_OK
    headers = ["queue", "min", "max"]
    keys = ["queue_id", "min_offset", "max_offset"]
    if args.group:
        headers += ["committed", "lag"]
        keys += ["committed_offset", "lag"]
    if args.time is not None:
        headers.append(f"offset at {timestamp(args.time)}")
        keys.append("offset_at_time")
    printer.table(headers, [[row[k] for k in keys] for row in rows])
    return EXIT_OK


def _commit_offsets(client: Client, printer: Printer, group: str, topic: str, ranges: Sequence[Any],
                    target: str) -> int:
    """Sets the group's offset of each queue to a number, min, max or the offset nearest a time."""
    def resolve(r: Any) -> int:
        if target == "min":
            return int(r.min_offset)
        if target == "max":
            return int(r.max_offset)
        if re.fullmatch(r"\d+", target) and len(target) < 12:
            return int(target)
        try:
            moment = parse_time(target)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--to/--commit: {exc} (or a queue offset, min, max)") from None
        return client.search_offset(topic, r.queue_id, moment)

    new = {r.queue_id: resolve(r) for r in ranges}
    old = client.committed_offsets(group, topic, list(new))
    for q, offset in new.items():
        client.commit_offset(group, topic, q, offset)
    if printer.json_mode:
        for q, offset in new.items():
            printer.json({"group": group, "topic": topic, "queue_id": q, "previous_offset": old.get(q),
                          "committed_offset": offset})
    else:
        printer.table(("queue", "previous", "committed"), [(q, old.get(q), offset) for q, offset in new.items()])
    return EXIT_OK


# -- topics --------------------------------------------------------------------------------------------


def _topics(args: argparse.Namespace) -> int:
    action = args.topics_action or "list"
    printer = Printer(args.json)
    with _client(args) as client:
        if action == "list":
            configs = client.topics()
            if printer.json_mode:
                for config in configs:
                    printer.json(config.to_json())
            else:
                printer.table(("topic", "read_queues", "write_queues", "perm"),
                              [(c.topic, c.read_queue_nums, c.write_queue_nums, perm_text(c.perm)) for c in configs],
                              empty="no topics")
            return EXIT_OK
        if action == "route":
            route = client.route(args.name)
            if printer.json_mode:
                for q in route.queues:
                    printer.json({"topic": route.topic, **q.to_json()})
            else:
                printer.table(("queue", "shard", "shard_queue", "readable", "writable"),
                              [(q.queue_id, q.shard, q.shard_queue_id, q.readable, q.writable) for q in route.queues])
            return EXIT_OK
        if action == "create":
            config = client.create_topic(args.name, args.queues, read_queues=args.read_queues,
                                         write_queues=args.write_queues, perm=args.perm)
        else:
            if args.queues is None and args.read_queues is None and args.write_queues is None and args.perm is None:
                raise UsageError("give what to change: --queues, --read-queues, --write-queues or --perm")
            config = client.update_topic(args.name, queues=args.queues, read_queues=args.read_queues,
                                         write_queues=args.write_queues, perm=args.perm)
    if printer.json_mode:
        printer.json(config.to_json())
    else:
        printer.table(("topic", "read_queues", "write_queues", "perm"),
                      [(config.topic, config.read_queue_nums, config.write_queue_nums, perm_text(config.perm))])
    return EXIT_OK


# -- dlq (a consumer group's dead letters, %DLQ%<group>) ------------------------------------------------


def _add_dlq(commands: Subcommands) -> None:
    dlq = _command(commands, "dlq", "a consumer group's dead letters: list, show, re-send to the original topic",
                       _dlq)
    _common(dlq)
    actions = dlq.add_subparsers(dest="dlq_action", metavar="{list,show,resend}")
    for name, help_text in (("list", "the group's dead letters, oldest first (the default)"),
                            ("show", "dead letters by offset msg id or msg id (UNIQ_KEY)"),
                            ("resend", "send dead letters again to their original topic (RETRY_TOPIC)")):
        sub = actions.add_parser(name, help=help_text, allow_abbrev=False)
        sub.set_defaults(handler=_handled(_dlq), client_parser=sub)
        # The group is positional as in ``mqstore groups G`` (``dlq list G``, ``dlq show G MSG_ID``);
        # --group still works, and then every positional of show/resend is a msg id.
        sub.add_argument("--group", "-g", dest="group_option", metavar="GROUP", help="the consumer group")
        if name == "list":
            sub.add_argument("group", nargs="?", help="the consumer group (or --group)")
            sub.add_argument("--max", type=positive, default=64, help="at most this many (default 64)")
        else:
            sub.add_argument("ids", nargs="+", metavar="[GROUP] MSG_ID")
        _common(sub, nested=True)


def _dlq_group(args: argparse.Namespace, action: str) -> tuple[str, list[str]]:
    """The group and the msg ids of a dlq action, the group given as the first positional or --group."""
    positional: list[str] = [args.group] if action == "list" and args.group else list(getattr(args, "ids", []))
    if args.group_option:
        if action == "list" and positional and positional[0] != args.group_option:
            raise UsageError(f"two groups given ({positional[0]!r} and --group {args.group_option!r})")
        return args.group_option, [] if action == "list" else positional
    if not positional:
        raise UsageError(f"give the group: mqstore dlq {action} GROUP" + ("" if action == "list" else " MSG_ID"))
    if action != "list" and len(positional) < 2:
        raise UsageError(f"give the group and at least one msg id: mqstore dlq {action} GROUP MSG_ID...")
    return positional[0], positional[1:]


def _dlq(args: argparse.Namespace) -> int:
    action = getattr(args, "dlq_action", None)
    if action is None:
        raise UsageError("give an action: list, show or resend (mqstore dlq list GROUP)")
    group, msg_ids = _dlq_group(args, action)
    printer = Printer(args.json)
    with _client(args) as client:
        if action == "list":
            letters = list_dead_letters(client, group, args.max)
            if printer.json_mode:
                for m in letters:
                    printer.json(m.to_json())
            else:
                printer.table(("queue_offset", "offset_msg_id", "uniq_key", "original_topic", "reconsume", "body"),
                              [(m.queue_offset, m.offset_msg_id, m.uniq_key, m.properties.get("RETRY_TOPIC", ""),
                                m.reconsume_times, cell(m.text, 40)) for m in letters],
                              empty=f"no dead letters for group {group}")
            return EXIT_OK
        for i, msg_id in enumerate(msg_ids):
            if action == "show":
                message = show_dead_letter(client, group, msg_id)
                if printer.json_mode:
                    printer.json(message.to_json())
                else:
                    if i:
                        printer.lines([""])
                    printer.lines(format_record(_message_record(message)))
            else:
                receipt = resend_dead_letter(client, group, msg_id)
                if printer.json_mode:
                    printer.json({"dead_letter": msg_id, **receipt.to_json()})
                else:
                    printer.table(("dead_letter", "topic", "queue", "queue_offset", "uniq_key", "status"),
                                  [(msg_id, receipt.topic, receipt.queue_id, receipt.queue_offset, receipt.uniq_key,
                                    receipt.status)])
    return EXIT_OK


# -- groups (members, their queues, lag; docs/consumer-groups.md) ----------------------------------------


def _add_groups(commands: Subcommands) -> None:
    groups = _command(commands, "groups", "consumer groups: members, the queues each consumes, lag per queue "
                      "(max offset - committed offset)", _groups)
    groups.add_argument("group", nargs="?", help="one group (default: every group with members or offsets)")
    _common(groups)


def _groups(args: argparse.Namespace) -> int:
    printer = Printer(args.json)
    with _client(args) as client:
        described = describe_groups(client, args.group)
    if printer.json_mode:
        for info in described:
            printer.json(info.to_json())
        return EXIT_OK
    rows: list[Sequence[Any]] = []
    for info in described:
        rows += [(info.group, q.topic, q.queue_id, q.shard, q.max_offset,
                  q.committed_offset if q.committed_offset >= 0 else "-", q.lag, q.owner or "-") for q in info.queues]
        held = {q.owner for q in info.queues}
        rows += [(info.group, "-", "-", "-", "-", "-", "-", m.client_id) for m in info.members
                 if m.client_id not in held]
    printer.table(("group", "topic", "queue", "shard", "max_offset", "committed", "lag", "member"), rows,
                  empty=f"group {args.group} has no members and no committed offsets" if args.group
                  else "no consumer groups")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """The client commands alone (``python -m mqstore.client.cli``); ``mqstore`` has them too."""
    parser = CommandParser(prog=PROG, description=__doc__)
    admin_cli.add_version_option(parser)
    add_client_commands(cast(Subcommands, parser.add_subparsers(dest="command", required=True)))
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
