"""The official RocketMQ 5 Node.js client (rocketmq-client-nodejs 1.0.8 from npm, the apache/rocketmq-clients
build, pinned by tests/rocketmq5/node/package-lock.json) against ``mqstore up``: its producer sends, its
SimpleConsumer receives and acks, and the message reads the same through mqstore.v1 (UNIQ_KEY id, tag,
keys, properties)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.gateway.system_process import UpProcess
from tests.rocketmq5.topics import create_topic, stored

NODE_DIR = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def node_client() -> Path:
    """The client's dependencies, exactly as package-lock.json pins them (``npm ci`` once)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed (make test installs Debian's nodejs and npm)")
    if not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, capture_output=True,
                       timeout=300)
    return NODE_DIR


def test_node_producer_and_simple_consumer(up: UpProcess, node_client: Path, tmp_path: Path) -> None:
    create_topic(up, "rmq5-node", 2)
    done = subprocess.run(["node", "roundtrip.js", up.gateway, "rmq5-node", "rmq5-node-group"], cwd=node_client,
                          env={**os.environ, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"node failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-5000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    [received] = result["received"]
    assert received == {"id": result["sent"], "body": "hello from node", "tag": "NodeTag", "keys": ["node-key"],
                        "properties": {"lang": "node"}}
    message = stored(up, result["sent"], "rmq5-node")
    assert (message.uniq_key, message.body, message.tags, message.keys, message.properties["lang"]) == (
        result["sent"], b"hello from node", "NodeTag", "node-key", "node")
