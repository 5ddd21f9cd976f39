"""PutBatcher: many concurrent producers, few engine calls, errors kept per producer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.commitlog.message_store import MessageStore
from services.commitlog.put_batcher import PutBatcher
from services.commitlog.put_result import PutMessageError, PutMessageStatus
from services.store.config import load_config
from services.store.formats.message import Message
from services.store.formats.record import decode_record


def test_concurrent_producers_get_their_own_results_and_errors(tmp_path: Path) -> None:
    config = load_config(environ={}, mapped_file_size_commit_log=256 * 1024, flush_disk_type="SYNC_FLUSH")
    log = MessageStore(config, tmp_path)
    log.start()
    calls = 0
    put_each = log.put_each

    def counting_put_each(messages: list[Message]) -> list[object]:
        nonlocal calls
        calls += 1
        return put_each(messages)  # type: ignore[return-value]

    log.put_each = counting_put_each  # type: ignore[method-assign]

    async def run() -> None:
        batcher = PutBatcher(log)
        batcher.start()

        async def producer(p: int) -> list[tuple[int, int, int]]:
            seen = []
            for i in range(50):
                if i == 25 and p % 2:  # every odd producer sends one bad message
                    with pytest.raises(PutMessageError) as info:
                        await batcher.put(Message("Topic Bad", 0, b"x"))
                    assert info.value.status is PutMessageStatus.MESSAGE_ILLEGAL
                    continue
                result = await batcher.put(Message("TopicP", p % 4, f"{p}:{i}".encode()))
                assert result.status is PutMessageStatus.PUT_OK
                seen.append((result.commitlog_offset, result.wrote_bytes, result.queue_offset))
            return seen

        per_producer = await asyncio.gather(*[producer(p) for p in range(32)])
        await batcher.close()
        offsets = sorted(o for seen in per_producer for o in seen)
        assert len(offsets) == 32 * 50 - 16
        for commitlog_offset, size, _ in offsets:  # every acknowledged record reads back whole
            record = decode_record(log.read(commitlog_offset, size))
            assert record.commitlog_offset == commitlog_offset
        for queue_id in range(4):  # queue offsets are dense per queue
            queue = sorted(decode_record(log.read(o, s)).queue_offset for o, s, _ in offsets
                           if decode_record(log.read(o, s)).queue_id == queue_id)
            assert queue == list(range(len(queue)))

    asyncio.run(run())
    assert calls < 32 * 50 / 4  # batched: far fewer engine calls than messages
    assert log.commit_log.mfq.flushed_where == log.max_offset  # acknowledged under SYNC_FLUSH means flushed
    log.shutdown()
