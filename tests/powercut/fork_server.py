"""A fork server for campaigns that restart all of the store's services after every cut.

A fresh ``mqstore serve SERVICE`` spends about half a second of CPU importing its modules, before it
does anything. A campaign restarts four services a hundred times: on a two-core machine those imports
are most of its CPU, and they compete with the very recovery the campaign waits for. This server
imports every service once and then forks one process per start: the child has the modules already,
runs ``mqstore serve ...`` as the command line would, and is as killable as any other process (a power
cut SIGKILLs it). The server itself never starts a service, opens a channel or a store file, and has
no thread of its own (gRPC, asyncio and the stores start theirs in the child), so forking it is safe.

Protocol: one JSON object a line on the server's stdin (``args``, ``log``); the server answers with the
child's pid, one a line on its stdout. Closing its stdin stops it.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import traceback
from pathlib import Path

#: What each service's start imports (imported once, by the server).
SERVICE_MODULES = ("services.commitlog.main", "services.indexer.main", "services.query.main",
                   "services.scheduler.main", "services.cli")


class ForkServer:
    """The server process, started by the test with the services' environment (modules that read settings
    at import read them once, as each service process did before)."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        with open(log, "ab") as log_file:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.powercut.fork_server"], cwd=cwd, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file)

    def start(self, args: list[str], log: Path) -> ForkedProcess:
        """``mqstore ARGS`` in a forked child whose stdout and stderr append to ``log``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"args": args, "log": str(log)}).encode() + b"\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the fork server exited ({self.proc.wait()}) before starting {args}")
        return ForkedProcess(int(answer))

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ForkedProcess:
    """What a campaign uses of ``subprocess.Popen`` (pid, poll, wait, kill, terminate) for a child of the
    fork server. It is not this process's child: its end is seen through a pidfd, and its exit code is not
    known (the server lets the kernel reap it): ``returncode`` is minus the signal this handle sent, else -1."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._sent = 0
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # it has already exited (and was reaped)
            self._pidfd = None
            self.returncode = -1

    def poll(self) -> int | None:
        return self._wait(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
        return code

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self._pidfd is not None and self.returncode is None:
            signal.pidfd_send_signal(self._pidfd, sig)
            self._sent = sig

    def _wait(self, timeout: float | None) -> int | None:
        if self._pidfd is not None and select.select([self._pidfd], [], [], timeout)[0]:
            os.close(self._pidfd)
            self._pidfd = None
            self.returncode = -self._sent if self._sent else -1
        return self.returncode


def _child(request: dict[str, object]) -> None:
    """In the forked child: the log as stdout and stderr, no stdin, then the command line's main."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    log = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    code = 1
    try:
        from services.cli import main

        sys.argv = ["mqstore", *map(str, request["args"])]  # type: ignore[call-overload]
        code = main() or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve() -> None:
    for module in SERVICE_MODULES:
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children: no zombies
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
