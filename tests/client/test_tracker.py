"""OffsetTracker alone: every GetMessageStatus moves the consumer correctly (no system needed)."""

from __future__ import annotations

from mqstore.client.consumer import OffsetTracker, max_long_poll_of
from mqstore.client.errors import InvalidArgumentError, NotFoundError
from mqstore.v1 import query_pb2

S = query_pb2


def _answer(status: int, next_begin: int, offsets: tuple[int, ...] = (), max_offset: int = 100) -> object:
    messages = [S.StoredMessage(topic="t", queue_id=0, queue_offset=o, uniq_key=f"U{o}", msg_id=f"M{o}")
                for o in offsets]
    return S.PullMessageResponse(status=status, messages=messages, next_begin_offset=next_begin, max_offset=max_offset)


def test_found_messages_are_delivered_in_order_and_committed_as_delivered() -> None:
    tracker = OffsetTracker({0: (10, None)})
    assert tracker.absorb(0, 10, _answer(S.GET_MESSAGE_STATUS_FOUND, 14, (10, 11, 12, 13))) == 4
    assert tracker.fetchable() == []  # nothing is pulled while messages of the queue wait
    assert [m.queue_offset for m in tracker.take(3)] == [10, 11, 12]
    assert tracker.to_commit() == [(0, 13)]
    assert [m.queue_offset for m in tracker.take(3)] == [13]
    assert tracker.to_commit() == [(0, 14)] and tracker.fetchable() == [0]
    tracker.committed(0, 14)
    assert tracker.to_commit() == []


def test_filtered_gaps_count_as_consumed() -> None:
    tracker = OffsetTracker({0: (0, 0)})
    tracker.absorb(0, 0, _answer(S.GET_MESSAGE_STATUS_FOUND, 9, (3, 7)))
    assert [m.queue_offset for m in tracker.take(10)] == [3, 7]
    assert tracker.positions() == {0: 9}
    tracker.absorb(0, 9, _answer(S.GET_MESSAGE_STATUS_NO_MATCHED_MESSAGE, 20))
    assert tracker.positions() == {0: 20} and tracker.lag() == {0: 80}


def test_every_status_moves_to_next_begin_offset() -> None:
    for status, start, next_begin in ((S.GET_MESSAGE_STATUS_OFFSET_TOO_SMALL, 0, 50),
                                      (S.GET_MESSAGE_STATUS_OFFSET_OVERFLOW_BADLY, 500, 100),
                                      (S.GET_MESSAGE_STATUS_OFFSET_OVERFLOW_ONE, 100, 100),
                                      (S.GET_MESSAGE_STATUS_OFFSET_FOUND_NULL, 30, 40),
                                      (S.GET_MESSAGE_STATUS_MESSAGE_WAS_REMOVING, 30, 31),
                                      (S.GET_MESSAGE_STATUS_NO_MESSAGE_IN_QUEUE, 5, 0)):
        tracker = OffsetTracker({0: (start, None)})
        assert tracker.absorb(0, start, _answer(status, next_begin)) == 0
        assert tracker.queues[0].fetch_offset == next_begin == tracker.positions()[0], status


def test_answers_for_an_old_position_are_dropped_after_a_seek() -> None:
    tracker = OffsetTracker({0: (0, None), 1: (0, None)})
    tracker.seek(0, 42)
    assert tracker.absorb(0, 0, _answer(S.GET_MESSAGE_STATUS_FOUND, 2, (0, 1))) == 0
    assert tracker.positions() == {0: 42, 1: 0}


def test_take_rotates_over_queues() -> None:
    tracker = OffsetTracker({0: (0, None), 1: (0, None)})
    tracker.absorb(0, 0, _answer(S.GET_MESSAGE_STATUS_FOUND, 3, (0, 1, 2)))
    answer = _answer(S.GET_MESSAGE_STATUS_FOUND, 3, (0, 1, 2))
    for m in answer.messages:  # type: ignore[attr-defined]
        m.queue_id = 1
    tracker.absorb(1, 0, answer)
    first = tracker.take(2)
    second = tracker.take(2)
    assert {m.queue_id for m in first} == {0} and second[0].queue_id == 1


def test_the_servers_long_poll_limit_is_read_from_its_refusal() -> None:
    refusal = InvalidArgumentError("INVALID_ARGUMENT", "long poll 20000 ms must be within 0..5000")
    assert max_long_poll_of(refusal) == 5000
    assert max_long_poll_of(NotFoundError("NOT_FOUND", "long poll 20000 ms must be within 0..5000")) is None
