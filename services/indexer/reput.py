"""The reput loop: follow the commitlog service's Tail from the reput offset and dispatch every record.

Also RocketMQ's ReputMessageService, but across a process boundary: the commitlog may restart (and
lose a tail of unflushed records in a crash) while the indexer runs, so every (re)connection
checks which incarnation of the commitlog it talks to and truncates what was built from records
that no longer exist before it resumes.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import grpc
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from services.indexer.indexer_store import IndexerStore, ReputState
from services.server.channels import sync_channel
from services.store.record import RecordError, parse_dispatch_requests

log = logging.getLogger(__name__)

MIB = 1024 * 1024
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


@dataclass(slots=True)
class DispatchLag:
    connected: bool = False
    commitlog_max_offset: int = 0
    commitlog_incarnation: str = ""
    # Store time of the newest record the commitlog has that we have not dispatched yet: unknown
    # exactly, so lag in time is measured from the wall clock when records are pending.
    behind_since_ms: int = 0


class Resync(Exception):
    """The reput offset no longer fits the commitlog: reconcile, then reconnect."""


class ReputService:
    def __init__(self, store: IndexerStore, commitlog_address: str, chunk_bytes: int = 4 * MIB,
                 poll_wait_ms: int = 500, max_backoff_s: float = 2.0) -> None:
        self._store = store
        self._address = commitlog_address
        self._chunk_bytes = chunk_bytes
        self._poll_wait_ms = poll_wait_ms
        self._max_backoff_s = max_backoff_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reput", daemon=True)
        self._call: grpc.Call | None = None
        self.lag = DispatchLag()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        call = self._call
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]
        self._thread.join(10)

    # -- status ------------------------------------------------------------------------------
    @property
    def behind_bytes(self) -> int:
        return max(0, self.lag.commitlog_max_offset - self._store.reput_offset)

    @property
    def behind_ms(self) -> int:
        if self.behind_bytes == 0:
            return 0
        last = self._store.last_dispatched_store_timestamp
        return max(0, int(time.time() * 1000) - last) if last else 0

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        retrying = Retrying(
            retry=retry_if_exception(self._retryable),
            wait=wait_exponential(multiplier=0.05, max=self._max_backoff_s),
            sleep=self._sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        while not self._stopped.is_set():
            try:
                retrying(self._follow_once)
            except Exception:  # never let the thread die: log, pause, start over
                if not self._stopped.is_set():
                    log.exception("reput loop failed; restarting it")
                    self._stopped.wait(self._max_backoff_s)

    def _sleep(self, seconds: float) -> None:
        self._stopped.wait(seconds)  # a stop cuts a backoff short

    def _retryable(self, exc: BaseException) -> bool:
        if self._stopped.is_set():
            return False
        if isinstance(exc, Resync):
            return True
        return isinstance(exc, grpc.RpcError) and exc.code() in RETRYABLE

    def _log_retry(self, state: RetryCallState) -> None:
        self.lag.connected = False
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Resync):
            log.info("reput resynchronised: %s", exc)
        else:
            log.warning("commitlog service at %s unavailable (%s); retrying", self._address,
                        exc.code().name if isinstance(exc, grpc.RpcError) else exc)

    def _follow_once(self) -> None:
        """Connect, reconcile with this commitlog incarnation, then dispatch until the stream ends."""
        with sync_channel(self._address, options=[("grpc.max_receive_message_length", 256 * MIB)]) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            info = stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
            self._reconcile(info)
            self.lag.connected = True
            self.lag.commitlog_incarnation = info.incarnation
            self.lag.commitlog_max_offset = info.max_offset
            try:
                self._tail(stub)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                    raise Resync(exc.details()) from None
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self._rebuild_from(info.min_offset, exc.details() or "")
                    raise Resync("rebuilt") from None
                raise

    def _reconcile(self, info: commitlog_pb2.StoreInfo) -> None:
        store = self._store
        state = store.load_reput_state()
        if state is None or state.commitlog_incarnation != info.incarnation:
            # A new start of the commitlog: records we dispatched past its recovered end are gone.
            if store.reput_offset > info.recovered_offset:
                store.truncate(info.recovered_offset)
            store.save_reput_state(ReputState(info.incarnation))
        if store.reput_offset > info.max_offset:
            store.truncate(info.max_offset)
        if store.reput_offset < info.min_offset:
            log.warning("reput offset %d is below the commitlog's min offset %d (files deleted): skipping ahead",
                        store.reput_offset, info.min_offset)
            store.skip_to(info.min_offset)
        store.correct_min_offset(info.min_offset)

    def _rebuild_from(self, min_offset: int, why: str) -> None:
        log.error("reput offset %d is not a record boundary of the commitlog (%s): rebuilding from %d",
                  self._store.reput_offset, why, min_offset)
        self._store.truncate(min_offset)
        self._store.skip_to(min_offset)

    def _tail(self, stub: commitlog_pb2_grpc.CommitLogServiceStub) -> None:
        store = self._store
        request = commitlog_pb2.TailRequest(from_offset=store.reput_offset, max_chunk_bytes=self._chunk_bytes,
                                            poll_wait_ms=self._poll_wait_ms)
        call = stub.Tail(request)
        self._call = call
        try:
            for chunk in call:
                if self._stopped.is_set():
                    return
                self.lag.commitlog_max_offset = chunk.max_offset
                if chunk.start_offset != store.reput_offset:
                    raise Resync(f"chunk starts at {chunk.start_offset}, reput offset is {store.reput_offset}")
                if chunk.record_count:
                    try:
                        requests = parse_dispatch_requests(chunk.data, chunk.start_offset)
                    except RecordError as exc:
                        raise Resync(f"unparsable chunk: {exc}") from None
                    store.dispatch(requests, chunk.next_offset)
                elif chunk.next_offset != store.reput_offset:
                    store.skip_to(chunk.next_offset)
        finally:
            self._call = None
            call.cancel()
