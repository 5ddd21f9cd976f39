"""The benchmark workload and its scratch space, shared by every benchmark.

The workload follows the RocketMQ 4.9.8 perf anchor (shared fixtures README, "Perf anchor"): 1 KiB
random bodies, properties UNIQ_KEY (32 hex digits, unique per message) and CLUSTER=DefaultCluster,
one topic with 8 queues written round robin. With the 9-byte topic ``TopicTest`` a stored record is
91 + 1024 + 9 + 64 = 1188 bytes, the anchor's record size.

Everything random is made before the clock starts: a pool of random bodies (fresh per run) is
reused, and the UNIQ_KEYs are formatted up front, so the timed loop measures the store only.
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.store.formats.message import Message

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / ".bench-tmp"

TOPIC = "TopicTest"
QUEUES = 8
BODY_SIZE = 1024
CLUSTER = "DefaultCluster"
BORN_HOST = "127.0.0.1:50000"
# 88 fixed bytes + TOPICLENGTH + PROPERTIESLENGTH = 91; properties "UNIQ_KEY\x01<32>\x02CLUSTER\x01DefaultCluster".
PROPERTIES_LENGTH = len("UNIQ_KEY") + 1 + 32 + 1 + len("CLUSTER") + 1 + len(CLUSTER)
RECORD_SIZE = 91 + BODY_SIZE + len(TOPIC) + PROPERTIES_LENGTH
assert RECORD_SIZE == 1188


@dataclass(frozen=True)
class Workload:
    """``count`` messages: bodies from a pool of random ones, unique UNIQ_KEYs, queues round robin."""

    bodies: list[bytes]
    uniq_prefix: str
    born_timestamp: int

    @classmethod
    def fresh(cls, pool_size: int = 8192, seed: int | None = None) -> Workload:
        rng = random.Random(seed)
        blob = rng.randbytes(pool_size * BODY_SIZE) if seed is not None else os.urandom(pool_size * BODY_SIZE)
        bodies = [blob[i * BODY_SIZE:(i + 1) * BODY_SIZE] for i in range(pool_size)]
        # The layout of RocketMQ's MessageClientIDSetter: ip (4 B), pid (2 B), class loader hash (4 B),
        # then 6 bytes that change per message (here a counter).
        prefix = f"7F000001{os.getpid() & 0xFFFF:04X}{rng.getrandbits(32):08X}"
        return cls(bodies, prefix, int(time.time() * 1000))

    def uniq_key(self, i: int) -> str:
        return f"{self.uniq_prefix}{i:012X}"

    def body(self, i: int) -> bytes:
        return self.bodies[i % len(self.bodies)]

    def messages(self, start: int, count: int) -> list[Message]:
        """Messages ``start`` .. ``start + count - 1`` of the run (queue = index mod 8)."""
        bodies, n, prefix, born = self.bodies, len(self.bodies), self.uniq_prefix, self.born_timestamp
        return [Message(TOPIC, i % QUEUES, bodies[i % n],
                        properties={"UNIQ_KEY": f"{prefix}{i:012X}", "CLUSTER": CLUSTER},
                        born_timestamp=born, born_host=BORN_HOST)
                for i in range(start, start + count)]


def chunks(items: list[Message], size: int) -> list[list[Message]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


@contextlib.contextmanager
def scratch_dir(prefix: str, keep: bool = False) -> Iterator[Path]:
    """A fresh directory under <repo>/.bench-tmp (the repo's disk), removed afterwards."""
    SCRATCH.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=SCRATCH))
    try:
        yield path
    finally:
        if keep:
            print(f"kept store {path}", flush=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):
                SCRATCH.rmdir()  # only if empty: another benchmark may be using it


def drop_caches() -> bool:
    """sync, then drop the page cache, dentries and inodes (root only). False if not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return True
    except OSError:
        return False


def machine_info() -> dict[str, str]:
    """What the results depend on: CPUs, their model, memory, Python, and the disk of the scratch dir."""
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    SCRATCH.mkdir(exist_ok=True)
    fs = "?"
    with contextlib.suppress(OSError), open("/proc/mounts") as handle:
        best = ""
        target = str(SCRATCH.resolve())
        for line in handle:
            dev, mnt, kind = line.split()[:3]
            if target.startswith(mnt) and len(mnt) >= len(best):
                best, fs = mnt, f"{dev} {kind} on {mnt}"
    with contextlib.suppress(OSError):
        SCRATCH.rmdir()
    return {"cpus": str(os.cpu_count()), "cpu": model, "mem": mem, "python": platform.python_version(),
            "disk": fs}


def print_machine(extra: str = "") -> None:
    info = machine_info()
    print(f"machine: {info['cpus']} vCPU {info['cpu']}, {info['mem']} RAM, Python {info['python']}, "
          f"store on {info['disk']}{extra}", flush=True)
