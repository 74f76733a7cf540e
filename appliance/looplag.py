"""How late the event loop runs what is due: the bookie's own stall detector.

A task asks to wake every ``interval`` seconds and records how much later than asked it
actually ran. Anything that holds the loop (a long synchronous step, a GIL-holding
thread, the machine's CPU queue) shows up as lag, and every request waiting behind it
sees the same delay. Exported as ``ledgerd_bookie_event_loop_lag_seconds``; lags over
``warn_after`` are logged with their size, so a latency spike on a dashboard can be
told apart from a slow disk (``ledgerd_journal_sync_seconds``).

A lag says how long, not what. So a watchdog thread beside the monitor looks at the
monitor's last tick every ``warn_after / 2``; once a tick is ``warn_after`` overdue
while the loop is held, it takes the loop thread's Python stack at that moment
(``sys._current_frames``) and logs it once per stall as ``event_loop_held`` (innermost
frame first): a long synchronous step shows its own code; a loop thread blocked in a
system call shows the call. If the whole process was off the CPU the watchdog was too,
and the stack it logs on resuming is only where the loop happened to be. The thread
wakes 20 times a second at the default and takes no lock the loop takes.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

import trio

from ledgerd.appliance.metrics import FastHistogram
from ledgerd.base.logs import fields

__all__ = ["loop_lag_monitor"]

log = logging.getLogger(__name__)

_STACK_FRAMES = 12  # frames of the loop thread's stack logged, innermost first


async def loop_lag_monitor(histogram: FastHistogram, *, interval: float = 0.01,
                           warn_after: float = 0.1,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                           ) -> None:
    """Measure the loop's lag every ``interval`` until cancelled; a watchdog thread
    logs the loop thread's stack when a tick is ``warn_after`` overdue."""
    clock = time.perf_counter
    watch = _Watchdog(threading.get_ident(), warn_after, clock)
    watch.start()
    task_status.started()
    try:
        while True:
            asked = clock() + interval
            watch.due = asked
            await trio.sleep(interval)
            lag = max(0.0, clock() - asked)
            histogram.observe(lag)
            if lag >= warn_after:
                log.warning("event_loop_stalled", extra=fields(lag_ms=round(lag * 1000, 1)))
    finally:
        watch.stop()


class _Watchdog:
    """The thread that names what holds the loop; see the module docstring."""

    def __init__(self, loop_thread: int, late: float, clock: Callable[[], float]) -> None:
        self.loop_thread = loop_thread
        self.late = late  # how far past ``due`` a tick is a stall
        self.clock = clock
        self.due = float("inf")  # when the monitor's next tick should run
        self._reported = -1.0  # the ``due`` of the stall logged last
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledgerd-loop-watchdog",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.late / 2) and self.look():
            pass

    def look(self) -> bool:
        """One look: log the loop thread's stack if the tick due is ``late`` overdue
        and this stall was not logged yet. False once the loop's thread is gone."""
        due = self.due
        held = self.clock() - due
        if held < self.late or due == self._reported:
            return True
        self._reported = due
        frame = sys._current_frames().get(self.loop_thread)
        if frame is None:
            return False
        stack = traceback.extract_stack(frame, limit=_STACK_FRAMES)
        log.warning("event_loop_held", extra=fields(
            held_ms=round(held * 1000, 1),
            stack=" <- ".join(f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.lineno})"
                              for f in reversed(stack))))
        return True
