"""Allocation strategies and the rebalance decision (no I/O): RocketMQ's AllocateMessageQueueAveragely
and ...ByCircle, and the hand-over rule (release first; take only queues no other member holds)."""

from __future__ import annotations

import itertools

import pytest

from mqstore.client.rebalance import (
    STRATEGIES,
    AllocateAveragely,
    AllocateAveragelyByCircle,
    AllocationStrategy,
    MemberView,
    plan,
    strategy_of,
)

MEMBERS = ["a", "b", "c"]


def test_average_gives_contiguous_runs_the_first_members_one_more() -> None:
    average = AllocateAveragely()
    assert [average.allocate(m, MEMBERS, list(range(8))) for m in MEMBERS] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [average.allocate(m, MEMBERS, [0, 1]) for m in MEMBERS] == [[0], [1], []]
    assert average.allocate("z", MEMBERS, [0, 1]) == []


def test_by_circle_deals_round_robin() -> None:
    circle = AllocateAveragelyByCircle()
    assert [circle.allocate(m, MEMBERS, list(range(8))) for m in MEMBERS] == [[0, 3, 6], [1, 4, 7], [2, 5]]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_covers_every_queue_exactly_once(name: str) -> None:
    strategy = strategy_of(name)
    for n_members, n_queues in itertools.product(range(1, 6), range(0, 13)):
        members = [f"m{i}" for i in range(n_members)]
        shares = [strategy.allocate(m, members, list(range(n_queues))) for m in members]
        assert sorted(q for share in shares for q in share) == list(range(n_queues))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_custom_strategy_is_a_protocol_and_unknown_names_are_refused() -> None:
    class Everything:
        name = "everything"

        def allocate(self, client_id: str, members: list[str], queues: list[int]) -> list[int]:
            return list(queues)

    assert isinstance(Everything(), AllocationStrategy)
    assert strategy_of(Everything()).name == "everything"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allocation strategy 'nope' is unknown"):
        strategy_of("nope")


def _member(client_id: str, *assigned: int, topic: str = "t") -> MemberView:
    return MemberView(client_id, frozenset({topic}), frozenset((topic, q) for q in assigned))


def test_a_joining_member_waits_for_the_owner_to_release() -> None:
    average = AllocateAveragely()
    members = [_member("a", 0, 1, 2, 3), _member("b")]
    # b should own 2 and 3 but a still holds them: nothing taken yet.
    joining = plan("b", members, {"t": [0, 1, 2, 3]}, {}, average)
    assert joining.acquire == {"t": []} and joining.waiting == {"t": [2, 3]} and joining.waits
    # a sees b: it releases 2 and 3 (after committing them), keeps 0 and 1.
    owner = plan("a", members, {"t": [0, 1, 2, 3]}, {"t": [0, 1, 2, 3]}, average)
    assert owner.release == {"t": [2, 3]} and owner.acquire == {"t": []}
    # Once a reports only 0 and 1, b takes 2 and 3.
    after = plan("b", [_member("a", 0, 1), _member("b")], {"t": [0, 1, 2, 3]}, {}, average)
    assert after.acquire == {"t": [2, 3]} and not after.waits


def test_a_dead_members_queues_are_taken_once_it_is_dropped() -> None:
    average = AllocateAveragely()
    queues = {"t": [0, 1, 2, 3, 4, 5]}
    # b (2, 3) stopped heartbeating but is not dropped yet: a and c keep their shares.
    before = [_member("a", 0, 1), _member("b", 2, 3), _member("c", 4, 5)]
    assert plan("a", before, queues, {"t": [0, 1]}, average).acquire == {"t": []}
    # b is dropped: its queues are free and each survivor takes its new share.
    after = [_member("a", 0, 1), _member("c", 4, 5)]
    assert plan("a", after, queues, {"t": [0, 1]}, average).acquire == {"t": [2]}
    assert plan("c", after, queues, {"t": [4, 5]}, average).acquire == {"t": [3]}


def test_only_members_of_a_topic_share_it() -> None:
    average = AllocateAveragely()
    members = [_member("a"), MemberView("b", frozenset({"other"}), frozenset())]
    assert plan("a", members, {"t": [0, 1]}, {}, average).acquire == {"t": [0, 1]}
