"""Pop consumption in the query service (services/query/pop.py), over a stub puller: hand-out, FIFO
groups, versions of receipts, renewals, the dead-letter claim, the committed offset, the checkpoint
file across a restart, and a reset of the group's offset through mqstore.v1."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from services.query.consumer_offsets import ConsumerOffsetTable
from services.query.errors import FailedPreconditionError
from services.query.pop import PopService, Ref
from services.query.pop_checkpoints import PopCheckpointTable
from services.query.pull import GetMessageStatus, PullResult
from services.store.errors import NotFoundError

G, T = "group", "topic"


@dataclasses.dataclass
class Stored:
    queue_offset: int
    properties: dict[str, str]
    msg_id: str = ""
    reconsume_times: int = 0


class StubPuller:
    """Queue 0 holds offsets 10..13; 10 and 11 are one message group."""

    def __init__(self) -> None:
        self.messages = [Stored(10, {"__SHARDINGKEY": "g"}), Stored(11, {"__SHARDINGKEY": "g"}), Stored(12, {}),
                         Stored(13, {})]
        for m in self.messages:
            m.msg_id = f"id-{m.queue_offset}"

    async def pull(self, query: Any) -> PullResult:
        found = [m for m in self.messages if m.queue_offset >= query.queue_offset][:query.max_messages]
        if not found:
            return PullResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, query.queue_offset, 10, 14)
        return PullResult(GetMessageStatus.FOUND, found[-1].queue_offset + 1, 10, 14, found)  # type: ignore[arg-type]


class StubOffsets:
    async def offset_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        return 10, 14


def service(root: Path) -> tuple[PopService, ConsumerOffsetTable]:
    offsets = ConsumerOffsetTable(root)
    table = PopCheckpointTable(root)
    table.load()
    return PopService(table, offsets, StubPuller(), StubOffsets()), offsets  # type: ignore[arg-type]


def ref(version: int, offset: int = 10) -> Ref:
    return Ref(G, T, 0, offset, version)


def test_pop_ack_change_claim_and_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        pop, offsets = service(tmp_path)
        first = await pop.pop(G, T, 0, 32, 60_000, "*", 2)
        assert [p.message.queue_offset for p in first.messages] == [10], "11 waits for 10 (its message group)"
        assert first.fifo_blocked and first.pop_offset == 11 and offsets.query(G, T, 0) == 10
        v1 = first.messages[0].version
        assert first.messages[0].attempts == 1

        changed = await pop.change_invisible_time(ref(v1), 0, renew=False)
        assert changed.version != v1
        with pytest.raises(FailedPreconditionError, match="earlier hand-out"):
            await pop.ack(ref(v1))
        again = await pop.pop(G, T, 0, 1, 60_000, "*", 2)
        [popped] = again.messages
        assert (popped.message.queue_offset, popped.attempts) == (10, 2)
        renewed = await pop.change_invisible_time(ref(popped.version), 0, renew=True)
        assert renewed.version == popped.version, "a renewal keeps the receipt valid"

        # Restart: the checkpoint file keeps offsets, attempts and versions.
        pop.table.persist()
        offsets.persist()
        pop, offsets = service(tmp_path)
        offsets.load()
        exhausted = await pop.pop(G, T, 0, 32, 60_000, "*", 2)
        assert exhausted.messages == [] and exhausted.fifo_blocked, "delivered twice: left to the claim"
        [claimed] = await pop.claim_exhausted(2, 30_000, 0)
        assert (claimed.ref.offset, claimed.msg_id, claimed.attempts, claimed.reconsume_times) == (10, "id-10", 2, 0)
        assert await pop.claim_exhausted(2, 30_000, 0) == [], "claimed once"
        with pytest.raises(FailedPreconditionError):
            await pop.ack(ref(popped.version))
        assert await pop.ack(claimed.ref) == 11
        with pytest.raises(NotFoundError, match="not in flight"):
            await pop.ack(claimed.ref)
        rest = await pop.pop(G, T, 0, 32, 60_000, "*", 2)
        assert [p.message.queue_offset for p in rest.messages] == [11, 12, 13]

        offsets.commit(G, T, 0, 12)  # a reset through mqstore.v1
        reset = await pop.pop(G, T, 0, 32, 60_000, "*", 2)
        assert [p.message.queue_offset for p in reset.messages] == [12, 13]
        assert [p.attempts for p in reset.messages] == [1, 1]

    asyncio.run(scenario())
