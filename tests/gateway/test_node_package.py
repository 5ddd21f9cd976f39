"""The Node.js client as a library: ``npm pack`` of clients/node gives a tarball that carries its .proto
files, and installed with ``npm install <tarball>`` into a project outside the repository it sends to and
pulls from a running ``mqstore up`` (as tests/test_packaging.py does for the Python wheels), and makes the
group, send-back and transaction calls.

The package is packed from a copy of clients/node laid out as in the repository (its prepack step copies
``../../proto/mqstore/v1`` into it), so packing never writes into the shared checkout. ``npm install``
fetches the client's dependencies from the npm cache or registry (clients/node/package.json pins them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.gateway.system_process import UpProcess

REPO = Path(__file__).resolve().parents[2]
CLIENT_DIR = REPO / "clients" / "node"
PROTO_DIR = REPO / "proto" / "mqstore" / "v1"
PACKAGE = "mqstore-node-client"
NPM_FLAGS = ("--no-audit", "--no-fund", "--no-update-notifier", "--prefer-offline")


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.fail("node and npm are not on PATH: the Node.js package test needs Node 18+ and npm")
    return npm


def _run(argv: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQSTORE_", "npm_config_prefix"))}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv} exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    checkout = tmp_path_factory.mktemp("node-checkout")
    package_dir = checkout / "clients" / "node"
    shutil.copytree(CLIENT_DIR, package_dir, ignore=shutil.ignore_patterns("node_modules", "proto", "*.tgz"))
    shutil.copytree(PROTO_DIR, checkout / "proto" / "mqstore" / "v1")
    out = tmp_path_factory.mktemp("node-dist")
    packed = _run([_npm(), "pack", "--json", "--pack-destination", str(out), *NPM_FLAGS], cwd=package_dir)
    [info] = json.loads(packed.stdout[packed.stdout.index("["):])
    assert not (package_dir / "proto").exists(), "postpack leaves no copy of the protos behind"
    return out / info["filename"]


def _files(tarball: Path) -> dict[str, bytes]:
    with tarfile.open(tarball) as archive:
        members = [m for m in archive.getmembers() if m.isfile()]
        return {m.name: archive.extractfile(m).read() for m in members}  # type: ignore[union-attr]


def test_the_tarball_carries_the_protos_and_no_repository_paths(tarball: Path) -> None:
    files = _files(tarball)
    bundled = {Path(n).name: data for n, data in files.items() if n.startswith("package/proto/mqstore/v1/")}
    assert bundled == {p.name: p.read_bytes() for p in PROTO_DIR.glob("*.proto")}
    assert set(files) - {f"package/proto/mqstore/v1/{n}" for n in bundled} == {
        "package/package.json", "package/mqstore.js", "package/demo.js", "package/README.md"}
    manifest = json.loads(files["package/package.json"])
    assert "private" not in manifest and manifest["main"] == "mqstore.js"


@pytest.fixture(scope="module")
def project(tarball: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project outside the repository with the packed client installed from its tarball."""
    app = tmp_path_factory.mktemp("node-app")
    (app / "package.json").write_text(json.dumps({"name": "uses-mqstore", "version": "1.0.0", "private": True}))
    _run([_npm(), "install", str(tarball), *NPM_FLAGS], cwd=app)
    assert (app / "node_modules" / PACKAGE / "proto" / "mqstore" / "v1" / "gateway.proto").is_file()
    return app


SEND_AND_PULL = """
const assert = require('node:assert');
const path = require('node:path');
const { connect, PROTO_DIR } = require('mqstore-node-client');
assert.strictEqual(PROTO_DIR, path.join(__dirname, 'node_modules', 'mqstore-node-client', 'proto'));
(async () => {
  const mq = connect(process.argv[2]);
  const sent = await mq.send({ message: { topic: 'NodePackage', body: Buffer.from('from the tarball') }, queue_id: 0 });
  const pulled = await mq.pull({ topic: 'NodePackage', queue_id: 0, queue_offset: sent.queue_offset,
                                 long_poll_ms: 3000 });
  const [m] = pulled.messages;
  process.stdout.write(JSON.stringify({ sent: [sent.uniq_key, sent.offset_msg_id],
                                        pulled: [m.uniq_key, m.offset_msg_id], body: m.body.toString() }));

  // Consumer groups, send-back and transactions are RPCs of the package too.
  const beat = await mq.heartbeat({ group: 'node-pkg', client_id: 'node-1', topics: ['NodePackage'] });
  assert.deepStrictEqual(beat.member_ids, ['node-1']);
  const { groups } = await mq.describeGroups({ group: 'node-pkg' });
  assert.deepStrictEqual(groups.map((g) => g.group), ['node-pkg']);
  await mq.unregisterConsumer({ group: 'node-pkg', client_id: 'node-1' });
  const back = await mq.consumerSendBack({ group: 'node-pkg', msg_id: m.offset_msg_id, topic: 'NodePackage' });
  assert.strictEqual(back.target_topic, '%RETRY%node-pkg');
  assert.strictEqual(back.send.uniq_key, sent.uniq_key);
  const half = await mq.send({ message: { topic: 'NodePackage', body: Buffer.from('tx'),
                                          properties: { TRAN_MSG: 'true', PGROUP: 'node-tx' } } });
  const ended = await mq.endTransaction({ producer_group: 'node-tx', transaction_id: half.uniq_key,
                                          offset_msg_id: half.offset_msg_id, resolution: 'COMMIT' });
  assert.strictEqual(ended.applied, true);
  assert.strictEqual(ended.committed.uniq_key, half.uniq_key);
  const checks = mq.transactionChecks();
  const closed = new Promise((resolve) => { checks.on('status', resolve); checks.on('error', resolve); });
  checks.on('data', () => {});
  checks.write({ producer_group: 'node-tx' });
  checks.end();
  assert.strictEqual((await closed).code, 0);
  mq.close();
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_the_installed_package_sends_and_pulls_outside_the_repository(project: Path, up: UpProcess) -> None:
    script = project / "send-and-pull.js"
    script.write_text(SEND_AND_PULL)
    answer = json.loads(_run(["node", str(script), up.gateway], cwd=project, timeout=60).stdout)
    assert answer["body"] == "from the tarball"
    assert answer["pulled"] == answer["sent"] and all(len(i) == 32 for i in answer["sent"])
    demo = _run([str(project / "node_modules" / ".bin" / "mqstore-node-demo"), "demo", "--topic", "NodePackageDemo",
                 "--count", "2", "--address", up.gateway], cwd=project, timeout=60)
    [summary] = [json.loads(line) for line in demo.stdout.splitlines() if '"summary"' in line]
    assert summary["ok"] is True and summary["pulled"] == 2
