"""The bytes of Kafka requests the gateway holds at once, over every connection.

Kafka bounds them with ``queued.max.request.bytes`` (a memory pool its network threads
take each request's buffer from; a connection whose next request does not fit is
muted until memory comes back). The gateway does the same with
``max_queued_request_bytes``: a connection takes a request's size from the budget once
it knows it (the frame's 4-byte length) and before it reads the body, and gives it back
once the request has been handled (its response built). While the budget is spent a
connection reads nothing more, so its peer's TCP window fills and the client waits;
nothing is refused or dropped.

Per connection the gateway already holds at most ``max_inflight_requests`` requests of
at most ``max_request_bytes`` each; this bounds the sum over all connections, which
``max_connections`` alone would let reach thousands of times that.

Waiters are served in the order they asked (first come, first served), so a large
request is not starved by a stream of small ones. Responses waiting to be written are
not counted (as in Kafka): each is bounded by what its request may ask for.
"""

from __future__ import annotations

from collections import deque

import trio


class RequestBudget:
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
            self.used += n
            await trio.lowlevel.checkpoint()
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
