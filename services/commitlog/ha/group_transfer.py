"""SYNC_MASTER's wait: a put is acknowledged only once enough in-sync followers hold its bytes.

RocketMQ 4.9.8's HAService.GroupTransferService and isSlaveOK, as one condition the put path waits
on after its group-commit flush (CommitLog._handle_flush calls :meth:`GroupTransfer.wait_for_replicas`).
A follower counts once it passed the handshake (mqstore replicas) and reported an offset; it is in
sync while it is less than ``haSlaveFallbehindMax`` bytes behind the leader. A put that finds too few
followers in sync fails at once (SLAVE_NOT_AVAILABLE); one whose followers do not report its end
within ``haSendTimeout`` fails then (FLUSH_SLAVE_TIMEOUT). Either way the producer gets UNAVAILABLE
naming the shard, each follower and its lag, never an ack of a single copy.

What "hold" means is the follower's: it reports the offset it has written (ASYNC_FLUSH) or flushed
(SYNC_FLUSH) (``ha_client.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.commitlog.put_result import PutMessageStatus
from services.store.errors import UnavailableError

log = logging.getLogger(__name__)
#: Followers that left, kept to be named in a refusal.
DEPARTED_KEPT = 4


class ReplicaAckError(UnavailableError):
    """The put is on the leader's log, but not on enough followers to be acknowledged."""

    def __init__(self, status: PutMessageStatus, detail: str) -> None:
        super().__init__(f"{status.name}: {detail}")
        self.status = status


@dataclass(slots=True)
class Follower:
    """One connected follower, as the leader sees it."""

    address: str
    replica: str = ""  # its name in the shard's in-sync set (an mqstore follower under etcd leadership)
    acked_offset: int = -1  # the last offset it reported; -1 before its first report
    connected_at: float = field(default_factory=time.monotonic)
    left_at: float = 0.0  # when its connection closed (0: connected)
    # Its lag in time (ha_metrics.py): the leader's max offset at its previous report, and when it last
    # reported holding that much; whether it is lagging (behind for longer than haSendTimeout) as last logged.
    target: int = 0
    caught_up_at: float = field(default_factory=time.monotonic)
    lagging: bool = False

    def lag_s(self, leader_max: int) -> float:
        """Seconds since it last held everything the leader had at its previous report (0: it holds all)."""
        return 0.0 if self.acked_offset >= leader_max else time.monotonic() - self.caught_up_at

    def describe(self, leader_max: int) -> str:
        state = f"disconnected {time.monotonic() - self.left_at:.1f} s ago, " if self.left_at else ""
        if self.acked_offset < 0:
            return f"{self.address} ({state}no offset reported)"
        return (f"{self.address} ({state}at offset {self.acked_offset}, "
                f"lag {max(0, leader_max - self.acked_offset)} bytes)")


