"""The scheduler's Prometheus metrics: delayed and timer messages seen, delivered, skipped, and how late.

``kind`` is ``level`` (a DELAY level; ``level`` is its number) or ``timer`` (rmq_sys_wheel_timer;
``level`` is empty)."""

from __future__ import annotations

from services.server.metrics import Counter, Histogram

SCHEDULED = Counter("mqstore_scheduler_scheduled", "Timer messages taken into the timer store (kind timer)",
                    ["kind"])
SCHEDULED_SEEN = Counter("mqstore_scheduler_scheduled_seen", "Scheduled units read whose delivery is due",
                         ["kind", "level"])
DELIVERED = Counter("mqstore_scheduler_delivered", "Delayed and timer messages re-put to their real topic",
                    ["kind", "level"])
SKIPPED = Counter("mqstore_scheduler_skipped", "Delayed and timer messages that cannot be delivered (record gone, "
                  "no REAL_TOPIC, refused by the store) and were passed over, as RocketMQ does", ["kind", "level"])
LATENESS = Histogram("mqstore_scheduler_lateness_seconds", "Delivery time (store acknowledged) minus deliver time",
                     ["kind"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
