"""Ensemble placement: random among writable bookies, never read-only ones.

``random.Random`` is injected so the simulator and tests are deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from ledgerd.base.errors import LedgerdError

__all__ = ["NotEnoughBookiesError", "choose_ensemble", "choose_replacements"]


class NotEnoughBookiesError(LedgerdError):
    """Fewer writable bookies than an ensemble or a replacement needs."""

    def __init__(self, needed: int, available: int, excluded: int = 0) -> None:
        extra = f" after excluding {excluded} already in the ensemble" if excluded else ""
        super().__init__(f"not enough writable bookies: needed {needed}, found {available}{extra}")
        self.needed = needed
        self.available = available


def choose_ensemble(writable: Collection[str], size: int, rng: random.Random,
                    avoid: Collection[str] = ()) -> tuple[str, ...]:
    """``size`` distinct bookies picked at random from ``writable``, outside ``avoid``
    (recently failed ones) while enough others exist."""
    preferred = set(writable) - set(avoid)
    if avoid and len(preferred) >= size:
        writable = preferred
    pool = sorted(writable)
    if len(pool) < size:
        raise NotEnoughBookiesError(size, len(pool))
    return tuple(rng.sample(pool, size))


def choose_replacements(writable: Collection[str], ensemble: Sequence[str],
                        failed: Collection[int], rng: random.Random,
                        avoid: Collection[str] = ()) -> tuple[str, ...]:
    """The ensemble with each failed index replaced by a writable bookie not in it,
    outside ``avoid`` (recently failed ones) while enough others exist."""
    current = set(ensemble)
    preferred = set(writable) - set(avoid)
    if avoid and len(preferred - current) >= len(failed):
        writable = preferred
    pool = sorted(set(writable) - current)
    if len(pool) < len(failed):
        raise NotEnoughBookiesError(len(failed), len(pool), len(current & set(writable)))
    picks = iter(rng.sample(pool, len(failed)))
    return tuple(next(picks) if i in failed else b for i, b in enumerate(ensemble))
