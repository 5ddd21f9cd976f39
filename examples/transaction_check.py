"""A transaction left UNKNOWN, settled by check-backs: the producer answers UNKNOWN twice, then COMMIT.

    .venv/bin/python examples/transaction_check.py

With the default settings the store checks an open half after transactionTimeOut (6 s) and then every
transactionCheckInterval (60 s), so this takes two to three minutes; a store started with
MQSTORE_TRANSACTION_CHECK_INTERVAL_MS=500 MQSTORE_TRANSACTION_TIMEOUT_MS=1000 answers in seconds.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

from mqstore.client import PullConsumer, TransactionCheck, TransactionProducer, TransactionState

UNKNOWN_ANSWERS = 2
WAIT_S = 240


def main() -> int:
    topic = f"orders_{uuid.uuid4().hex[:8]}"
    checks: list[TransactionCheck] = []
    settled = threading.Event()

    def run_local(message: object, arg: object) -> TransactionState:
        return TransactionState.UNKNOWN                    # e.g. the database did not answer in time

    def check(half: TransactionCheck) -> TransactionState:
        checks.append(half)
        answer = TransactionState.COMMIT if len(checks) > UNKNOWN_ANSWERS else TransactionState.UNKNOWN
        print(f"check #{len(checks)} of {half.transaction_id} (keys {' '.join(half.keys)}): {answer.name}",
              flush=True)
        if answer is TransactionState.COMMIT:
            settled.set()
        return answer

    with TransactionProducer(f"example-producers-{topic}", run_local, check) as producer:
        result = producer.send(topic, "order 1", keys="order-1")
        print(f"half {result.transaction_id} stored, ended {result.state.name}: waiting for checks", flush=True)
        if not settled.wait(WAIT_S):
            print(f"no COMMIT check within {WAIT_S} s", file=sys.stderr)
            return 1
        # The producer stays open while the commit shows up (close() would still send the answer first).
        with PullConsumer(None, topic) as consumer:
            deadline = time.time() + 10
            while time.time() < deadline:
                for message in consumer.poll(timeout=2):
                    print(f"committed: {message.text!r} on {message.topic}, uniq_key {message.uniq_key}")
                    return 0
    print("the committed message did not arrive", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
