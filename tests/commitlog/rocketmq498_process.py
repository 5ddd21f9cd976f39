"""A real RocketMQ 4.9.8 DefaultMessageStore as a process (tools/rocketmq498/RocketMQ498Ha.java, built by
``make check-rocketmq-ha``): a master with its HA port or a slave of a haMasterAddress, driven by lines on
stdin (docs/replication.md, "A real RocketMQ 4.9.8")."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("ROCKETMQ498_BUILD", ROOT / "build" / "rocketmq498"))
CLASSPATH_FILE = BUILD / "classpath"
#: What 4.9.8's MappedFile reaches by reflection (its unmap) and by name (DirectBuffer) on Java 17.
JAVA_OPTIONS = ["--add-opens", "java.base/java.nio=ALL-UNNAMED",
                "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
                "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED", "-Xmx256m",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"]


def missing_reason() -> str | None:
    """Why the 4.9.8 check cannot run here, or None when it can."""
    if not CLASSPATH_FILE.exists():
        return f"{CLASSPATH_FILE} is missing: `make check-rocketmq-ha` builds RocketMQ 4.9.8's store from source"
    if not any(Path(p, "java").exists() for p in os.environ.get("PATH", "").split(os.pathsep)):
        return "no java on PATH"
    return None


class RocketMQ498Store:
    """One DefaultMessageStore process; every command answers one line on stdout."""

    def __init__(self, role: str, store_dir: Path, file_size: int, ha: str) -> None:
        self.store_dir = store_dir
        self.log_path = store_dir.parent / f"{store_dir.name}-rocketmq498.log"
        store_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["java", *JAVA_OPTIONS, "-cp", CLASSPATH_FILE.read_text().strip(), "RocketMQ498Ha", role,
                 str(store_dir), str(file_size), ha],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        try:
            assert self._line() == "ready", self.logs()
        except BaseException:
            self.kill()
            raise

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line, f"the 4.9.8 store ended:\n{self.logs()}"
        return line

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self._line()
        assert answer.split(" ")[0] == command.split(" ")[0], answer
        return answer.partition(" ")[2]

    def put(self, count: int, body_bytes: int = 0) -> dict[str, int]:
        """Put ``count`` messages (bodies of ``body_bytes``, or 650 to 1,560 bytes); how many ended with
        each PutMessageStatus."""
        answer = self.ask(f"put {count} {body_bytes}")
        return {status: int(n) for status, _, n in (word.partition("=") for word in answer.split())}

    def max_offset(self) -> int:
        return int(self.ask("max"))

    def queued(self) -> int:
        return int(self.ask("queues"))

    def slaves(self) -> int:
        return int(self.ask("slaves"))

    def wait_slaves(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.slaves() != count:
            assert time.monotonic() < deadline, f"the 4.9.8 master has not {count} slave(s):\n{self.logs()}"
            time.sleep(0.05)

    def stop(self) -> None:
        """DefaultMessageStore.shutdown, then the process ends."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            assert self._line() == "bye", self.logs()
            self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]
