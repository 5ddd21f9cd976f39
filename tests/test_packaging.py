"""The two wheels of ``make dist`` (issue 13), each installed into a clean virtualenv.

* ``mqstore-client``: only ``mqstore/client`` and the generated ``mqstore/v1`` (no servers, no Spark), depends on
  grpcio and protobuf only; installed alone it imports, and sends to and pulls from a running ``mqstore up``.
* ``mqstore``: the servers at the paths their names say (``services/``, ``gateway/``, ``pipeline/``, ``bench/``)
  and the generated code only they use (``apache/``, ``etcd/``), nothing under ``mqstore/`` (that namespace is
  the client's: ``mqstore/client`` and ``mqstore/v1``, and neither wheel ships ``mqstore/__init__.py``); with
  the client wheel its ``mqstore`` console script runs.

Offline: the wheels go in with ``--no-deps --no-index``; their third-party dependencies (grpcio, ...) come from
the project venv's site-packages, added to the clean venv as a plain path entry, so none of the project venv's
own .pth files (the editable install, gen/) are read: the code can only come from the wheels.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.system_process import UpProcess, running_up

ROOT = Path(__file__).resolve().parents[1]
SERVER_TOP = ("services", "gateway", "pipeline", "bench", "apache", "etcd")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "dist", f"DIST={out / 'wheels'}",
                           f"CLIENT_STAGE={out / 'client-stage'}"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = {path.name.split("-")[0]: path for path in (out / "wheels").glob("*.whl")}
    assert set(found) == {"mqstore", "mqstore_client"}, found
    return found


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return next(archive.read(n).decode() for n in archive.namelist() if n.endswith(".dist-info/METADATA"))


def _clean_venv(where: Path, *wheels: Path) -> Path:
    """A virtualenv with only ``wheels`` installed; third-party packages from the project venv (see above)."""
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # Plain path lines: the directories are searched, their own .pth files are not run.
    deps = [entry for entry in sys.path if entry.endswith("site-packages")] or [sysconfig.get_paths()["purelib"]]
    Path(purelib, "project-deps.pth").write_text("".join(f"{entry}\n" for entry in deps))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", "--disable-pip-version-check", *map(str, wheels)], check=True, timeout=120)
    return python


def _run(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_client_wheel_holds_only_the_client_and_the_generated_code(wheels: dict[str, Path]) -> None:
    names = _names(wheels["mqstore_client"])
    code = [n for n in names if not n.startswith("mqstore_client-0.1.0.dist-info/")]
    assert code and all(n.startswith(("mqstore/client/", "mqstore/v1/")) for n in code), sorted(
        n for n in code if not n.startswith(("mqstore/client/", "mqstore/v1/")))
    assert "mqstore/client/producer.py" in code and "mqstore/v1/gateway_pb2_grpc.py" in code
    assert "mqstore/__init__.py" not in names, "mqstore is a namespace package shared with the server wheel"
    requires = sorted(line.split(":", 1)[1].strip() for line in _metadata(wheels["mqstore_client"]).splitlines()
                      if line.startswith("Requires-Dist:") and "extra ==" not in line)
    assert requires == ["grpcio", "protobuf"]


def test_the_server_wheel_holds_the_servers_and_their_generated_code(wheels: dict[str, Path]) -> None:
    names = _names(wheels["mqstore"])
    code = [n for n in names if not n.startswith("mqstore-0.1.0.dist-info/")]
    assert code and all(n.split("/", 1)[0] in SERVER_TOP for n in code), sorted(
        n for n in code if n.split("/", 1)[0] not in SERVER_TOP)
    for expected in ("services/cli.py", "services/store/formats/record.py", "gateway/__main__.py",
                     "pipeline/log4j2.properties", "apache/rocketmq/v2/service_pb2_grpc.py", "bench/gateway.py",
                     "etcd/api/etcdserverpb/rpc_pb2_grpc.py"):
        assert expected in code
    assert "Requires-Dist: mqstore-client==0.1.0" in _metadata(wheels["mqstore"])


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("packaging") / "store") as system:
        yield system


def test_the_client_alone_sends_and_pulls(wheels: dict[str, Path], up: UpProcess, tmp_path: Path) -> None:
    python = _clean_venv(tmp_path / "venv", wheels["mqstore_client"])
    done = _run(python, f"""
        import importlib.util, sys
        import mqstore.client
        from mqstore.client import Client, Producer, PullConsumer
        assert mqstore.client.__file__.startswith(sys.prefix), mqstore.client.__file__
        for name in {SERVER_TOP!r}:
            assert importlib.util.find_spec(name) is None, name
        with Client("{up.gateway}") as client:
            client.create_topic("PackagingTopic", 1)
        with Producer("{up.gateway}") as producer:
            receipt = producer.send("PackagingTopic", "from the client wheel")
        with PullConsumer("packaging_group", "PackagingTopic", "{up.gateway}") as consumer:
            bodies = []
            for _ in range(50):
                bodies += [m.body for m in consumer.poll(timeout=0.2)]
                if bodies:
                    break
        assert bodies == [b"from the client wheel"], bodies
        print("ok", receipt.queue_offset)
        """, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok")


def test_the_server_wheel_runs_its_console_script(wheels: dict[str, Path], tmp_path: Path) -> None:
    python = _clean_venv(tmp_path / "venv", wheels["mqstore_client"], wheels["mqstore"])
    script = python.with_name("mqstore")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("usage: mqstore")
    imported = _run(python, """
        import importlib.util, sys
        import services.cli, gateway.main, apache.rocketmq.v2.service_pb2_grpc, mqstore.client
        for module in (services.cli, gateway.main, apache.rocketmq.v2.service_pb2_grpc, mqstore.client):
            assert module.__file__.startswith(sys.prefix), module.__file__
        """, cwd=tmp_path)
    assert imported.returncode == 0, imported.stdout + imported.stderr
