"""Named crash points: kill -9 the process at a chosen step, for crash tests.

``LEDGERD_CRASH_AT=name`` (or ``name:n``, the n-th time it is reached) makes
``crash_point(name)`` send SIGKILL to its own process there: the same death as an
operator's ``kill -9`` or a power cut that spares the disk, at a step a test names
instead of a moment it guesses. Unset (always, outside tests) it costs one comparison.

The points are named, with what each leaves on disk, in the one registry of fault
points, ``ledgerd.base.faultpoints.CRASH_POINTS`` (see also docs/storage-format.md,
"Compaction and GC, crash-safe order").
"""

from __future__ import annotations

import os
import signal

from ledgerd.base.faultpoints import CRASH_ENV, CRASH_POINTS, parse_crash_spec

__all__ = ["CRASH_POINTS", "armed", "crash_point"]

_NAME, _remaining = parse_crash_spec(os.environ.get(CRASH_ENV, ""))


def armed(name: str) -> bool:
    return bool(_NAME) and _NAME == name


def crash_point(name: str) -> None:
    """SIGKILL this process if ``LEDGERD_CRASH_AT`` names this point (and its count)."""
    global _remaining
    if not _NAME or _NAME != name:
        return
    _remaining -= 1
    if _remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
