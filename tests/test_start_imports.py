"""What a service's start imports: the test suite starts service processes hundreds of times, so a
heavy module that a service does not need at start costs minutes of ``make test``. The gateway and
the commitlog share the client's limits and compression rules, not its producer and consumer, and
the gateway hashes tags one at a time (java_hash's scalar form), without numpy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: entry point -> modules its import must not load
NOT_AT_START = {
    "gateway.main": ("numpy", "mqstore.client.client", "mqstore.client.producer", "mqstore.client.consumer"),
    "services.commitlog.main": ("mqstore.client.client", "mqstore.client.producer", "mqstore.client.consumer"),
    "services.query.main": ("mqstore.client.client", "mqstore.client.producer", "mqstore.client.consumer"),
}


@pytest.mark.parametrize("entry_point", sorted(NOT_AT_START))
def test_a_service_start_leaves_heavy_modules_unloaded(entry_point: str) -> None:
    code = f"import sys, json, {entry_point}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    heavy = set(json.loads(done.stdout)) & set(NOT_AT_START[entry_point])
    assert not heavy, f"{entry_point} loads {sorted(heavy)} at start"


def test_the_client_package_still_exports_every_public_name() -> None:
    import mqstore.client as client

    for name in client.__all__:
        assert getattr(client, name) is not None, name
    from mqstore.client import Producer, PullConsumer

    assert Producer.__module__ == "mqstore.client.producer" and PullConsumer.__module__ == "mqstore.client.consumer"
