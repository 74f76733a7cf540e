"""Payload sizes for crash and fault tests: 1 B to 64 KiB, many near 4096 multiples.

A fixed payload size hid the journal's padding bug for eleven passes: only records ending
1-8 bytes short of a 4096-byte boundary triggered it. ``payload_size`` draws half of its
sizes so that the stored record (payload plus ``overhead`` bytes of framing) ends within
16 bytes either side of a multiple of 4096, and the rest log-uniformly over 1 B - 64 KiB,
so small and large payloads both appear.
"""

from __future__ import annotations

import math
import random

__all__ = ["JOURNAL_ENTRY_OVERHEAD", "MAX_PAYLOAD", "payload_size"]

MAX_PAYLOAD = 64 * 1024
# What a journal ENTRY record adds to a payload with a CRC32C digest: record prefix 9,
# ledger and entry ids 16, entry header 32, digest 4.
JOURNAL_ENTRY_OVERHEAD = 9 + 16 + 32 + 4


def payload_size(rng: random.Random, overhead: int = JOURNAL_ENTRY_OVERHEAD) -> int:
    """One payload size in 1..MAX_PAYLOAD (see the module)."""
    if rng.random() < 0.5:
        size = rng.randint(1, 16) * 4096 + rng.randint(-16, 16) - overhead
    else:
        size = int(math.exp(rng.uniform(0.0, math.log(MAX_PAYLOAD))))
    return min(MAX_PAYLOAD, max(1, size))
