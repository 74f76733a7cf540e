"""A driver's sleep between a machine's deadlines.

A driver loops: ask its machine for ``next_deadline()``, sleep until then, call
``on_timer(now)``. Two things end a sleep early:

- ``wake()`` ends an *idle* sleep (no deadline). A machine's deadline never moves
  earlier while the driver sleeps on it (new sends time out after the ones before
  them), so whoever gives an idle machine something to wait for wakes it, and a hot
  path (one call per append) pays no task switch while a deadline stands.
- ``interrupt()`` ends any sleep: for a driver whose loop ends on something other than
  a deadline (a read driver, once every entry is decided).
"""

from __future__ import annotations

import math

import trio

__all__ = ["DeadlineSleep"]


class DeadlineSleep:
    def __init__(self) -> None:
        self._idle: trio.Event | None = None
        self._any: trio.Event | None = None

    def wake(self) -> None:
        """End an idle sleep (a no-op while sleeping on a deadline, or awake)."""
        if self._idle is not None:
            self._idle.set()

    def interrupt(self) -> None:
        """End the current sleep, whatever it waits for."""
        if self._any is not None:
            self._any.set()

    async def until(self, deadline: float | None) -> bool:
        """Sleep until ``deadline`` (True: it passed, apply the timers) or until woken
        (False: recompute). With None, only ``wake``/``interrupt`` end it. Cancellation
        leaves nothing behind."""
        self._any = event = trio.Event()
        if deadline is None:
            self._idle = event
        try:
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await event.wait()
                return False
            return True
        finally:
            self._idle = self._any = None