class GroupTransfer:
    """The followers of one leader and the offsets they acknowledged; thread-safe."""

    def __init__(self, shard: str, leader_max_offset: Callable[[], int], followers_needed: int,
                 timeout_s: float, fallbehind_max: int) -> None:
        self.shard = shard
        self._leader_max = leader_max_offset
        self.followers_needed = followers_needed
        self._timeout_s = timeout_s
        self._fallbehind_max = fallbehind_max
        self._cond = threading.Condition()
        self._changes = 0  # counts joins, departures, reports and notifications (under _cond)
        self._followers: list[Follower] = []
        self._departed: list[Follower] = []  # the last few that left, named when a put cannot be acked

    # -- the followers' side ----------------------------------------------------------------
    def add(self, address: str, replica: str = "") -> Follower:
        follower = Follower(address, replica, target=self._leader_max())
        with self._cond:
            self._followers.append(follower)
            self._changes += 1
        return follower

    def remove(self, follower: Follower) -> None:
        with self._cond:
            if follower in self._followers:
                self._followers.remove(follower)
                follower.left_at = time.monotonic()
                self._departed = [*self._departed[-(DEPARTED_KEPT - 1):], follower]
            self._changes += 1
            self._cond.notify_all()

    def acknowledge(self, follower: Follower, offset: int) -> None:
        with self._cond:
            follower.acked_offset = offset
            self._changes += 1
            self._cond.notify_all()
        now, leader_max = time.monotonic(), self._leader_max()
        if offset >= follower.target:
            follower.caught_up_at = now
        follower.target = leader_max
        lag_s = 0.0 if offset >= leader_max else now - follower.caught_up_at
        if (lag_s > self._timeout_s) != follower.lagging:
            follower.lagging = not follower.lagging
            log.warning("shard %s: follower %s %s: %d bytes behind, last caught up %.0f ms ago (haSendTimeout %.0f ms)",
                        self.shard, follower.replica or follower.address,
                        "is LAGGING" if follower.lagging else "caught up again", max(0, leader_max - offset),
                        lag_s * 1000, self._timeout_s * 1000,
                        extra={"shard": self.shard, "follower": follower.replica or follower.address})

    @property
    def followers(self) -> list[Follower]:
        with self._cond:
            return list(self._followers)

    @property
    def changes(self) -> int:
        """A count that moves whenever a follower joins, leaves or reports: read it before looking at
        the followers, and :meth:`wait_change` returns at once if anything changed since."""
        with self._cond:
            return self._changes

    def wait_change(self, timeout_s: float, seen: int) -> None:
        """Block until a follower joins, leaves or reports after :attr:`changes` was ``seen``, or
        ``timeout_s`` passes. (Without ``seen``, a report between the caller's look and this wait would
        be missed, and the put would sleep the whole timeout.)"""
        with self._cond:
            self._cond.wait_for(lambda: self._changes != seen, timeout_s)

    def notify(self) -> None:
        with self._cond:
            self._changes += 1
            self._cond.notify_all()

    def describe_followers(self) -> str:
        with self._cond:
            leader_max = self._leader_max()
            return "; ".join(f.describe(leader_max) for f in self._followers) or "none connected"

    # -- the put's side ---------------------------------------------------------------------
    def wait_for_replicas(self, end: int) -> None:
        """Return once ``followers_needed`` followers report at least ``end``; ReplicaAckError otherwise."""
        deadline = time.monotonic() + self._timeout_s
        with self._cond:
            if self._count_at(end) >= self.followers_needed:
                return
            leader_max = self._leader_max()
            in_sync = sum(1 for f in self._followers
                          if f.acked_offset >= 0 and leader_max - f.acked_offset < self._fallbehind_max)
            if in_sync < self.followers_needed:
                raise ReplicaAckError(PutMessageStatus.SLAVE_NOT_AVAILABLE, self._describe(
                    end, f"{in_sync} follower(s) in sync, SYNC_MASTER needs {self.followers_needed} "
                         f"(minInSyncReplicas, haSlaveFallbehindMax {self._fallbehind_max} bytes)"))
            while self._count_at(end) < self.followers_needed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ReplicaAckError(PutMessageStatus.FLUSH_SLAVE_TIMEOUT, self._describe(
                        end, f"fewer than {self.followers_needed} follower(s) reported offset {end} within "
                             f"haSendTimeout ({self._timeout_s * 1000:.0f} ms)"))
                self._cond.wait(remaining)

    def _count_at(self, end: int) -> int:
        return sum(1 for f in self._followers if f.acked_offset >= end)

    def _describe(self, end: int, why: str) -> str:
        leader_max = self._leader_max()
        followers = "; ".join(f.describe(leader_max) for f in self._followers) or "none connected"
        if self._departed:
            followers += "; gone: " + "; ".join(f.describe(leader_max) for f in self._departed)
        return (f"shard {self.shard}: the message was written on the leader (up to commitlog offset {end}) but is "
                f"not replicated: {why}; followers: {followers}. It is NOT acknowledged: a resend may store it "
                "twice (deduplicate by UNIQ_KEY)")
