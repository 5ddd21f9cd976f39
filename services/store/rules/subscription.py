"""Subscription expressions and RocketMQ's two-stage tag filter.

``*`` (or nothing) takes every message; ``TagA || TagB`` takes messages whose TAGS is one of the
tags. The broker first compares a ConsumeQueue unit's tags code (the Java hash of TAGS) with the
hashes of the wanted tags, which needs no record read; RocketMQ leaves the second stage, comparing
the real TAGS string, to the client. Here both stages run in the service, so two tags with the same
hash (``Aa`` and ``BB``) never leak into each other's pulls.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.store.errors import InvalidArgumentError
from services.store.formats.java_hash import java_string_hash

SUB_ALL = "*"
TAG_SEPARATOR = "||"
MAX_EXPRESSION_LENGTH = 8192
MAX_TAGS = 64


@dataclass(slots=True, frozen=True)
class Subscription:
    """``tags`` empty means every message."""

    tags: frozenset[str]
    codes: frozenset[int]

    @property
    def takes_all(self) -> bool:
        return not self.tags

    def matches_code(self, tags_code: int) -> bool:
        """Stage one (ExpressionMessageFilter.isMatchedByConsumeQueue): the unit's tags code."""
        return not self.tags or tags_code in self.codes

    def matches_tags(self, tags: str | None) -> bool:
        """Stage two (the consumer's processPullResult): the record's real TAGS."""
        return not self.tags or tags in self.tags


ALL = Subscription(frozenset(), frozenset())


def parse_subscription(expression: str) -> Subscription:
    """FilterAPI.buildSubscriptionData for TAG expressions: split at ``||``, trim, drop empty parts."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise InvalidArgumentError(f"subscription is {len(expression)} characters, more than {MAX_EXPRESSION_LENGTH}")
    text = expression.strip()
    if not text or text == SUB_ALL:
        return ALL
    tags = frozenset(part.strip() for part in text.split(TAG_SEPARATOR) if part.strip())
    if not tags:
        raise InvalidArgumentError(f"subscription {expression!r} names no tag: use '*' or 'TagA || TagB'")
    if len(tags) > MAX_TAGS:
        raise InvalidArgumentError(f"subscription names {len(tags)} tags, more than {MAX_TAGS}")
    return Subscription(tags, frozenset(java_string_hash(tag) for tag in tags))
