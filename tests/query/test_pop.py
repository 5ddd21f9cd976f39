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
from services.store.metadata_log import PopChange, metadata_message, parse_change

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


class LogStub:
    """What OffsetLog does on a replicated shard, in-process: each change is encoded as its metadata record,
    parsed back and applied to every replica's tables in log order."""

    def __init__(self, replicas: list[tuple[PopCheckpointTable, ConsumerOffsetTable]]) -> None:
        self.replicas = replicas
        self.records: list[PopChange] = []

    async def caught_up(self) -> None:
        """Every record is applied as it is committed here."""

    async def commit(self, change: PopChange) -> None:
        message = metadata_message(change)
        parsed = parse_change(message.properties["TAGS"], message.body)
        assert isinstance(parsed, PopChange) and parsed == change
        self.records.append(parsed)
        for table, offsets in self.replicas:
            table.apply(parsed)
            offsets.commit(parsed.group, parsed.topic, parsed.queue_id, parsed.committed)


def _queues(table: PopCheckpointTable) -> dict[str, Any]:
    return dict(table._copy()["queues"])


def test_a_replicated_pop_state_is_the_same_on_every_replica_and_replays_to_it(tmp_path: Path) -> None:
    """Hand-outs, acks, invisible-time changes and claims go through the log: a follower's table equals the
    leader's after each call, and replaying the records from any earlier point ends in the same state."""
    async def scenario() -> None:
        pop, offsets = service(tmp_path / "leader")
        follower = (PopCheckpointTable(tmp_path / "follower"), ConsumerOffsetTable(tmp_path / "follower"))
        log = LogStub([(pop.table, offsets), follower])
        pop.offset_log = log  # type: ignore[assignment]
        states = [_queues(follower[0])]

        async def step(call: Any) -> Any:
            result = await call
            assert _queues(follower[0]) == _queues(pop.table), "the follower's pop state is the leader's"
            assert follower[1].query(G, T, 0) == offsets.query(G, T, 0)
            states.append(_queues(follower[0]))
            return result

        first = await step(pop.pop(G, T, 0, 32, 60_000, "*", 2))
        v1 = first.messages[0].version
        changed = await step(pop.change_invisible_time(ref(v1), 0, renew=False))
        again = await step(pop.pop(G, T, 0, 1, 60_000, "*", 2))
        await step(pop.change_invisible_time(ref(again.messages[0].version), 0, renew=True))
        await step(pop.pop(G, T, 0, 32, 60_000, "*", 2))
        [claimed] = await step(pop.claim_exhausted(2, 30_000, 0))
        assert await step(pop.ack(claimed.ref)) == 11
        rest = await step(pop.pop(G, T, 0, 32, 60_000, "*", 2))
        assert [p.message.queue_offset for p in rest.messages] == [11, 12, 13]
        await step(pop.ack(Ref(G, T, 0, 12, rest.messages[1].version)))
        assert changed.version != v1 and len(log.records) == len(states) - 2, "one record per call but the empty pop"
        # A replica whose file was written at record k (or one that lost the file: k = 0) applies the
        # records from k on and ends where the others are.
        for k in range(len(log.records) + 1):
            table = PopCheckpointTable(tmp_path / f"replay-{k}")
            for record in log.records[:k]:
                table.apply(record)
            table.persist()
            restarted = PopCheckpointTable(tmp_path / f"replay-{k}")
            restarted.load()
            for record in log.records[max(0, k - 2):]:  # from a little before: records applied twice
                restarted.apply(record)
            assert _queues(restarted) == _queues(pop.table), f"replayed from record {k}"

    asyncio.run(scenario())


def test_the_pop_file_keeps_the_metadata_queue_offset_it_covers(tmp_path: Path) -> None:
    table = PopCheckpointTable(tmp_path)
    table.apply(PopChange(G, T, 0, 12, 10, {10: (5, 1, 7, None), 11: (6, 2, 8, "k")}, ()))
    table.set_applied(42)
    table.persist()
    loaded = PopCheckpointTable(tmp_path)
    loaded.load()
    assert loaded.applied_metadata == 42 and _queues(loaded) == _queues(table)
    assert loaded.new_version() > 8
