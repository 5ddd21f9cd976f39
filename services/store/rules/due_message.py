"""A due message: one the scheduler re-puts to its real topic once its delay level or timer is up.

The store parks a message with DELAY or timer properties; a due message keeps those properties in
its record (RocketMQ 4.9.8's messageTimeup writes DELAY=n into the delivered record, RocketMQ 5's
timer delivery keeps TIMER_*), so the store must be told not to park it again. Only the scheduler says
so (the commitlog's ``scheduled_delivery`` flag); the type is the flag inside the store, so nothing
else on the put path changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.store.formats.message import Message


@dataclass(slots=True)
class DueMessage(Message):
    """A message stored as it is: no DELAY level or timer parks it again."""
