"""The re-replication decisions as pure functions: fragments, probes, copy batches, the
fragment-only CAS, rack placement and the auditor's schedule."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.appliance.audit_schedule import AuditSchedule
from ledgerd.machines.changes import FragmentChangedError, replace_in_fragment
from ledgerd.machines.checker import (
    Fragment,
    bad_fragments,
    copy_batches,
    fragments,
    last_fragment_at_risk,
    probes,
    stored_runs,
)
from ledgerd.machines.placement import Placement, adheres, choose_ensemble, choose_replacements
from ledgerd.machines.quorum import write_set
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState

A, B, C, D, E = (f"b{i}:1" for i in range(5))


def md(ensembles: tuple[tuple[int, tuple[str, ...]], ...], *, closed_at: int | None = None,
       e: int = 3, qw: int = 2, qa: int = 2) -> LedgerMetadata:
    m = LedgerMetadata(ensemble_size=e, write_quorum=qw, ack_quorum=qa, ensembles=ensembles)
    return m if closed_at is None else m.closed(closed_at, 0)


def test_fragments_final_and_open() -> None:
    open_md = md(((0, (A, B, C)), (10, (A, B, D))))
    assert fragments(open_md, lac=14) == [Fragment(0, 9, (A, B, C), True),
                                         Fragment(10, 14, (A, B, D), False)]
    closed = md(((0, (A, B, C)), (10, (A, B, D))), closed_at=14)
    assert [f.final for f in fragments(closed)] == [True, True]
    # Only final fragments are bad; an open last one is "at risk" instead.
    assert bad_fragments(open_md, {A, B, D}) == {0: {2}}
    assert last_fragment_at_risk(open_md, {A, B, C})
    assert not last_fragment_at_risk(closed, {A, B, C})
    assert bad_fragments(closed, {A, B, C, D}, failed_probes={(10, 1)}) == {10: {1}}
    # An empty final fragment is still repaired (so nothing references the bookie).
    empty = md(((0, (A, B, C)), (5, (A, B, D))), closed_at=4)
    assert bad_fragments(empty, {A, B, C}) == {5: {2}}


def test_probes_first_and_last_stored_entry() -> None:
    closed = md(((0, (A, B, C)),), closed_at=8)
    got = {(p.index, p.entries) for p in probes(closed, {A, B})}
    # E3 Qw2: bookie 0 holds 0,2,3,5,6,8; bookie 1 holds 0,1,3,4,6,7; C is gone (no probe).
    assert got == {(0, (0, 8)), (1, (0, 7))}


@given(st.integers(1, 6), st.data())
def test_copy_batches_cover_exactly_the_bookies_entries(e: int, data: st.DataObject) -> None:
    qw = data.draw(st.integers(1, e))
    first = data.draw(st.integers(0, 30))
    last = data.draw(st.integers(first - 1, first + 60))
    index = data.draw(st.integers(0, e - 1))
    batch = data.draw(st.integers(1, 9))
    ens = tuple(f"x{i}:1" for i in range(e))
    frag = Fragment(first, last, ens, True)
    batches = copy_batches(frag, index, e, qw, {index}, batch)
    covered = [x for b in batches for x in range(b.first, b.last + 1)]
    wanted = [x for a, z in stored_runs(first, last, e, qw, index) for x in range(a, z + 1)]
    assert covered == wanted
    for b in batches:
        assert b.count <= batch
        for x in range(b.first, b.last + 1):  # every source holds every entry of it
            ws = write_set(x, e, qw)
            assert all(ens.index(s) in ws and ens.index(s) != index for s in b.sources)


def test_replace_in_fragment_only_touches_that_fragment() -> None:
    m = md(((0, (A, B, C)), (10, (A, B, D))), closed_at=19)
    out = replace_in_fragment(m, 0, 9, {2: (C, E)})
    assert out.ensembles == ((0, (A, B, E)), (10, (A, B, D)))
    assert out.state is LedgerState.CLOSED and out.last_entry_id == 19
    assert replace_in_fragment(out, 0, 9, {2: (C, E)}) is out  # retried after landing
    with pytest.raises(FragmentChangedError):
        replace_in_fragment(m, 0, 9, {2: (D, E)})  # someone else replaced it
    with pytest.raises(FragmentChangedError):
        replace_in_fragment(m, 0, 8, {2: (C, E)})  # the range is not what was copied
    with pytest.raises(FragmentChangedError):
        replace_in_fragment(m, 0, 9, {2: (C, A)})  # A is already in the fragment
    open_md = md(((0, (A, B, C)), (10, (A, B, D))))
    with pytest.raises(FragmentChangedError):
        replace_in_fragment(open_md, 10, 19, {2: (D, E)})  # still being written


def test_rack_aware_choices() -> None:
    racks = {"r1a": "/r1", "r1b": "/r1", "r2a": "/r2", "r2b": "/r2", "r3a": "/r3"}
    p = Placement(racks)
    for seed in range(50):
        ens = choose_ensemble(racks, 3, random.Random(seed), write_quorum=3, placement=p)
        assert adheres(ens, 3, p, 3)
        new = choose_replacements(racks, ("r1a", "r2a", "r3a"), {0}, random.Random(seed),
                                  write_quorum=3, placement=p)
        assert p.distinct(new) == 3 and new[1:] == ("r2a", "r3a")
    # Too few racks: falls back to what exists (and says it does not adhere).
    two = Placement({"a": "/r1", "b": "/r1", "c": "/r2"})
    ens = choose_ensemble({"a", "b", "c"}, 3, random.Random(1), write_quorum=3, placement=two)
    assert sorted(ens) == ["a", "b", "c"] and not adheres(ens, 3, two, 3)
    # Without labels: the plain random choice, same draws as before racks existed.
    assert choose_ensemble({"a", "b", "c", "d"}, 3, random.Random(7)) == \
        choose_ensemble({"a", "b", "c", "d"}, 3, random.Random(7), placement=Placement())


def test_audit_schedule_follows_bookkeepers_rules() -> None:
    s = AuditSchedule({A, B, C, D}, delay_s=30)
    s.on_membership({A, B, C}, now=0)          # one lost: after the delay
    assert s.next_deadline() == 30 and s.waiting_for_delay
    s.on_membership({A, B, C, D}, now=10)      # back within the delay: cancelled
    assert s.next_deadline() is None
    s.on_membership({A, B, C}, now=20)
    s.on_membership({A, B}, now=25)            # a second one: now
    assert s.next_deadline() == 25 and s.take_due(25) and s.next_deadline() is None
    s.on_delay_written(30, now=40)             # triggeraudit (same value): now
    assert s.take_due(40)
    s.on_membership({A, B, E}, now=50)         # E joins: not lost later unless it goes
    s.on_membership({A, E}, now=60)
    assert s.next_deadline() == 90
    s.on_delay_written(5, now=61)              # a new value reschedules
    assert s.next_deadline() == 66
    s.on_delay_written(0, now=62)
    assert s.take_due(62)
