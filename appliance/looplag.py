"""How late the event loop runs what is due: the bookie's own stall detector.

A task asks to wake every ``interval`` seconds and records how much later than asked it
actually ran. Anything that holds the loop (a long synchronous step, a GIL-holding
thread, the machine's CPU queue) shows up as lag, and every request waiting behind it
sees the same delay. Exported as ``ledgerd_bookie_event_loop_lag_seconds``; lags over
``warn_after`` are logged with their size, so a latency spike on a dashboard can be
told apart from a slow disk (``ledgerd_journal_sync_seconds``).
"""

from __future__ import annotations

import logging
import time

import trio

from ledgerd.appliance.metrics import FastHistogram
from ledgerd.base.logs import fields

__all__ = ["loop_lag_monitor"]

log = logging.getLogger(__name__)

async def loop_lag_monitor(histogram: FastHistogram, *, interval: float = 0.01,
                           warn_after: float = 0.1,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                           ) -> None:
    """Measure the loop's lag every ``interval`` until cancelled."""
    task_status.started()
    clock = time.perf_counter
    while True:
        asked = clock() + interval
        await trio.sleep(interval)
        lag = max(0.0, clock() - asked)
        histogram.observe(lag)
        if lag >= warn_after:
            log.warning("event_loop_stalled", extra=fields(lag_ms=round(lag * 1000, 1)))
