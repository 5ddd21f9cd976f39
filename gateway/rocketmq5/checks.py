"""Transaction check-backs for RocketMQ 5 producers: mqstore's checks of unended halves, relayed as the
protocol's RecoverOrphanedTransactionCommand on the producers' telemetry streams.

Half messages sent over the v2 protocol all have the producer group V2_PRODUCER_GROUP (its clients name
none). While at least one v2 producer is connected to this gateway process, the relay keeps mqstore's
TransactionChecks stream of that group open (in process) and hands each check to a producer that
publishes the half's topic (else to any producer): its TransactionChecker answers with EndTransaction
(source SERVER_CHECK). A check no producer takes is left to mqstore, which checks again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from mqstore.apache.rocketmq.v2 import service_pb2
from mqstore.gateway.rocketmq5.local_call import LocalContext
from mqstore.gateway.rocketmq5.messages import V2_PRODUCER_GROUP, check_message
from mqstore.v1 import transaction_pb2

if TYPE_CHECKING:
    from mqstore.gateway.servicer import MessagingServicer

log = logging.getLogger("mqstore.gateway.rocketmq5")
RECONNECT_S = 1.0
Outbox = asyncio.Queue[Any]


class CheckRelay:
    def __init__(self, mq: MessagingServicer) -> None:
        self.mq = mq
        self._producers: dict[Outbox, tuple[set[str], LocalContext]] = {}
        self._task: asyncio.Task[None] | None = None
        self._next = 0

    def join(self, outbox: Outbox, topics: set[str], context: LocalContext) -> None:
        self._producers[outbox] = (topics, context)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._relay(), name="rocketmq5-checks")

    def leave(self, outbox: Outbox) -> None:
        self._producers.pop(outbox, None)
        if not self._producers and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _relay(self) -> None:
        while self._producers:
            context = next(iter(self._producers.values()))[1]
            try:
                async for check in self.mq.TransactionChecks(self._requests(), context):  # type: ignore[arg-type]
                    self._hand_out(check)
                if context.code is not None:
                    log.warning("transaction checks of v2 producers: %s %s", context.code.name, context.details)
            except Exception:  # noqa: BLE001 - the relay must outlive one broken stream
                log.exception("transaction checks of v2 producers broke; reopening")
            await asyncio.sleep(RECONNECT_S)

    @staticmethod
    async def _requests() -> AsyncIterator[transaction_pb2.TransactionCheckStreamRequest]:
        yield transaction_pb2.TransactionCheckStreamRequest(producer_group=V2_PRODUCER_GROUP)
        await asyncio.Event().wait()  # answers come as EndTransaction calls, not on this stream

    def _hand_out(self, check: transaction_pb2.TransactionCheck) -> None:
        outboxes = list(self._producers)
        if not outboxes:
            return
        publishing = [o for o in outboxes if check.message.topic in self._producers[o][0]] or outboxes
        self._next += 1
        outbox = publishing[self._next % len(publishing)]
        command = service_pb2.RecoverOrphanedTransactionCommand(message=check_message(check),
                                                                transaction_id=check.offset_msg_id)
        with contextlib.suppress(asyncio.QueueFull):
            outbox.put_nowait(service_pb2.TelemetryCommand(recover_orphaned_transaction_command=command))
