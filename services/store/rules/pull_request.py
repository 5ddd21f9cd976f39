"""A pull request's bounds, checked once wherever a pull enters: the gateway refuses a bad one before
it reaches a shard, the query service before it reads anything. The limits are RocketMQ's
(maxTransferBytesOnMessageInMemory, the 800-unit filtered scan) and the query service's defaults."""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.client.limits import MAX_PULL_MESSAGES
from services.store.errors import InvalidArgumentError
from services.store.rules.names import check_offset, check_queue
from services.store.rules.subscription import Subscription

KIB = 1024
MIB = 1024 * KIB
DEFAULT_MAX_MESSAGES = 32
MAX_MESSAGES = MAX_PULL_MESSAGES
# maxTransferBytesOnMessageInMemory.
DEFAULT_MAX_BYTES = 256 * KIB
MAX_BYTES = 32 * MIB
# getMessage scans at least 16000 bytes of ConsumeQueue (800 units) for a filtered pull; GetQueueEntries
# answers at most 1024.
FILTER_SCAN_UNITS = 800
MAX_SCAN_UNITS = 1024
DEFAULT_MAX_LONG_POLL_MS = 15_000


@dataclass(slots=True, frozen=True)
class PullQuery:
    """A validated pull request; build it with :meth:`checked`."""

    topic: str
    queue_id: int
    queue_offset: int
    max_messages: int
    max_bytes: int
    subscription: Subscription
    long_poll_ms: int

    @classmethod
    def checked(cls, topic: str, queue_id: int, queue_offset: int, max_messages: int, max_bytes: int,
                subscription: Subscription, long_poll_ms: int, max_long_poll_ms: int) -> PullQuery:
        """0 means the default for ``max_messages`` and ``max_bytes``; raises InvalidArgumentError."""
        check_queue(topic, queue_id)
        check_offset("queue offset", queue_offset)
        max_messages = max_messages or DEFAULT_MAX_MESSAGES
        if not 1 <= max_messages <= MAX_MESSAGES:
            raise InvalidArgumentError(f"max messages {max_messages} must be within 0..{MAX_MESSAGES} "
                                       f"(0 means {DEFAULT_MAX_MESSAGES})")
        max_bytes = max_bytes or DEFAULT_MAX_BYTES
        if not 1 <= max_bytes <= MAX_BYTES:
            raise InvalidArgumentError(f"max bytes {max_bytes} must be within 0..{MAX_BYTES} "
                                       f"(0 means {DEFAULT_MAX_BYTES})")
        if not 0 <= long_poll_ms <= max_long_poll_ms:
            raise InvalidArgumentError(f"long poll {long_poll_ms} ms must be within 0..{max_long_poll_ms}")
        return cls(topic, queue_id, queue_offset, max_messages, max_bytes, subscription, long_poll_ms)

    @property
    def scan_units(self) -> int:
        """Units to fetch: with a filter, enough to find matches among many that do not match."""
        if self.subscription.takes_all:
            return self.max_messages
        return min(MAX_SCAN_UNITS, max(FILTER_SCAN_UNITS, self.max_messages))
