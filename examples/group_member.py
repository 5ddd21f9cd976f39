"""One member of a consumer group: run it in several terminals and watch the queues move.

    .venv/bin/python examples/group_member.py billing orders [SECONDS]
    mqstore groups billing                                   # who holds which queue, lag

Each member prints the queues it holds whenever they change, and what it consumed at the end.
"""

from __future__ import annotations

import sys
import time

from mqstore.client import PullConsumer


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    group, topic = argv[0], argv[1]
    seconds = float(argv[2]) if len(argv) > 2 else float("inf")
    consumed = 0
    held: dict[str, list[int]] | None = None
    with PullConsumer(group, topic, rebalance_interval_s=5) as consumer:
        print(f"member {consumer.client_id} of {group}", flush=True)
        deadline = time.time() + seconds
        while time.time() < deadline:
            consumed += len(consumer.poll(timeout=1))
            now = consumer.assignment()
            if now != held:
                held = now
                print(f"holds {now}", flush=True)
    print(f"consumed {consumed} messages", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
