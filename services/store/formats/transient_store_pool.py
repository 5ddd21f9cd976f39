"""TransientStorePool: spare write buffers the size of a store file.

With ``transientStorePoolEnable`` an append lands in a pooled buffer; the commit service later
writes it into the file and the flush service makes it durable. This keeps page-cache faults
off the put path, at the price of readers seeing only committed bytes.
"""

from __future__ import annotations

import logging
import mmap
import threading

log = logging.getLogger(__name__)


class TransientStorePool:
    def __init__(self, pool_size: int, file_size: int) -> None:
        self.file_size = file_size
        self._lock = threading.Lock()
        # Anonymous mappings: untouched pages cost no memory until written.
        self._free = [mmap.mmap(-1, file_size) for _ in range(pool_size)]

    def borrow(self) -> mmap.mmap | None:
        with self._lock:
            if not self._free:
                log.warning("transient store pool is empty; a file is written directly")
                return None
            return self._free.pop()

    def give_back(self, buffer: mmap.mmap) -> None:
        with self._lock:
            self._free.append(buffer)

    @property
    def available(self) -> int:
        with self._lock:
            return len(self._free)

    def close(self) -> None:
        with self._lock:
            for buffer in self._free:
                buffer.close()
            self._free.clear()
