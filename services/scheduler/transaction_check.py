"""The transaction half of the scheduler: one shard's halves ended and checked back.

RocketMQ 4.9.8 splits this between ``EndTransactionProcessor`` (an end: the commit record, then the op
record) and ``TransactionalMessageServiceImpl.check`` (every ``transactionCheckInterval``: halves with
no op record, older than ``transactionTimeOut``, are put back with ``TRANSACTION_CHECK_TIMES`` counted up
and checked with their producer group; after ``transactionCheckMax`` checks a half moves to
``TRANS_CHECK_MAX_TIME_TOPIC``). Here both run in the shard's scheduler, the one writer of the shard's
op records, so that a second end of a half writes nothing (``applied`` false).

State is RocketMQ's: the op queue says which halves are done. The checker's own progress (the half
queue offset below which every half is done, put back or discarded; the op queue offset below which
every op is of such a half) is in ``config/transactionOffset.json`` under the scheduler's store
(RocketMQ keeps the same two offsets as consumer offsets of ``CID_RMQ_SYS_TRANS``). After a restart the
ops from the op offset on are read again, so nothing done is checked again and nothing pending is lost.

A half is *live* when it is at or past the half offset and has no op record. An end names one copy
of a half (the producer's send result, or a check's put-back copy): the live copy of its transaction
(the same UNIQ_KEY) gets the op record, so an end through an older copy ends the transaction too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import logging
import os
import struct
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, scheduler_pb2, scheduler_pb2_grpc, transaction_pb2
from services.scheduler.peers import CHANNEL_OPTIONS, STORED, IndexerPeer, message_to_proto
from services.scheduler.store_reader import ScheduleFiles
from services.server.channels import aio_channel
from services.server.metrics import Counter
from services.server.status import CallFailed, CallStatus, RpcEdge, store_status
from services.store.formats.consume_queue import is_valid_unit
from services.store.formats.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    Message,
    MessageRecord,
)
from services.store.formats.readonly_files import ReadOnlyFiles
from services.store.formats.store_layout import CONSUMEQUEUE_DIR
from services.store.rules import transaction_records as tx
from services.store.rules.names import check_producer_group

log = logging.getLogger(__name__)

CHECKS = Counter("mqstore_scheduler_transaction_checks", "Halves put back and checked with their producer group")
DISCARDED = Counter("mqstore_scheduler_transaction_discarded",
                    "Halves checked transactionCheckMax times, moved to TRANS_CHECK_MAX_TIME_TOPIC")
ENDS = Counter("mqstore_scheduler_transaction_ends", "Transaction ends by resolution and whether they applied",
               ["resolution", "applied"])

FILE_NAME = tx.CHECK_OFFSETS_FILE
SERVICE_NAME = "mqstore.v1.TransactionService"
_UNIT = struct.Struct(">qiq")
CALL_TIMEOUT_S = 10.0
#: how long an end waits for its half's record to be readable (just acknowledged: normally at once)
READ_WAIT_S = 2.0
#: the round after a failed append or read
RETRY_S = 1.0


@dataclass(slots=True, frozen=True)
class CheckSettings:
    """BrokerConfig's transactionTimeOut, transactionCheckMax and transactionCheckInterval, and the store's
    fileReservedTime (a half older than that is discarded unchecked: 4.9.8's needSkip)."""

    timeout_ms: int = tx.DEFAULT_TRANSACTION_TIMEOUT_MS
    check_max: int = tx.DEFAULT_TRANSACTION_CHECK_MAX
    interval_ms: int = tx.DEFAULT_TRANSACTION_CHECK_INTERVAL_MS
    file_reserved_ms: int = 72 * 3600 * 1000

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> CheckSettings:
        """MQSTORE_TRANSACTION_TIMEOUT_MS / _CHECK_MAX / _CHECK_INTERVAL_MS (ValueError when not positive)."""
        env = dict(os.environ) if env is None else env
        values = {}
        for field, name in (("timeout_ms", "MQSTORE_TRANSACTION_TIMEOUT_MS"),
                            ("check_max", "MQSTORE_TRANSACTION_CHECK_MAX"),
                            ("interval_ms", "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS")):
            if env.get(name):
                value = int(env[name])
                if value <= 0:
                    raise ValueError(f"{name} must be positive, got {value}")
                values[field] = value
        return cls(**values)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class _QueueFiles:
    """Units of one topic's queue 0 under the indexer's ConsumeQueue root."""

    def __init__(self, cq_root: Path, topic: str, file_size: int) -> None:
        self._files = ReadOnlyFiles(cq_root / topic / "0", file_size)

    def unit(self, queue_offset: int) -> tuple[int, int] | None:
        """(commitlog offset, size) of the unit, None when its file is not readable (yet)."""
        position = queue_offset * _UNIT.size
        found = self._files.find(position)
        if found is None:
            return None
        start, mapped = found
        commitlog_offset, size, _ = _UNIT.unpack_from(mapped, position - start)
        return commitlog_offset, size

    def close(self) -> None:
        self._files.close()


@dataclass(eq=False)
class Watcher:
    """One WatchChecks stream: the real topics it may be asked about, as the token file's patterns
    (fnmatch, case-sensitive), and the checks handed to it."""

    topics: tuple[str, ...]
    #: None ends the stream (the scheduler stops).
    queue: asyncio.Queue[transaction_pb2.TransactionCheck | None] = dataclasses.field(default_factory=asyncio.Queue)

    def takes(self, topic: str) -> bool:
        return any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.topics)


