"""Named crash points: kill -9 the process at a chosen step, for crash tests.

``LEDGERD_CRASH_AT=name`` (or ``name:n``, the n-th time it is reached) makes
``crash_point(name)`` send SIGKILL to its own process there: the same death as an
operator's ``kill -9`` or a power cut that spares the disk, at a step a test names
instead of a moment it guesses. Unset (always, outside tests) it costs one comparison.

The points (see docs/storage-format.md, "Compaction and GC, crash-safe order"):
``compaction.copying`` (after a first batch of live entries was re-appended),
``compaction.copied`` (the copies durable, the index not yet pointing at them),
``compaction.index_flush`` (the index written, not yet fsynced),
``compaction.deleting`` (the index durable, the old log not yet unlinked),
``gc.deleting_ledgers`` (a ledger's index unlinked, the others not yet),
``gc.deleting_logs`` (dead logs about to be unlinked),
``index.created`` (a checkpoint made a ledger's index file, its header not yet written).
"""

from __future__ import annotations

import os
import signal

__all__ = ["armed", "crash_point"]

_SPEC = os.environ.get("LEDGERD_CRASH_AT", "")
_NAME, _, _COUNT = _SPEC.partition(":")
_remaining = int(_COUNT) if _COUNT else 1


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
