"""The dev overlay's pods, run from the rendered objects as local processes (tests/deploy/local_pod.py):
the shard pod's init container and its four containers with their exact arguments, settings and
Secrets, then the gateway with its generated settings and tokens. Each must pass its own readinessProbe,
and a send through the gateway with the overlay's token must come back from a pull; a call without the
token is refused. What cannot run here (a cluster's DNS, read-only mounts, NetworkPolicy) is checked on
the rendered objects in tests/test_k8s_manifests.py."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
import yaml

from mqstore.client import Producer, PullConsumer, UnauthenticatedError
from tests.deploy.local_pod import LocalPod
from tests.deploy.render import one, render


def _dev_token() -> str:
    secret = one(render("overlays/dev"), "Secret", "mqstore-tokens")
    tokens = yaml.safe_load(base64.b64decode(secret["data"]["tokens.yaml"]))
    return str(next(t["token"] for t in tokens["tokens"] if t.get("admin")))


def test_the_dev_overlay_pods_run_from_their_rendered_objects_and_serve_a_send_and_a_pull(tmp_path: Path) -> None:
    objects = render("overlays/dev")
    shard = LocalPod(objects, one(objects, "StatefulSet", "shard"), tmp_path / "shard-0", "shard-0")
    gateway = LocalPod(objects, one(objects, "Deployment", "gateway"), tmp_path / "gateway", "gateway-0",
                       peers={"shard-0.shard": shard})
    try:
        shard.start()
        gateway.start()
        address = f"127.0.0.1:{gateway.ports[9876]}"
        with Producer(address, _dev_token()) as producer:
            receipt = producer.send("k8s-smoke", b"from the dev overlay", keys=["k8s-1"])
        with PullConsumer("k8s-smoke-group", "k8s-smoke", address, _dev_token()) as consumer:
            deadline, got = time.monotonic() + 20, []
            while not got and time.monotonic() < deadline:
                got = consumer.poll(max_messages=10, timeout=2)
        assert [m.body for m in got] == [b"from the dev overlay"]
        assert got[0].queue_id == receipt.queue_id
        with pytest.raises(UnauthenticatedError), Producer(address, "not-a-dev-token") as stranger:
            stranger.send("k8s-smoke", b"refused")
        # The store went where the manifests put it: the commitlog's files at the claim's root, each
        # reader's own files in its subdirectory.
        store = shard.root / "volumes" / "store"
        assert any((store / "commitlog").iterdir())
        assert {p.name for p in store.iterdir()} >= {"commitlog", "indexer", "query", "scheduler"}
    finally:
        gateway_codes = gateway.stop()
        shard_codes = shard.stop()
    assert gateway_codes == {"gateway": 0}, gateway.log("gateway")[-2000:]
    assert set(shard_codes.values()) == {0}, {name: shard.log(name)[-1000:] for name in shard_codes}
