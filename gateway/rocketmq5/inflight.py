"""Receive with an invisible duration (RocketMQ 5's pop consumption) on top of mqstore's consumer offsets.

For each (consumer group, topic, queue) the gateway keeps a :class:`QueueLease`: the next queue offset
to hand out and the messages handed out and not yet acked (in flight), each with the time it becomes
visible again and a serial that changes on every hand-out. The group's committed consumer offset is
the lowest offset still in flight (or the next one when none is): everything below it was acked (or
filtered out), so a restart of the gateway hands out again only what was not acked (at least once).

Receipt handles encode the queue, the queue offset and the serial ("<queue>.<offset>.<serial>"): an ack
or a change of invisible duration with the handle of an earlier hand-out of the same message (one that
was handed out again after it became visible) is refused as an invalid receipt handle, as RocketMQ does.

FIFO: a message with a message group (__SHARDINGKEY) is not handed out while an earlier message of the
same group in the same queue is in flight: one group is consumed in order.

This state lives in the gateway process (one per worker with --workers N: see docs/rocketmq5.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

#: RocketMQ's default maximum delivery attempts of a consumer group (its retry policy's max_attempts).
DEFAULT_MAX_DELIVERY_ATTEMPTS = 16


class BadReceiptHandle(ValueError):
    """A receipt handle that is malformed, of another queue's messages, or of an earlier hand-out."""


@dataclasses.dataclass(slots=True, frozen=True)
class Receipt:
    queue_id: int
    offset: int
    serial: int

    def encode(self) -> str:
        return f"{self.queue_id}.{self.offset}.{self.serial}"

    @staticmethod
    def decode(handle: str) -> Receipt:
        try:
            queue_id, offset, serial = (int(part) for part in handle.split("."))
        except ValueError:
            raise BadReceiptHandle(f"receipt handle {handle!r} is not one this gateway handed out "
                                   "(<queue>.<offset>.<serial>)") from None
        return Receipt(queue_id, offset, serial)


@dataclasses.dataclass(slots=True)
class Delivery:
    """A message in flight: handed out, not acked."""

    message: Any  # mqstore.v1 StoredMessage
    visible_at: float
    serial: int
    attempts: int
    group_key: str | None


class QueueLease:
    """The hand-out state of one queue for one consumer group (see the module's docstring)."""

    def __init__(self, queue_id: int, next_offset: int) -> None:
        self.queue_id = queue_id
        self.next_offset = next_offset
        self.inflight: dict[int, Delivery] = {}
        self.lock = asyncio.Lock()
        #: The offset last committed for the group (None: not yet in this process).
        self.stored_offset: int | None = None
        #: When it was last committed (time.monotonic()).
        self.committed_at = 0.0
        #: The last look stopped at a FIFO message whose group has an earlier one in flight.
        self.fifo_blocked = False
        self._serial = 0

    @property
    def committed(self) -> int:
        return min(self.inflight, default=self.next_offset)

    def _new_serial(self) -> int:
        self._serial += 1
        return self._serial

    def expired(self, now: float) -> list[tuple[int, Delivery]]:
        """In-flight messages visible again, lowest offset first."""
        return sorted(((o, d) for o, d in self.inflight.items() if d.visible_at <= now), key=lambda x: x[0])

    def blocked(self, group_key: str | None, offset: int) -> bool:
        """True when an earlier message of this FIFO group is in flight (and not visible again)."""
        if group_key is None:
            return False
        return any(d.group_key == group_key and o < offset for o, d in self.inflight.items())

    def hand_out(self, offset: int, message: Any, invisible_s: float, group_key: str | None) -> tuple[Receipt, int]:
        """Hand out a message (again, when it is in flight and visible); its receipt and attempt count."""
        previous = self.inflight.get(offset)
        attempts = 1 if previous is None else previous.attempts + 1
        serial = self._new_serial()
        self.inflight[offset] = Delivery(message, time.monotonic() + invisible_s, serial, attempts, group_key)
        return Receipt(self.queue_id, offset, serial), attempts

    def find(self, receipt: Receipt) -> Delivery:
        delivery = self.inflight.get(receipt.offset)
        if delivery is None:
            raise BadReceiptHandle(f"receipt handle {receipt.encode()!r}: the message at queue offset "
                                   f"{receipt.offset} of queue {receipt.queue_id} is not in flight "
                                   "(already acked, or handed out by another gateway process)")
        if delivery.serial != receipt.serial:
            raise BadReceiptHandle(f"receipt handle {receipt.encode()!r} is of an earlier hand-out: the message "
                                   "became visible again and was handed out anew; use the newest handle")
        return delivery

    def ack(self, receipt: Receipt) -> Delivery:
        delivery = self.find(receipt)
        del self.inflight[receipt.offset]
        return delivery

    def change_invisible(self, receipt: Receipt, invisible_s: float) -> Receipt:
        delivery = self.find(receipt)
        delivery.visible_at = time.monotonic() + invisible_s
        delivery.serial = self._new_serial()
        return Receipt(self.queue_id, receipt.offset, delivery.serial)
