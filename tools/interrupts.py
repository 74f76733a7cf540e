"""Spawning a child process so that Ctrl-C cannot orphan it.

A KeyboardInterrupt raised inside ``subprocess.Popen`` after its fork leaves a child
whose PID nobody holds: ``ledgerd local`` interrupted while starting would leave that
bookie or ZooKeeper running. ``signals_deferred`` holds SIGINT and SIGTERM for the few
milliseconds of a spawn (in the main thread, where Python runs signal handlers) and
sends them again once the ``Popen`` object exists, so the interrupt lands where the
caller can stop what it started.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["signals_deferred"]

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the body; any that came are sent again after it
    (to the handlers in place before). Outside the main thread it does nothing (signals
    are handled there only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        got.append(signum)

    before = {s: signal.signal(s, hold) for s in _HELD}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(got):
            os.kill(os.getpid(), signum)
