"""Reload the token file without a restart: when it changes (polled) and on SIGHUP.

Tokens are rotated by editing the file (or by Kubernetes updating a mounted Secret, which swaps a
symlink): a restart would drop every client's connection, so the gateway rereads the file instead.

* Poll: every ``auth_reload_ms`` the file's identity (inode, size, mtime, ctime) is compared with
  the one last read; a change means a reload. Reading happens in a thread, off the event loop.
* SIGHUP: reload at once, changed or not (``kill -HUP <gateway pid>``; a worker group's supervisor
  passes it on to every worker).
* A good file replaces the whole table at once (:meth:`TokenTable.replace`) and logs
  ``token file ... reloaded (...): N tokens``. A bad file (YAML error, an entry that is not valid, no
  tokens, the file missing) keeps the tokens loaded before and logs a warning saying why, once per
  version of the file, so a half-written file costs nothing but a line: its next write is read again.

Nothing logged names a token or its digest: only the file, the count, and what to fix.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from gateway.auth import TokenTable, load_token_table
from services.store.config import ConfigError

log = logging.getLogger("gateway.tokens")

# (inode, size, mtime, ctime); None when the file cannot be stat'ed.
Signature = tuple[int, int, int, int] | None


def file_signature(path: str | Path) -> Signature:
    """What changes whenever the file's content may have changed (stat follows a symlink swap)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class TokenReloader:
    """Keeps ``table`` equal to the last valid content of ``path``."""

    def __init__(self, path: str | Path, table: TokenTable, interval_s: float) -> None:
        self.path = str(path)
        self.table = table
        self.interval_s = interval_s
        # The version read at start-up (the caller loaded it just before) is the baseline.
        self._loaded = file_signature(self.path)
        self._refused: Signature | tuple[()] = ()
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[bool]] = set()

    async def run(self) -> None:
        """Poll until cancelled (interval 0: never; SIGHUP still reloads)."""
        if self.interval_s <= 0:
            return
        while True:
            await asyncio.sleep(self.interval_s)
            signature = file_signature(self.path)
            if signature != self._loaded and signature != self._refused:
                await self.reload("the file changed", signature)

    def on_sighup(self) -> None:
        """The SIGHUP handler (on the event loop): reload now, changed or not."""
        task = asyncio.get_running_loop().create_task(self.reload("SIGHUP", file_signature(self.path), force=True))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self, reason: str, signature: Signature, force: bool = False) -> bool:
        """Read the file; replace the table if it is valid. True when the tokens were replaced."""
        async with self._lock:
            # The signature is taken before reading: a write during the read changes it, so the next
            # poll reads the file again.
            try:
                fresh = await asyncio.to_thread(load_token_table, self.path)
            except ConfigError as exc:
                if force or signature != self._refused:
                    log.warning("token file %s not reloaded (%s): %s; keeping the %d tokens loaded before",
                                self.path, reason, exc, len(self.table),
                                extra={"auth_file": self.path, "tokens": len(self.table)})
                self._refused = signature
                return False
            self.table.replace(fresh)
            self._loaded = signature
            self._refused = ()
            log.info("token file %s reloaded (%s): %d tokens", self.path, reason, len(fresh),
                     extra={"auth_file": self.path, "tokens": len(fresh)})
            return True
