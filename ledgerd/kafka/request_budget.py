"""The bytes of Kafka requests, and of Fetch responses, the gateway holds at once.

Requests: Kafka bounds them with ``queued.max.request.bytes`` (a memory pool its
network threads take each request's buffer from; a connection whose next request does
not fit is muted until memory comes back). The gateway does the same with
``max_queued_request_bytes``: a connection takes a request's size from the budget once
it knows it (the frame's 4-byte length) and before it reads the body, and gives it back
once the request has been handled (its response built). While the budget is spent a
connection reads nothing more, so its peer's TCP window fills and the client waits;
nothing is refused or dropped.

Per connection the gateway already holds at most ``max_inflight_requests`` requests of
at most ``max_request_bytes`` each; this bounds the sum over all connections, which
``max_connections`` alone would let reach thousands of times that.

Responses: Kafka's broker sends fetched records from its files (sendfile), so a
response waiting for its client to read costs it no memory; the gateway builds each
response in memory, and a Fetch's may be 50 MB. So the records of Fetch and ShareFetch
responses, from their read until their last byte went to the socket, are held in a
second budget, ``max_held_response_bytes``: a fetch reads at most what it could take
(:meth:`ByteBudget.take_up_to`; it waits, first come first served and until its
max_wait at most, only when not even room for a first batch is free) and holds what
its response came to until it is written. A client that does not read is closed after
``response_write_timeout_ms`` (``gateway.py``).

Waiters are served in the order they asked (first come, first served), so a large
request is not starved by a stream of small ones.
"""

from __future__ import annotations

import math
from collections import deque

import trio


class ByteBudget:
    """A byte budget with FIFO waiters; see the module docstring."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a request budget of {limit} bytes")
        self.limit = limit
        self.used = 0
        self.waits = 0  # takes that had to wait
        self._waiters: deque[tuple[int, trio.Event]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def take(self, n: int) -> None:
        """Wait until ``n`` bytes fit, then hold them (``n`` larger than the whole budget
        waits for it to be free of everything else, then takes it all alone)."""
        n = min(n, self.limit)
        if not self._waiters and self.used + n <= self.limit:
            # a cancel comes before the bytes are taken, never after (the caller would
            # not know to give them back)
            await trio.lowlevel.checkpoint_if_cancelled()
            if not self._waiters and self.used + n <= self.limit:
                self.used += n
                await trio.lowlevel.cancel_shielded_checkpoint()
                return
        self.waits += 1
        entry = (n, trio.Event())
        self._waiters.append(entry)
        try:
            await entry[1].wait()
        except BaseException:
            if entry[1].is_set():
                self.give(n)  # granted just as the wait was cancelled
            else:
                self._waiters.remove(entry)
                self._grant()  # the next one may fit now
            raise

    async def take_up_to(self, want: int, floor: int, until: float = math.inf) -> int:
        """Hold as much of ``want`` as is free, and at least ``min(want, floor)``:
        waits (first come, first served) only while not even that much is free, and
        only until ``until`` (trio's clock): 0 if no room came by then. Returns the
        bytes held (at most the whole budget); give them back with :meth:`release`."""
        want = min(want, self.limit)
        floor = max(min(floor, want), 1)
        await trio.lowlevel.checkpoint_if_cancelled()  # before taking, as in take
        if not self._waiters and self.used + floor <= self.limit:
            n = min(want, self.limit - self.used)
            self.used += n
            # no cancel from here on: the caller learns of every byte taken
            await trio.lowlevel.cancel_shielded_checkpoint()
            return n
        with trio.move_on_at(until):
            await self.take(floor)  # in turn
            extra = 0 if self._waiters else max(min(want - floor, self.limit - self.used), 0)
            self.used += extra
            return floor + extra
        return 0

    def hold(self, n: int) -> None:
        """Hold ``n`` more bytes at once, past the limit if need be (what a response
        came to beyond what its read took: a first batch larger than the room left)."""
        self.used += n

    def release(self, n: int) -> None:
        """Give back ``n`` bytes of :meth:`take_up_to` or :meth:`hold`."""
        self.used -= n
        if self.used < 0:
            raise RuntimeError(f"a byte budget gave back more than it had: {self.used}")
        self._grant()

    def give(self, n: int) -> None:
        """Give back ``n`` bytes taken with ``take``."""
        self.used -= min(n, self.limit)
        if self.used < 0:
            raise RuntimeError(f"a request budget gave back more than it had: {self.used}")
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            n, event = self._waiters.popleft()
            self.used += n
            event.set()
