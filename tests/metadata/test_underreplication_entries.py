"""A scrubber's mark: the entry ranges found missing travel in the queue record, merge
with later marks, and survive a record written by an older auditor (no ranges)."""

from __future__ import annotations

from ledgerd.metadata.cluster import init_new_cluster
from ledgerd.metadata.paths import underreplicated_path
from ledgerd.metadata.underreplication import (
    MAX_RANGES_PER_BOOKIE,
    UnderreplicationManager,
    _merge_ranges,
)
from tests.metadata.conftest import StoreFactory

ROOT = "/ledgers"


async def test_scrubber_ranges_round_trip_and_merge(stores: StoreFactory) -> None:
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    urm = UnderreplicationManager(s, ROOT)
    await urm.mark_underreplicated(7, ["b1:3181"], {"b1:3181": [(10, 19), (40, 40)]})
    await urm.mark_underreplicated(7, ["b2:3181"])  # the auditor: no ranges
    await urm.mark_underreplicated(7, ["b1:3181"], {"b1:3181": [(20, 25)],
                                                    "b3:3181": [(0, 0)]})
    rec = await urm.get(7)
    assert rec is not None
    assert rec.missing_replicas == ("b1:3181", "b2:3181", "b3:3181")
    assert dict(rec.missing_entries) == {"b1:3181": ((10, 25), (40, 40)),
                                         "b3:3181": ((0, 0),)}
    # A record as an older auditor wrote it reads with no ranges.
    await s.create(underreplicated_path(ROOT, 8),
                   b'{"format": 1, "missing_replicas": ["b1:3181"], "ctime_ms": 5}',
                   make_parents=True)
    old = await urm.get(8)
    assert old is not None and dict(old.missing_entries) == {} and old.ctime_ms == 5


def test_ranges_are_capped_by_joining_the_closest() -> None:
    many = [(i * 10, i * 10) for i in range(MAX_RANGES_PER_BOOKIE + 2)]
    merged = _merge_ranges(many, [(5, 5)])
    assert len(merged) == MAX_RANGES_PER_BOOKIE
    covered = [e for e, _ in many] + [5]
    assert all(any(a <= e <= b for a, b in merged) for e in covered)
