"""The RocketMQ 5 servicer's background work for consumers, in every gateway process.

- :class:`DeadLetterMover`: messages delivered the group's max attempts and visible again go to
  %DLQ%<group> (mqstore's ConsumerSendBack with delay level -1) and count as acked, whether or not a
  consumer of the group is online (RocketMQ's broker revives pop checkpoints itself). Each shard's
  query service hands every such message to one claimer at a time (ClaimExhausted), so two gateway
  processes never dead-letter the same message; a claimer that fails leaves it to the next claim.
- :func:`renew_receipts`: the auto renewal of push consumers' receipts (inflight.Renewals).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from gateway.auth import Principal
from gateway.rocketmq5.inflight import BadReceiptHandle, Renewals
from gateway.rocketmq5.local_call import LocalContext, MqstoreCallError, call
from gateway.rocketmq5.store_pop import StorePop
from gateway.send_back import MAX_RECONSUME_TIMES_LIMIT
from mqstore.v1 import gateway_pb2

if TYPE_CHECKING:
    from gateway.servicer import MessagingServicer

log = logging.getLogger("gateway.rocketmq5")

DEAD_LETTER_INTERVAL_S = 1.0
#: How long a claimed message stays invisible while its claimer dead-letters it.
CLAIM_MS = 30_000
CALL_TIMEOUT_S = 10.0
RENEW_PERIOD_S = 0.5
#: The gateway itself: dead letters are its own doing, whatever the consumers' tokens.
SERVER = Principal("gateway (RocketMQ 5 dead letters)", admin=True)


class DeadLetterMover:
    def __init__(self, mq: MessagingServicer, pop: StorePop, max_attempts: int,
                 interval_s: float = DEAD_LETTER_INTERVAL_S) -> None:
        self.mq = mq
        self.pop = pop
        self.max_attempts = max_attempts
        self.interval_s = interval_s
        self.moved = 0
        self._failing: set[int] = set()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.once()

    async def once(self) -> int:
        """One round over the shards; how many messages it moved."""
        moved = 0
        for shard in self.mq.shards:
            try:
                claimed = await self.pop.claim_exhausted(shard, self.max_attempts, CLAIM_MS, CALL_TIMEOUT_S)
            except MqstoreCallError as exc:
                if shard.index not in self._failing:  # once per outage, not every second
                    log.warning("looking for exhausted RocketMQ 5 messages on %s: %s", shard.name, exc)
                    self._failing.add(shard.index)
                continue
            self._failing.discard(shard.index)
            for message in claimed.messages:
                ref = message.ref
                send_back = gateway_pb2.ConsumerSendBackRequest(  # RECONSUME_TIMES: the deliveries
                    group=ref.consumer_group, msg_id=message.msg_id, delay_level=-1, topic=ref.topic,
                    reconsume_times=min(message.reconsume_times + message.attempts, MAX_RECONSUME_TIMES_LIMIT))
                try:
                    await call(self.mq.ConsumerSendBack, send_back, LocalContext((), "", CALL_TIMEOUT_S, SERVER))
                    await self.pop.ack_claimed(shard, ref, CALL_TIMEOUT_S)
                except MqstoreCallError as exc:
                    log.warning("moving %s (%s/%d offset %d) of group %s to its dead-letter topic: %s (tried "
                                "again in %d s)", message.msg_id, ref.topic, ref.queue_id, ref.queue_offset,
                                ref.consumer_group, exc, CLAIM_MS // 1000)
                    continue
                moved += 1
                log.info("moved %s (%s/%d offset %d) to %%DLQ%%%s after %d delivery attempts", message.msg_id,
                         ref.topic, ref.queue_id, ref.queue_offset, ref.consumer_group, message.attempts)
        self.moved += moved
        return moved


async def renew_receipts(renewals: Renewals, pop: StorePop, period_s: float = RENEW_PERIOD_S) -> None:
    """Extend each due receipt by its invisible duration, keeping its version (the handle the client
    holds stays valid). A receipt acked or delivered again meanwhile (through any process) is forgotten."""
    while True:
        await asyncio.sleep(period_s)
        for renewal in renewals.due():
            try:
                answer = await pop.change_invisible(renewal.caller.renewed(CALL_TIMEOUT_S), renewal.group,
                                                    renewal.topic, renewal.receipt, int(renewal.invisible_s * 1000),
                                                    renew=True)
            except BadReceiptHandle:
                renewals.forget(renewal.handle)
                continue
            except MqstoreCallError as exc:
                log.warning("renewing %s of group %s: %s (tried again)", renewal.handle, renewal.group, exc)
                continue
            renewal.visible_at = answer.visible_at_ms / 1000
