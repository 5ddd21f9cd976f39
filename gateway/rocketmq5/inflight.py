"""Receipt handles of RocketMQ 5's pop consumption, and the auto renewal of push consumers' receipts.

The consumer state itself (pop offset, messages in flight, invisible-until, delivery attempts) is kept
by each shard's query service (services/query/pop.py), so every gateway process serves every receipt
and a restart of either changes nothing a consumer sees. A receipt handle names one hand-out of one
message: ``<queue>.<offset>.<version>``, the route's queue id (which names the shard and its queue),
the queue offset and the version of the hand-out; an ack or a change of invisible duration with the
handle of an earlier hand-out (the message was delivered again since) is refused, as RocketMQ does.

What stays in the gateway process is :class:`Renewals`: the receipts it delivered to push consumers
asking for auto renewal (RocketMQ's proxy: DefaultReceiptHandleManager), extended before they expire
while the client's telemetry stream is connected to this process, for at most a maximum renew time.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

#: RocketMQ's default maximum delivery attempts of a consumer group (its retry policy's max_attempts).
DEFAULT_MAX_DELIVERY_ATTEMPTS = 16
#: RocketMQ's proxy renews a receipt this long before it expires (renewAheadTimeMillis), or half its
#: invisible duration when that is shorter.
RENEW_AHEAD_S = 10.0
#: RocketMQ's proxy stops renewing a message this long after it was delivered (renewMaxTimeMillis).
DEFAULT_RENEW_MAX_S = 3 * 3600.0


class BadReceiptHandle(ValueError):
    """A receipt handle that is malformed, of a message no longer in flight, or of an earlier hand-out."""


@dataclasses.dataclass(slots=True, frozen=True)
class Receipt:
    queue_id: int
    offset: int
    version: int

    def encode(self) -> str:
        return f"{self.queue_id}.{self.offset}.{self.version}"

    @staticmethod
    def decode(handle: str) -> Receipt:
        try:
            queue_id, offset, version = (int(part) for part in handle.split("."))
        except ValueError:
            raise BadReceiptHandle(f"receipt handle {handle!r} is not one this gateway handed out "
                                   "(<queue>.<offset>.<version>)") from None
        return Receipt(queue_id, offset, version)


@dataclasses.dataclass(slots=True)
class Renewal:
    """A receipt this process renews: whose, where, and until when it is invisible (time.time())."""

    client_id: str
    group: str
    topic: str
    receipt: Receipt
    invisible_s: float
    visible_at: float
    delivered_at: float
    #: The receive's caller (LocalContext): renewals act with its credentials.
    caller: Any

    @property
    def handle(self) -> str:
        return self.receipt.encode()

    def due(self, now: float) -> bool:
        return self.visible_at - now <= min(RENEW_AHEAD_S, self.invisible_s / 2)


class Renewals:
    """The receipts to renew, by handle and by client."""

    def __init__(self, max_renew_s: float = DEFAULT_RENEW_MAX_S) -> None:
        self.max_renew_s = max_renew_s
        self._by_handle: dict[str, Renewal] = {}
        self._by_client: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._by_handle)

    def add(self, renewal: Renewal) -> None:
        self._by_handle[renewal.handle] = renewal
        self._by_client.setdefault(renewal.client_id, set()).add(renewal.handle)

    def forget(self, handle: str) -> None:
        renewal = self._by_handle.pop(handle, None)
        if renewal is not None:
            handles = self._by_client.get(renewal.client_id)
            if handles is not None:
                handles.discard(handle)
                if not handles:
                    del self._by_client[renewal.client_id]

    def drop_client(self, client_id: str) -> None:
        """The client's telemetry stream closed: its messages are left to expire (delivered again)."""
        for handle in self._by_client.pop(client_id, set()):
            self._by_handle.pop(handle, None)

    def due(self, now: float | None = None) -> list[Renewal]:
        """Receipts close to expiring; those past the maximum renew time are forgotten instead."""
        now = time.time() if now is None else now
        out = []
        for renewal in list(self._by_handle.values()):
            if not renewal.due(now):
                continue
            if now - renewal.delivered_at >= self.max_renew_s:
                self.forget(renewal.handle)
                continue
            out.append(renewal)
        return out