class EndError(CallFailed):
    """An end the scheduler refuses, with the status the call ends with."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class TransactionChecker:
    def __init__(self, settings: CheckSettings, files: ScheduleFiles, indexer_root: Path, cq_file_size: int,
                 indexer: IndexerPeer, commitlog_address: str, offsets_path: Path, commitlog_file_size: int) -> None:
        self.settings = settings
        self._commitlog_file_size = commitlog_file_size
        self.offsets_path = offsets_path
        self._files = files
        self._halves = _QueueFiles(indexer_root / CONSUMEQUEUE_DIR, tx.HALF_TOPIC, cq_file_size)
        self._ops = _QueueFiles(indexer_root / CONSUMEQUEUE_DIR, tx.OP_TOPIC, cq_file_size)
        self._indexer = indexer
        self._channel = aio_channel(commitlog_address, CHANNEL_OPTIONS)
        self._commitlog = commitlog_pb2_grpc.CommitLogServiceStub(self._channel)
        #: the store host, learned at the first op record (makeOpMessageInner's born host)
        self._born_host = ""
        self.half_offset = 0
        self.op_offset = 0
        #: half queue offset -> op queue offset (None: written by this process, not read back yet)
        self._done: dict[int, int | None] = {}
        #: op queue offset -> the half queue offset it marks (ops at or past op_offset)
        self._op_halves: dict[int, int] = {}
        self._ops_read = 0
        #: UNIQ_KEY of a half this process ended -> the ended copy's half queue offset (pruned with _done)
        self._done_keys: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._watchers: dict[str, list[Watcher]] = {}
        self._stopping = False
        self._turn = 0
        self._task: asyncio.Task[None] | None = None
        #: ends being applied: each runs to its end whatever its caller does (see :meth:`end`)
        self._applying: set[asyncio.Task[scheduler_pb2.EndHalfResult]] = set()
        #: op records of committed halves not stored yet (the commit was): written before the next round
        self._pending_ops: list[MessageRecord] = []
        #: whether commits left without their op record by an earlier process got it (:meth:`_recover`)
        self._recovered = False
        self._wake = asyncio.Event()
        self.checks = 0
        self.discarded = 0

    # -- progress ----------------------------------------------------------------------------------
    def load(self) -> None:
        """ValueError when the file and its .bak are unreadable."""
        offsets = tx.read_check_offsets(self.offsets_path)
        if offsets is not None:
            self.half_offset, self.op_offset = offsets
            self._ops_read = self.op_offset

    def persist(self) -> None:
        tx.write_check_offsets(self.offsets_path, self.half_offset, self.op_offset)

    # -- running -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._check_loop(), name="check-transactions")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        if self._applying:
            await asyncio.wait(self._applying, timeout=CALL_TIMEOUT_S)
        async with self._lock:
            with suppress(OSError):
                await asyncio.to_thread(self.persist)
        await self._channel.close(None)
        self._halves.close()
        self._ops.close()

    async def _check_loop(self) -> None:
        """A round every interval, the first one interval after the start (TransactionalMessageCheckService
        waits, then checks)."""
        interval = self.settings.interval_ms / 1000
        wait = interval
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()
            wait = interval
            try:
                await self.check_round()
            except grpc.aio.AioRpcError as exc:
                log.warning("transaction check: %s: %s; again in %.1fs", exc.code().name, exc.details(), RETRY_S)
                wait = min(interval, RETRY_S)

    async def _max_offset(self, topic: str) -> int:
        offsets = await self._indexer.queue_offsets(topic, 0)
        return 0 if offsets is None else offsets[1]

    async def _read_ops(self) -> None:
        """Op records not read yet (up to the indexer's published max): their halves are done."""
        op_max = await self._max_offset(tx.OP_TOPIC)
        while self._ops_read < op_max:
            unit = self._ops.unit(self._ops_read)
            if unit is None:
                return
            if is_valid_unit(*unit):
                record = self._files.record(unit[0])
                half = tx.op_half_offset(record) if record is not None else None
                if half is not None:
                    self._op_halves[self._ops_read] = half
                    self._done[half] = self._ops_read
            self._ops_read += 1

    def _record(self, queue_offset: int) -> MessageRecord | None:
        unit = self._halves.unit(queue_offset)
        if unit is None or not is_valid_unit(*unit):
            return None
        return self._files.record(unit[0])

    async def check_round(self) -> None:
        """One pass of TransactionalMessageServiceImpl.check over the half queue."""
        started = now_ms()
        await self._read_ops()
        half_max = await self._max_offset(tx.HALF_TOPIC)
        async with self._lock:
            await self._recover()
            await self._write_pending_ops()
            i = self.half_offset
            while i < half_max:
                if i in self._done:
                    i += 1
                    continue
                unit = self._halves.unit(i)
                if unit is None:
                    break
                record = self._files.record(unit[0]) if is_valid_unit(*unit) else None
                if record is None:
                    log.warning("transaction check: half %d (commitlog offset %d) is gone: passed over", i, unit[0])
                    i += 1
                    continue
                if record.store_timestamp >= started:  # put back during this round, or newer
                    break
                key = record.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
                if key and key in self._done_keys:
                    i += 1
                    continue
                times = tx.check_times(record)
                expired = now_ms() - record.born_timestamp > self.settings.file_reserved_ms
                if expired or (times is not None and times >= self.settings.check_max):
                    if not await self._discard(record, expired):
                        break
                    i += 1
                    continue
                age = now_ms() - record.born_timestamp
                if 0 <= age < tx.immunity_ms(record, self.settings.timeout_ms):
                    if tx.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS not in record.properties:
                        break  # halves are in store order: the ones after it are younger
                    # 4.9.8's putImmunityMsgBackToHalfQueue: a long immunity does not hold the queue.
                    if (await self._append(tx.immune_put_back_of(record))).status not in STORED:
                        break
                    i += 1
                    continue
                if not await self._check_or_wait(record, 1 if times is None else times + 1):
                    break
                i += 1
            self._advance(i)
        await asyncio.to_thread(self.persist)

    def _advance(self, half_offset: int) -> None:
        self.half_offset = half_offset
        self._done = {h: o for h, o in self._done.items() if h >= half_offset}
        self._done_keys = {k: h for k, h in self._done_keys.items() if h >= half_offset}
        while self.op_offset < self._ops_read:
            half = self._op_halves.get(self.op_offset)
            if half is not None and half >= half_offset:
                break
            self._op_halves.pop(self.op_offset, None)
            self.op_offset += 1

    async def _append(self, message: Message) -> commitlog_pb2.AppendResult:
        request = commitlog_pb2.AppendRequest(message=message_to_proto(message), transaction_flow=True)
        result: commitlog_pb2.AppendResult = await self._commitlog.Append(request, timeout=CALL_TIMEOUT_S)
        return result

    async def _store_host(self) -> str:
        if not self._born_host:
            info = await self._commitlog.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=CALL_TIMEOUT_S)
            self._born_host = info.store_host
        return self._born_host

    async def _check_or_wait(self, record: MessageRecord, times: int) -> bool:
        """The check of a due half when a producer that may be asked about it is connected; else the half
        is put back with its check count as it is and waits for the next round (no producer was asked,
        so no check is spent: 4.9.8 counts it, and a half of a group with none connected is discarded)."""
        group = record.properties.get(tx.PROPERTY_PRODUCER_GROUP, "")
        topic = record.properties.get(PROPERTY_REAL_TOPIC, "")
        watcher = self._watcher_for(group, topic)
        if watcher is not None:
            return await self._check(record, times, watcher)
        result = await self._append(tx.put_back_of(record, tx.check_times(record)))
        if result.status not in STORED:
            return False
        log.info("transaction check: no producer of group %r that may produce to %r is connected: transaction "
                 "%s waits for the next round", group, topic,
                 record.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX))
        return True

    async def _check(self, record: MessageRecord, times: int, watcher: Watcher) -> bool:
        """putBackHalfMsgQueue, then the check to ``watcher``."""
        result = await self._append(tx.put_back_of(record, times))
        if result.status not in STORED:
            log.warning("transaction check: put-back of the half at %d not stored (status %d)",
                        record.commitlog_offset, result.status)
            return False
        self.checks += 1
        CHECKS.inc()
        try:
            topic, queue_id = tx.real_queue(record)
        except tx.NotAHalf:
            topic, queue_id = record.properties.get(PROPERTY_REAL_TOPIC, ""), 0
        check = transaction_pb2.TransactionCheck(
            transaction_id=record.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, ""),
            offset_msg_id=result.msg_id, check_times=times,
            message=common_pb2.Message(topic=topic, queue_id=queue_id, body=record.body, flag=record.flag,
                                       properties=record.properties, born_timestamp=record.born_timestamp,
                                       born_host=record.born_host))
        watcher.queue.put_nowait(check)
        return True

    def _watcher_for(self, group: str, topic: str) -> Watcher | None:
        """The next watcher of ``group`` (round robin) that names ``topic``."""
        watchers = [w for w in self._watchers.get(group, ()) if w.takes(topic)]
        if not watchers:
            return None
        self._turn += 1
        return watchers[self._turn % len(watchers)]

    async def _discard(self, record: MessageRecord, expired: bool) -> bool:
        """resolveDiscardMsg: for a half checked transactionCheckMax times (needDiscard), or born longer
        than fileReservedTime ago (needSkip: its commitlog file may be deleted any time)."""
        result = await self._append(tx.discard_of(record))
        if result.status not in STORED:
            return False
        self.discarded += 1
        DISCARDED.inc()
        why = (f"was born more than fileReservedTime ({self.settings.file_reserved_ms // 3_600_000} h) ago"
               if expired else f"was checked {self.settings.check_max} times without an answer")
        log.warning("transaction %s of producer group %r (real topic %s) %s: discarded to %s (msg id %s)",
                    record.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
                    record.properties.get(tx.PROPERTY_PRODUCER_GROUP), record.properties.get(PROPERTY_REAL_TOPIC),
                    why, tx.CHECK_MAX_TIME_TOPIC, result.msg_id)
        return True

    # -- ends --------------------------------------------------------------------------------------
    async def _read_half(self, commitlog_offset: int) -> MessageRecord:
        deadline = time.monotonic() + READ_WAIT_S
        while True:
            record = self._files.record(commitlog_offset)
            if record is not None:
                return record
            if time.monotonic() >= deadline:
                raise EndError(grpc.StatusCode.NOT_FOUND, f"no record at commitlog offset {commitlog_offset} of this "
                                                          "shard: check offset_msg_id (the half send's offset_msg_id)")
            await asyncio.sleep(0.05)

    async def _live_copy(self, record: MessageRecord, key: str) -> MessageRecord | None:
        """The copy of ``record``'s transaction that an op record must mark, None when it has none."""
        if record.queue_offset >= self.half_offset and record.queue_offset not in self._done:
            return record
        half_max = await self._max_offset(tx.HALF_TOPIC)
        for i in range(self.half_offset, half_max):
            if i in self._done:
                continue
            copy = self._record(i)
            if copy is not None and copy.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == key:
                return copy
        return None

    async def end(self, request: transaction_pb2.EndTransactionRequest,
                  commitlog_offset: int) -> scheduler_pb2.EndHalfResult:
        answer = await self._end(request, commitlog_offset)
        ENDS.labels(resolution=transaction_pb2.TransactionResolution.Name(request.resolution),
                    applied=str(answer.applied).lower()).inc()
        return answer

    async def _end(self, request: transaction_pb2.EndTransactionRequest,
                   commitlog_offset: int) -> scheduler_pb2.EndHalfResult:
        record = await self._read_half(commitlog_offset)
        try:
            tx.real_queue(record)
        except tx.NotAHalf as exc:
            raise EndError(grpc.StatusCode.INVALID_ARGUMENT, f"{exc}: give a half's offset_msg_id") from None
        group = record.properties.get(tx.PROPERTY_PRODUCER_GROUP, "")
        if group != request.producer_group:
            raise EndError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"producer group {request.producer_group!r} is not the half's ({group!r}): end it with the "
                           "group it was sent with")
        key = record.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
        if request.transaction_id and request.transaction_id != key:
            raise EndError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"transaction id {request.transaction_id!r} is not the half's ({key!r})")
        if request.resolution == transaction_pb2.UNKNOWN:
            return scheduler_pb2.EndHalfResult(applied=False)
        # The commit record and the op record are written together or not at all, whatever the caller
        # does: a caller gone between them (its deadline) would leave the half open and a check would
        # commit it a second time. So the pair runs as a task of its own, which a cancelled call leaves running.
        task = asyncio.ensure_future(self._apply(request.resolution, record, key))
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)
        return await asyncio.shield(task)

    async def _apply(self, resolution: int, record: MessageRecord, key: str) -> scheduler_pb2.EndHalfResult:
        """The end of ``record``'s transaction: COMMIT's commit record, then the op record of its live copy."""
        async with self._lock:
            await self._recover()
            await self._read_ops()
            if key and key in self._done_keys:
                return scheduler_pb2.EndHalfResult(applied=False)
            live = await self._live_copy(record, key)
            if live is None:
                return scheduler_pb2.EndHalfResult(applied=False)
            answer = scheduler_pb2.EndHalfResult(applied=True)
            if resolution == transaction_pb2.COMMIT:
                committed = await self._append(tx.commit_of(record))
                if committed.status not in STORED:
                    raise EndError(grpc.StatusCode.UNAVAILABLE, f"the commit was not stored (status "
                                                                f"{committed.status}): end the transaction again")
                answer.committed.CopyFrom(committed)
                self._mark_done(live, key)
                # Committed: the op record must follow. If it cannot be stored now, the next round writes it
                # (and after a crash, the next process derives it from the commit record: _recover).
                try:
                    stored = await self._write_op(live)
                except grpc.aio.AioRpcError as exc:
                    log.warning("transaction end: the op record of the committed half at %d: %s; written later",
                                live.commitlog_offset, exc.code().name)
                    stored = False
                if not stored:
                    self._pending_ops.append(live)
                return answer
            if not await self._write_op(live):
                raise EndError(grpc.StatusCode.UNAVAILABLE, "the op record was not stored: end the transaction again")
            self._mark_done(live, key)
            return answer

    def _mark_done(self, live: MessageRecord, key: str) -> None:
        self._done[live.queue_offset] = None
        if key:
            self._done_keys[key] = live.queue_offset

    async def _write_op(self, live: MessageRecord) -> bool:
        op = await self._append(tx.op_of(live, now_ms(), await self._store_host()))
        if op.status not in STORED:
            log.warning("transaction end: the op record of the half at %d not stored (status %d)",
                        live.commitlog_offset, op.status)
            return False
        return True

    async def _write_pending_ops(self) -> None:
        """The op records of committed halves that could not be stored with their commit (under the lock)."""
        while self._pending_ops:
            if not await self._write_op(self._pending_ops[0]):
                return
            self._pending_ops.pop(0)

    async def _recover(self) -> None:
        """Once, before the first end or round (under the lock): the op record of every live half whose
        commit record is in the log without it (a process that died between the two writes). A commit is
        written after the copy it ends, so the log from the first live half on holds every such commit."""
        if self._recovered:
            return
        await self._read_ops()
        half_max = await self._max_offset(tx.HALF_TOPIC)
        first = self._halves.unit(self.half_offset) if self.half_offset < half_max else None
        if first is not None and is_valid_unit(*first):
            info = await self._commitlog.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=CALL_TIMEOUT_S)
            committed = self._committed_halves(first[0], info.max_offset)
            if committed:
                for live in self._live_copies(committed, half_max):
                    if not await self._write_op(live):
                        self._pending_ops.append(live)
                    key = live.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
                    self._mark_done(live, key)
                    log.warning("transaction %s: committed by an earlier process that stopped before its op "
                                "record; the op record is written now", key or live.commitlog_offset)
        self._recovered = True

    def _committed_halves(self, start: int, end: int) -> set[str | int]:
        """The transactions committed by records in [start, end) of the log: their UNIQ_KEYs (the prepared
        half's commitlog offset for a half without one)."""
        committed: set[str | int] = set()
        position = start
        while position < end:
            record = self._files.record(position)
            if record is None:  # the blank end of a file (or a record that does not decode): the next file
                position = (position // self._commitlog_file_size + 1) * self._commitlog_file_size
                continue
            if record.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_COMMIT_TYPE and record.topic != tx.HALF_TOPIC:
                key = record.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
                committed.add(key or record.prepared_transaction_offset)
            position += record.store_size
        return committed

    def _live_copies(self, committed: set[str | int], half_max: int) -> list[MessageRecord]:
        """The live copies (at or past the half offset, no op record) of the ``committed`` transactions."""
        found = []
        for i in range(self.half_offset, half_max):
            if i in self._done:
                continue
            copy = self._record(i)
            if copy is None:
                continue
            key = copy.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
            if (key or copy.commitlog_offset) in committed:
                found.append(copy)
        return found

    # -- watchers ----------------------------------------------------------------------------------
    def stopping(self) -> None:
        """The server is stopping: end every WatchChecks stream now (the gateway watches the restarted
        scheduler again), so the stop does not wait out the drain grace on streams that never end."""
        self._stopping = True
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.queue.put_nowait(None)

    async def watch(self, group: str, topics: Sequence[str]) -> AsyncIterator[transaction_pb2.TransactionCheck]:
        if self._stopping:
            return
        watcher = Watcher(tuple(topics))
        self._watchers.setdefault(group, []).append(watcher)
        try:
            while (check := await watcher.queue.get()) is not None:
                yield check
        finally:
            watchers = self._watchers.get(group, [])
            if watcher in watchers:
                watchers.remove(watcher)
            if not watchers:
                self._watchers.pop(group, None)


def _call_status(exc: Exception) -> CallStatus | None:
    """The shared table, EndError's own status, and a commitlog that failed the end's write."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return CallStatus(grpc.StatusCode.UNAVAILABLE, f"the commitlog service: {exc.code().name}: {exc.details()}; "
                                                       "end the transaction again")
    return store_status(exc)


#: The service's error path (services/server/status.py).
rpc = RpcEdge(scheduler_pb2.DESCRIPTOR.services_by_name["TransactionService"], status_of=_call_status)


class TransactionServicer(scheduler_pb2_grpc.TransactionServiceServicer):  # type: ignore[misc]
    """The wire edge of :class:`TransactionChecker` (the gateway is its only caller)."""

    def __init__(self, checker: TransactionChecker) -> None:
        self.checker = checker

    @rpc
    async def EndHalf(self, request: scheduler_pb2.EndHalfRequest, context: Any) -> scheduler_pb2.EndHalfResult:
        return await self.checker.end(request.request, request.commitlog_offset)

    @rpc
    async def WatchChecks(self, request: scheduler_pb2.WatchChecksRequest,
                          context: Any) -> AsyncIterator[transaction_pb2.TransactionCheck]:
        check_producer_group(request.producer_group)
        async for check in self.checker.watch(request.producer_group, request.topics):
            yield check


def register(checker: TransactionChecker) -> Any:
    def add(server: grpc.aio.Server) -> None:
        scheduler_pb2_grpc.add_TransactionServiceServicer_to_server(TransactionServicer(checker), server)
    return add
