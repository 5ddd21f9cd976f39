"""A rendered pod template run as local processes, to show its containers' command lines, settings,
Secrets and probes work together without a cluster.

What a kubelet would provide is stood in for, and nothing else is changed:

- every volume mount becomes a directory under the pod's root (the claim, emptyDirs, the ConfigMaps' and
  Secrets' files, subPath mounts as their subdirectory or file), and every path in the container's
  command line or in a mounted settings file that lies under a mount path is rewritten to it;
- each pod's fixed container ports become free loopback ports (a pod has its own network; here they
  share one), and ``0.0.0.0`` becomes ``127.0.0.1``: nothing listens beyond loopback;
- a peer pod's DNS name (``shard-0.shard:9901``) becomes ``127.0.0.1`` and that pod's mapped port;
- downward-API fields get local values, ``secretKeyRef`` the rendered Secret's value;
- ``OTEL_*`` variables are dropped (no collector runs here; tests/test_k8s_manifests.py checks them).

Readiness is the container's own readinessProbe: a gRPC health check on its (mapped) port.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.commitlog.commitlog_process import CHANNEL_OPTIONS, free_port, mqstore_command
from tests.deploy.render import Object, containers, one, pod_spec

_ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9.-]+):(?P<port>\d{2,5})\b")


class LocalPod:
    def __init__(self, objects: tuple[Object, ...], workload: Object, root: Path, pod_name: str,
                 peers: dict[str, LocalPod] | None = None) -> None:
        self.objects, self.workload, self.root, self.pod_name = objects, workload, root, pod_name
        self.peers = peers if peers is not None else {}
        self.spec = pod_spec(workload)
        fixed = {p["containerPort"] for c in containers(workload).values() for p in c.get("ports", [])}
        self.ports = {port: free_port() for port in sorted(fixed)}
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        root.mkdir(parents=True, exist_ok=True)

    # --- what the kubelet would provide ---------------------------------------------------------------

    def _volume_dir(self, name: str, mounts: dict[str, Path]) -> Path:
        """The volume's directory; a ConfigMap's files rewritten for the container that mounts them."""
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        target = self.root / "volumes" / name
        volume = volumes.get(name)
        if volume is not None and ("configMap" in volume or "secret" in volume) and not target.exists():
            target.mkdir(parents=True)
            if "configMap" in volume:
                data = one(self.objects, "ConfigMap", volume["configMap"]["name"])["data"]
                for key, text in data.items():
                    (target / key).write_text(self.rewrite(text, mounts), encoding="utf-8")
            else:
                data = one(self.objects, "Secret", volume["secret"]["secretName"])["data"]
                for key, encoded in data.items():
                    (target / key).write_bytes(base64.b64decode(encoded))
        target.mkdir(parents=True, exist_ok=True)  # a claim or an emptyDir
        return target

    def mounts(self, container: Object) -> dict[str, Path]:
        """mountPath -> local path for every mount of the container, the volumes made."""
        found = {}
        for mount in container.get("volumeMounts", []):
            source = self.root / "volumes" / mount["name"]
            found[mount["mountPath"]] = source / mount["subPath"] if "subPath" in mount else source
        for mount in container.get("volumeMounts", []):
            self._volume_dir(mount["name"], found)
        return found

    def rewrite(self, text: str, mounts: dict[str, Path] | None = None) -> str:
        """Paths under a mount to the mount's directory, pod ports to mapped ones, peers to loopback."""
        if mounts:
            paths = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
            text = re.sub(rf"(?<![\w./-])({paths})(?=$|[/\s\"',])", lambda m: str(mounts[m.group(1)]), text)

        def address(match: re.Match[str]) -> str:
            host, port = match.group("host"), int(match.group("port"))
            if host in ("0.0.0.0", "127.0.0.1", "localhost") and port in self.ports:
                return f"127.0.0.1:{self.ports[port]}"
            peer = self.peers.get(host)
            if peer is not None and port in peer.ports:
                return f"127.0.0.1:{peer.ports[port]}"
            return match.group(0)

        return _ADDRESS.sub(address, text)

    def env(self, container: Object) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MQSTORE_", "OTEL_"))}
        fields = {"metadata.name": self.pod_name, "metadata.namespace": "mqstore", "status.podIP": "127.0.0.1"}
        for item in container.get("env", []):
            name = item["name"]
            if name.startswith("OTEL_"):
                continue
            if "value" in item:
                value = str(item["value"])
                env[name] = str(self.ports[int(value)]) if value.isdigit() and int(value) in self.ports else value
            elif "fieldRef" in item["valueFrom"]:
                env[name] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                ref = item["valueFrom"]["secretKeyRef"]
                env[name] = base64.b64decode(one(self.objects, "Secret", ref["name"])["data"][ref["key"]]).decode()
        return env

    # --- running -------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> None:
        """Init containers to completion, then each container in order, each ready before the next."""
        for init in self.spec.get("initContainers", []):
            mounts = self.mounts(init)
            command = [self.rewrite(part, mounts) for part in init["command"]]
            subprocess.run(command, check=True, timeout=60, env=self.env(init))
        for name, container in containers(self.workload).items():
            mounts = self.mounts(container)
            args = [self.rewrite(arg, mounts) for arg in container["args"]]
            log = (self.root / f"{name}.log").open("ab")
            proc = subprocess.Popen([*mqstore_command(), *args], env=self.env(container), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log)
            log.close()
            self.procs.append((name, proc))
            self.wait_ready(name, container, proc, timeout_s)

    def wait_ready(self, name: str, container: Object, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        probe = container["readinessProbe"]["grpc"]
        address = f"127.0.0.1:{self.ports[probe['port']]}"
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited {proc.returncode}: {self.log(name)[-3000:]}")
            # A fresh channel per attempt, as the kubelet's prober dials anew: a channel that failed to
            # connect before the server listened would wait out its reconnect backoff.
            with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=probe.get("service", "")), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not ready on {address} in {timeout_s}s: {self.log(name)[-3000:]}")
            time.sleep(0.1)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> dict[str, Any]:
        """SIGTERM every container (last started first), as the kubelet does; SIGKILL after the grace."""
        codes: dict[str, Any] = {}
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in reversed(self.procs):
            try:
                codes[name] = proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait(timeout=10)
        self.procs.clear()
        return codes
