"""The scheduler's Prometheus metrics: delayed messages seen, delivered, skipped, and how late."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

SCHEDULED_SEEN = Counter("mqstore_scheduler_scheduled_seen", "SCHEDULE_TOPIC_XXXX units read whose delivery is due",
                         ["level"])
DELIVERED = Counter("mqstore_scheduler_delivered", "Delayed messages re-put to their real topic", ["level"])
SKIPPED = Counter("mqstore_scheduler_skipped", "Delayed messages that cannot be delivered (record gone, no "
                  "REAL_TOPIC, refused by the store) and were passed over, as RocketMQ does", ["level"])
LATENESS = Histogram("mqstore_scheduler_lateness_seconds", "Delivery time (store acknowledged) minus deliver time",
                     buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
