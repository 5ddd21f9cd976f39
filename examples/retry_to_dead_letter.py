"""A message that always fails: handed back twice (1 s each), then a dead letter, listed and re-sent.

    .venv/bin/python examples/retry_to_dead_letter.py

Real consumers call ``consume_later(message)`` (level 3 + retries: 10 s, 30 s, 1 min, ...) and keep
the default limit of 16; the short level and limit here make the whole path take seconds.
"""

from __future__ import annotations

import sys
import time
import uuid

from mqstore.client import Client
from mqstore.client.dead_letters import list_dead_letters, resend_dead_letter

MAX_RECONSUME_TIMES = 2


def main() -> int:
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"jobs_{suffix}", f"workers_{suffix}"
    with Client() as client:
        client.producer().send(topic, "flaky job", keys="job-1")
        with client.consumer(group, topic) as consumer:
            deadline = time.time() + 60
            dead = None
            while dead is None and time.time() < deadline:
                for message in consumer.poll(timeout=5):
                    receipt = consumer.consume_later(message, 1, max_reconsume_times=MAX_RECONSUME_TIMES)
                    print(f"try {message.reconsume_times + 1} of {message.text!r} from {message.topic} failed: "
                          f"-> {receipt.target_topic}")
                    if receipt.dead_letter:
                        dead = message.uniq_key
        if dead is None:
            print("no dead letter within 60 s (is the scheduler running?)", file=sys.stderr)
            return 1
        for letter in list_dead_letters(client, group):
            print(f"dead letter {letter.uniq_key}: {letter.text!r}, first sent to {letter.properties['RETRY_TOPIC']}, "
                  f"reconsume times {letter.reconsume_times}")
        again = resend_dead_letter(client, group, dead)
        print(f"re-sent to {again.topic} queue {again.queue_id} offset {again.queue_offset}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
