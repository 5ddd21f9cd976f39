"""The query service's cached view of the commitlog: min/max offset, file size, store host.

Asking GetStoreInfo on every request would double the round trips of a pull, so the view is cached
and refreshed only when a read shows it is stale: an offset past the cached max (new data), a read
below the real min (files deleted). Concurrent refreshes share one GetStoreInfo call.
"""

from __future__ import annotations

import asyncio
import logging

from services.query.backends import CommitLogClient, StoreInfo
from services.store.errors import StoreError
from services.store.formats.socket_address import AddressError, decode_address, encode_address

log = logging.getLogger(__name__)


def normalise_host(host: str) -> str:
    """``ip:port`` in the form message ids decode to (IPv6 in brackets, no leading zeros)."""
    try:
        return decode_address(encode_address(host))
    except AddressError:
        return host


class StoreView:
    def __init__(self, commitlog: CommitLogClient) -> None:
        self._commitlog = commitlog
        self._info: StoreInfo | None = None
        self._store_host = ""
        self._refreshing: asyncio.Task[StoreInfo] | None = None

    @property
    def cached(self) -> StoreInfo | None:
        return self._info

    @property
    def store_host(self) -> str:
        """This shard's store host, normalised; "" before the first successful refresh."""
        return self._store_host

    async def info(self) -> StoreInfo:
        """The cached view, fetched on first use."""
        if self._info is None:
            return await self.refresh()
        return self._info

    async def refresh(self) -> StoreInfo:
        """Fetch GetStoreInfo once for every caller waiting at the same moment."""
        task = self._refreshing
        if task is None:
            task = asyncio.ensure_future(self._fetch())
            self._refreshing = task
            task.add_done_callback(self._clear)
        return await asyncio.shield(task)

    async def covering(self, offset: int) -> StoreInfo:
        """The view, refreshed if ``offset`` lies past its max offset (a message newer than the view)."""
        info = await self.info()
        if offset >= info.max_offset:
            info = await self.refresh()
        return info

    async def keep_fresh(self, interval_s: float) -> None:
        """Refresh every ``interval_s`` until cancelled. Reads from the files learn of expired files (the
        min offset) and quarantined ranges only through this view; a failed refresh is retried next time."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.refresh()
            except StoreError as exc:
                log.debug("store view refresh failed: %s", exc)

    async def _fetch(self) -> StoreInfo:
        info = await self._commitlog.store_info()
        self._info = info
        self._store_host = normalise_host(info.store_host)
        return info

    def _clear(self, task: asyncio.Task[StoreInfo]) -> None:
        if self._refreshing is task:
            self._refreshing = None
        if not task.cancelled():
            task.exception()  # retrieved here so an error nobody awaited is not logged as lost
