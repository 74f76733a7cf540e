"""A driver's sleep between a machine's deadlines.

A driver loops: ask its machine for ``next_deadline()``, sleep until then, call
``on_timer(now)``. With no deadline (nothing waits for an answer) it sleeps until woken:
whoever gives the machine something to wait for calls ``wake()``. A deadline never moves
earlier while the driver sleeps on it (new sends time out after the ones before them),
so only the idle sleep needs waking, and the hot paths pay one attribute check.
"""

from __future__ import annotations

import trio

__all__ = ["DeadlineSleep"]


class DeadlineSleep:
    def __init__(self) -> None:
        self._idle: trio.Event | None = None

    def wake(self) -> None:
        """End an idle sleep (a no-op while sleeping on a deadline, or awake)."""
        if self._idle is not None:
            self._idle.set()

    async def until(self, deadline: float | None) -> bool:
        """Sleep until ``deadline`` (True: it passed, apply the timers) or, with None,
        until ``wake()`` (False: recompute the deadline). Cancellation leaves nothing."""
        if deadline is not None:
            await trio.sleep_until(deadline)
            return True
        self._idle = event = trio.Event()
        try:
            await event.wait()
        finally:
            self._idle = None
        return False
