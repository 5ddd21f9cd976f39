"""Transaction check-backs for RocketMQ 5 producers: mqstore's checks of unended halves, relayed as the
protocol's RecoverOrphanedTransactionCommand on the producers' telemetry streams.

Half messages sent over the v2 protocol all have the producer group V2_PRODUCER_GROUP (its clients name
none). Each connected v2 producer is a receiver of that group's checks (gateway/transaction_relay.py) for
the topics its settings publish and its token may produce to: a check goes only to a producer of the
half's topic, and its TransactionChecker answers with EndTransaction (source SERVER_CHECK). With no
such producer connected the half is not checked and waits for the next round: another application's
checker never decides it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from apache.rocketmq.v2 import service_pb2
from gateway.auth import Action, AuthError
from gateway.rocketmq5.local_call import LocalContext
from gateway.rocketmq5.messages import V2_PRODUCER_GROUP, check_message
from gateway.transaction_relay import CheckReceiver
from mqstore.v1 import transaction_pb2

if TYPE_CHECKING:
    from gateway.servicer import MessagingServicer

log = logging.getLogger("gateway.rocketmq5")
Outbox = asyncio.Queue[Any]


class CheckRelay:
    def __init__(self, mq: MessagingServicer) -> None:
        self.mq = mq
        self._receivers: dict[Outbox, CheckReceiver] = {}

    def join(self, outbox: Outbox, topics: set[str], context: LocalContext) -> None:
        """The producer on ``outbox`` publishes ``topics`` (its latest settings): it is asked about the
        halves of those its token may produce to."""
        self.leave(outbox)
        try:
            # the v1 servicer's one token check (a LocalContext stands in for the servicer context)
            principal = self.mq._principal(context)  # type: ignore[arg-type]  # noqa: SLF001
        except AuthError:
            return
        allowed = tuple(sorted(t for t in topics if principal.may(Action.PRODUCE, t)))
        if not allowed:
            return

        def deliver(check: transaction_pb2.TransactionCheck) -> None:
            command = service_pb2.RecoverOrphanedTransactionCommand(message=check_message(check),
                                                                    transaction_id=check.offset_msg_id)
            with contextlib.suppress(asyncio.QueueFull):
                outbox.put_nowait(service_pb2.TelemetryCommand(recover_orphaned_transaction_command=command))

        receiver = CheckReceiver(allowed, frozenset(allowed).__contains__, deliver)
        self._receivers[outbox] = receiver
        self.mq.transactions.join(V2_PRODUCER_GROUP, receiver)

    def leave(self, outbox: Outbox) -> None:
        receiver = self._receivers.pop(outbox, None)
        if receiver is not None:
            self.mq.transactions.leave(V2_PRODUCER_GROUP, receiver)
