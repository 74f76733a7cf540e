"""Ensemble placement: random among writable bookies, never read-only ones, spread over
racks when the bookies carry rack labels.

Each bookie registers a failure-domain label (``bookie_rack``, e.g. ``/zone-a/rack-3``).
A placement *adheres* when every write set (each cyclic window of Qw consecutive
positions of the ensemble) spans ``min(Qw, racks available)`` distinct racks, so losing
one rack loses at most what the write quorum can spare, as BookKeeper's rack-aware policy
intends. When too few racks exist the choice falls back to what there is and reports
that it does not adhere (callers log a warning). Without labels, or with one rack, the
choice is the plain random one (same draws for the same ``rng``).

``random.Random`` is injected so the simulator and tests are deterministic.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Mapping, Sequence

from ledgerd.base.errors import UnavailableError

__all__ = ["DEFAULT_RACK", "RACK", "NotEnoughBookiesError", "Placement", "adheres",
           "choose_ensemble", "choose_replacements", "rack_violations"]

RACK = re.compile(r"^(/[A-Za-z0-9._-]+)+$")
DEFAULT_RACK = "/default-rack"
_ATTEMPTS = 16


class NotEnoughBookiesError(UnavailableError):
    """Fewer writable bookies than an ensemble or a replacement needs (raised before
    anything is sent to a bookie)."""

    def __init__(self, needed: int, available: int, excluded: int = 0) -> None:
        if excluded:
            # A replacement must be outside the ensemble: say that this is what is
            # missing (E bookies of E writable ones), not a fault of the copying.
            text = (f"no writable bookie outside the ensemble to copy to: needed {needed}, "
                    f"found {available} (the other {excluded} writable bookie(s) are in the "
                    "ensemble already); add a bookie, or bring the lost one back")
        else:
            text = f"not enough writable bookies: needed {needed}, found {available}"
        super().__init__(text)
        self.needed = needed
        self.available = available
        self.excluded = excluded


class Placement:
    """Rack labels of the bookies known now (missing labels count as DEFAULT_RACK)."""

    __slots__ = ("racks",)

    def __init__(self, racks: Mapping[str, str] | None = None) -> None:
        self.racks = dict(racks or {})

    def rack(self, bookie: str) -> str:
        return self.racks.get(bookie, DEFAULT_RACK)

    def distinct(self, bookies: Collection[str]) -> int:
        return len({self.rack(b) for b in bookies})


def _windows(size: int, write_quorum: int) -> list[list[int]]:
    return [[(i + k) % size for k in range(write_quorum)] for i in range(size)]


def rack_violations(ensemble: Sequence[str], write_quorum: int, placement: Placement,
                    racks_available: int) -> list[int]:
    """Start positions of write sets spanning fewer than ``min(Qw, racks_available)``
    racks."""
    need = min(write_quorum, racks_available)
    return [w[0] for w in _windows(len(ensemble), write_quorum)
            if len({placement.rack(ensemble[i]) for i in w}) < need]


def adheres(ensemble: Sequence[str], write_quorum: int, placement: Placement,
            racks_available: int) -> bool:
    return not rack_violations(ensemble, write_quorum, placement, racks_available)


def choose_ensemble(writable: Collection[str], size: int, rng: random.Random,
                    avoid: Collection[str] = (), *, write_quorum: int | None = None,
                    placement: Placement | None = None) -> tuple[str, ...]:
    """``size`` distinct bookies picked at random from ``writable``, outside ``avoid``
    (recently failed ones) while enough others exist, spread over racks when
    ``placement`` labels them (each write set of ``write_quorum`` on distinct racks
    as far as the racks allow)."""
    preferred = set(writable) - set(avoid)
    if avoid and len(preferred) >= size:
        writable = preferred
    pool = sorted(writable)
    if len(pool) < size:
        raise NotEnoughBookiesError(size, len(pool))
    if placement is None or placement.distinct(pool) < 2:
        return tuple(rng.sample(pool, size))
    qw = write_quorum or size
    racks = placement.distinct(pool)
    best: tuple[str, ...] = ()
    best_bad = size + 1
    for _ in range(_ATTEMPTS):
        chosen: list[str] = []
        left = pool[:]
        rng.shuffle(left)
        for pos in range(size):
            # Racks of the positions this one shares a write set with, chosen so far.
            near = {placement.rack(chosen[p]) for p in range(max(0, pos - qw + 1), pos)}
            near |= {placement.rack(chosen[p]) for p in range(0, max(0, pos + qw - size))}
            pick = next((b for b in left if placement.rack(b) not in near), left[0])
            left.remove(pick)
            chosen.append(pick)
        bad = len(rack_violations(chosen, qw, placement, racks))
        if bad < best_bad:
            best, best_bad = tuple(chosen), bad
        if bad == 0:
            break
    return best


def choose_replacements(writable: Collection[str], ensemble: Sequence[str],
                        failed: Collection[int], rng: random.Random,
                        avoid: Collection[str] = (), *, write_quorum: int | None = None,
                        placement: Placement | None = None) -> tuple[str, ...]:
    """The ensemble with each failed index replaced by a writable bookie not in it,
    outside ``avoid`` (recently failed ones) while enough others exist; with rack
    labels, a replacement's rack differs from those of its write sets' other members
    when such a bookie exists."""
    current = set(ensemble)
    preferred = set(writable) - set(avoid)
    if avoid and len(preferred - current) >= len(failed):
        writable = preferred
    pool = sorted(set(writable) - current)
    if len(pool) < len(failed):
        raise NotEnoughBookiesError(len(failed), len(pool), len(current & set(writable)))
    picks = iter(rng.sample(pool, len(failed)))
    if placement is None or placement.distinct(set(pool) | current) < 2:
        return tuple(next(picks) if i in failed else b for i, b in enumerate(ensemble))
    size = len(ensemble)
    qw = write_quorum or size
    out = list(ensemble)
    left = [b for b in picks]  # the random draw keeps ties random
    left += [b for b in pool if b not in left]
    for i in sorted(failed):
        near = {placement.rack(out[(i + d) % size]) for d in range(-qw + 1, qw)
                if (i + d) % size != i and (i + d) % size not in failed}
        pick = next((b for b in left if placement.rack(b) not in near), left[0])
        left.remove(pick)
        out[i] = pick
    return tuple(out)
