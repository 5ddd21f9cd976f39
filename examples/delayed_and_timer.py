"""Delayed and timer messages: one by RocketMQ delay level, one at an absolute time, both read back.

    .venv/bin/python examples/delayed_and_timer.py            # against $MQSTORE_GATEWAY or 127.0.0.1:9876

Prints where each send was parked and how late each delivery was (store time minus due time).
"""

from __future__ import annotations

import sys
import time
import uuid

from mqstore.client import Producer, PullConsumer

DELAY_LEVEL = 1          # 1 s with the default messageDelayLevel
TIMER_IN_MS = 2_000


def main() -> int:
    topic = f"reminders_{uuid.uuid4().hex[:8]}"
    with Producer() as producer:
        sent_at = int(time.time() * 1000)
        by_level = producer.send(topic, "by level", delay_level=DELAY_LEVEL)
        at_time = producer.send(topic, "at a time", properties={"TIMER_DELIVER_MS": str(sent_at + TIMER_IN_MS)})
    for name, receipt in (("by level", by_level), ("at a time", at_time)):
        print(f"sent {name!r}: parked in {receipt.topic} queue {receipt.queue_id}, uniq_key {receipt.uniq_key}")
    due = {by_level.uniq_key: by_level.store_timestamp + 1_000 * DELAY_LEVEL, at_time.uniq_key: sent_at + TIMER_IN_MS}
    with PullConsumer(None, topic) as consumer:          # no group: just read
        deadline = time.time() + 30
        while due and time.time() < deadline:
            for message in consumer.poll(timeout=5):
                late = message.store_timestamp - due.pop(message.uniq_key)
                print(f"delivered {message.text!r} to {message.topic} queue {message.queue_id}, {late} ms after due")
    if due:
        print(f"not delivered within 30 s: {sorted(due)} (is the scheduler running?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
