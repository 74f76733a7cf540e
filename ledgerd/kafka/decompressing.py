"""How many produced or stored batches the gateway decompresses at once.

A batch of a few kilobytes may expand to ``MAX_RECORDS_BYTES`` (64 MiB), and each
expansion runs in a worker thread (trio's default allows 40): an outside probe had 24
connections each producing one such batch take the gateway from 146 MB to 1.8 GB.
Every decompression of client data (Produce v0-2 up-conversion, the record check of a
compressed batch, recompression to the topic's codec, the compacted topic's key check,
ListOffsets by time) borrows from one limiter of ``AT_ONCE`` per trio run, so they hold
at most ``AT_ONCE`` expansions in memory together.
"""

from __future__ import annotations

import trio
from trio.lowlevel import RunVar

__all__ = ["AT_ONCE", "limiter"]

AT_ONCE = 2  # one a core here

_LIMITER: RunVar[trio.CapacityLimiter] = RunVar("ledgerd_kafka_decompressing")


def limiter() -> trio.CapacityLimiter:
    """This trio run's limiter of decompressions."""
    try:
        return _LIMITER.get()
    except LookupError:
        made = trio.CapacityLimiter(AT_ONCE)
        _LIMITER.set(made)
        return made
