"""The gateway's lease on leadership: how long its ZooKeeper session is known to be alive.

A gateway leads (writes, answers the high watermark of, checks producer sequences for)
the partitions that rendezvous hashing gives it over the gateways registered in
ZooKeeper. Another gateway takes a partition over only once this one's registration is
gone, and an ephemeral node goes only when its session expires: ZooKeeper expires a
session a session timeout after it last heard from the client, so a reply to a request
sent at ``t`` proves the session alive until at least ``t + session timeout``.

Leadership is therefore held as a lease: valid for ``duration`` (a fraction of the
session timeout, for margin) after the sending time of the last request ZooKeeper
answered in this session. A process that was stopped (SIGSTOP, a long pause, a
suspended VM) wakes with a lapsed lease, because the monotonic clock ran on, and must
confirm its session before it writes or answers from what it remembers: its writers,
its producers' sequences and its high watermarks may all be stale, as another gateway
may have led its partitions meanwhile. If the session it confirms is not the one its
state was built under (the old one expired), the state is dropped before anything is
served; it is rebuilt from the log when the partition is used again.

Pure: time comes in as ``now``; the gateway does the ZooKeeper calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LEASE_FRACTION", "Lease"]

LEASE_FRACTION = 0.5  # of the ZooKeeper session timeout


@dataclass(slots=True)
class Lease:
    """``duration``: seconds a confirmation holds. ``session_id``: the session the
    gateway's leadership state was built under (0: none yet)."""

    duration: float
    session_id: int = 0
    confirmed_at: float = -math.inf  # sending time of the last answered request
    suspended: bool = False  # the connection to ZooKeeper is down (session may live)

    def __post_init__(self) -> None:
        if not self.duration > 0:
            raise ValueError(f"lease duration must be positive, got {self.duration}")

    def is_valid(self, now: float) -> bool:
        """True while the gateway may act as a leader without asking ZooKeeper."""
        return not self.suspended and now < self.confirmed_at + self.duration

    def expires_at(self) -> float:
        return -math.inf if self.suspended else self.confirmed_at + self.duration

    def on_confirmed(self, *, session_id: int, asked_at: float) -> bool:
        """ZooKeeper answered a request sent at ``asked_at`` in session ``session_id``.
        Returns True if that is not the session the leadership state was built under:
        the caller drops the state (writers, producers, high watermarks) before it
        serves again, then calls :meth:`on_rebuilt`. The lease stays lapsed meanwhile."""
        if session_id == 0:
            return False  # no session at all: nothing confirmed
        if self.session_id and session_id != self.session_id:
            self.confirmed_at = -math.inf
            return True
        self.session_id = session_id
        self.suspended = False
        self.confirmed_at = max(self.confirmed_at, asked_at)
        return False

    def on_rebuilt(self, *, session_id: int, asked_at: float) -> None:
        """The state of the old session is gone; the new session leads from now on."""
        self.session_id = session_id
        self.suspended = False
        self.confirmed_at = asked_at

    def on_suspended(self) -> None:
        """The connection dropped: until ZooKeeper answers again, the session may be
        expiring, so the lease holds no more."""
        self.suspended = True

    def on_lost(self) -> None:
        """The session expired: whatever was built under it is void."""
        self.suspended = True
        self.confirmed_at = -math.inf
