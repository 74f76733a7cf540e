"""What a bookie should hold (the scrubber's decision) and the durability debt, as pure
functions, each checked against a brute-force reference over the write-set rule."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.machines.checker import stored_runs
from ledgerd.machines.durability import (
    LedgerDebt,
    RepairRate,
    ledger_debt,
    mean_entry_bytes,
    summarize,
)
from ledgerd.machines.holdings import (
    HeldRun,
    MissingRanges,
    _runs,
    expected_count,
    expected_runs,
    holder_index,
    missing_ranges,
    reported_failures,
    reported_in_open_fragment,
    sample,
)
from ledgerd.metadata.ledger import LedgerMetadata

BOOKIES = [f"b{i}:1" for i in range(7)]
A, B, C, D, E = BOOKIES[:5]


def md(ensembles: tuple[tuple[int, tuple[str, ...]], ...], *, closed_at: int | None = None,
       e: int = 3, qw: int = 2, length: int = 0) -> LedgerMetadata:
    m = LedgerMetadata(ensemble_size=e, write_quorum=qw, ack_quorum=1, ensembles=ensembles)
    return m if closed_at is None else m.closed(closed_at, length)


def brute_expected(m: LedgerMetadata, bookie: str, lac: int) -> set[int]:
    """Entry by entry: the fragment's ensemble, the write set ``(e + k) % E``. An open
    ledger's finished fragments are whole (a new one starts past the writer's LAC)."""
    last = m.last_entry_id if m.is_closed else max(lac, m.last_ensemble[0] - 1)
    out = set()
    for e in range(0, last + 1):
        ensemble = m.ensemble_for(e)
        if any(ensemble[(e + k) % m.ensemble_size] == bookie for k in range(m.write_quorum)):
            out.add(e)
    return out


def test_striped_bookie_holds_its_write_sets_only() -> None:
    m = md(((0, (A, B, C)),), closed_at=8)
    # E3/Qw2: entry e on positions e%3 and (e+1)%3; A (0) holds 0, 2, 3, 5, 6, 8.
    runs = expected_runs(m, A)
    assert [(r.first, r.last) for r in runs] == [(0, 0), (2, 3), (5, 6), (8, 8)]
    assert expected_count(runs) == 6
    assert expected_runs(m, D) == []


def test_open_ledger_stops_at_the_lac_and_fragments_name_the_bookie_anew() -> None:
    m = md(((0, (A, B, C)), (6, (D, B, C))))
    runs = expected_runs(m, A, lac=20)
    assert {e for r in runs for e in range(r.first, r.last + 1)} == {0, 2, 3, 5}
    assert all(r.final for r in runs)
    d_runs = expected_runs(m, D, lac=10)
    assert {e for r in d_runs for e in range(r.first, r.last + 1)} == {6, 8, 9}
    assert not any(r.final for r in d_runs)
    assert expected_runs(m, D, lac=-1) == []  # nothing confirmed in the open fragment


@given(st.integers(1, 5), st.data())
def test_expected_runs_match_brute_force(e: int, data: st.DataObject) -> None:
    qw = data.draw(st.integers(1, e))
    starts = sorted(set(data.draw(st.lists(st.integers(1, 60), max_size=4))))
    rng = random.Random(data.draw(st.integers(0, 1000)))
    ensembles = tuple((first, tuple(rng.sample(BOOKIES, e))) for first in [0, *starts])
    closed = data.draw(st.booleans())
    last = data.draw(st.integers(-1, 80))
    m = md(ensembles, closed_at=last if closed else None, e=e, qw=qw)
    lac = data.draw(st.integers(-1, 80))
    for bookie in BOOKIES:
        got = [x for r in expected_runs(m, bookie, lac) for x in range(r.first, r.last + 1)]
        assert len(got) == len(set(got))
        assert set(got) == brute_expected(m, bookie, lac), bookie
        for x in got:
            assert holder_index(m, bookie, x) is not None


def test_missing_ranges_break_at_present_entries() -> None:
    checked = [(0, True), (2, False), (3, False), (5, True), (6, False), (8, False)]
    assert missing_ranges(checked) == [(2, 3), (6, 8)]
    assert missing_ranges([(1, True)]) == [] and missing_ranges([]) == []


def test_missing_ranges_past_the_cap_join_the_last() -> None:
    found = MissingRanges(cap=2)
    for e in range(10):
        found.add(e, e % 2 == 0)  # odd ids missing: five ranges of one
    assert found.ranges == [(1, 1), (3, 9)] and found.missing == 5


@given(st.integers(0, 40), st.integers(-1, 60), st.integers(1, 5), st.data())
def test_lazy_runs_are_the_checkers_runs(first: int, last: int, e: int,
                                         data: st.DataObject) -> None:
    qw = data.draw(st.integers(1, e))
    index = data.draw(st.integers(0, e - 1))
    assert list(_runs(first, last, e, qw, index)) == stored_runs(first, last, e, qw, index)


def test_sample_all_none_and_a_share() -> None:
    runs = [HeldRun(0, 0, 0, 999, True)]
    assert len(list(sample(runs, 100, random.Random(1)))) == 1000
    assert list(sample(runs, 0, random.Random(1))) == []
    n = len(list(sample(runs, 10, random.Random(1))))
    assert 60 < n < 140
    with pytest.raises(ValueError):
        list(sample(runs, 101, random.Random(1)))


def test_reported_failures_map_to_current_final_fragments() -> None:
    m = md(((0, (A, B, C)), (6, (D, B, C))), closed_at=11)
    # A holds 2 (positions 2%3=2 -> C, 0 -> A): yes. A was replaced from entry 6 on.
    assert reported_failures(m, {A: [(2, 2)]}) == {(0, 0)}
    assert reported_failures(m, {A: [(1, 1)]}) == set()  # not in 1's write set {1, 2}
    assert reported_failures(m, {A: [(7, 9)]}) == set()  # A no longer in that fragment
    assert reported_failures(m, {D: [(6, 8)], B: [(40, 50)]}) == {(6, 0)}
    open_md = md(((0, (A, B, C)), (6, (D, B, C))))
    assert reported_failures(open_md, {D: [(6, 6)]}) == set()  # an open fragment is not final


def test_a_report_in_the_open_fragment_is_a_lost_copy_there() -> None:
    # The scrubber reports up to the LAC it knew; the open fragment has no end yet.
    open_md = md(((0, (A, B, C)), (6, (D, B, C))))
    assert reported_in_open_fragment(open_md, {D: [(6, 6)]}) == {0}
    assert reported_failures(open_md, {D: [(6, 6)]}, open_fragment=True) == {(6, 0)}
    assert reported_in_open_fragment(open_md, {D: [(40, 41)]}) == {0}  # D holds 40 (40%3=1)
    assert reported_in_open_fragment(open_md, {D: [(7, 7)]}) == set()  # 7's write set {1, 2}
    # A report about a final fragment is not one about the open fragment (and the
    # other way round), and B is in both: only its ranges decide.
    both = {A: [(2, 2)], B: [(0, 1), (7, 7)]}
    assert reported_in_open_fragment(open_md, both) == {1}
    assert reported_failures(open_md, both) == {(0, 0), (0, 1)}
    assert reported_failures(open_md, both, open_fragment=True) == {(0, 0), (0, 1), (6, 1)}
    # Once closed the fragment is final and is reported as such, never as open.
    closed = open_md.closed(9, 0)
    assert reported_in_open_fragment(closed, {D: [(6, 6)]}) == set()
    assert reported_failures(closed, {D: [(6, 6)]}) == {(6, 0)}
    assert reported_in_open_fragment(open_md, {}) == set()


def test_debt_counts_copies_below_qw_by_write_set() -> None:
    m = md(((0, (A, B, C)),), closed_at=8, length=900)
    everyone = {A, B, C}
    assert ledger_debt(1, m, everyone) == LedgerDebt(ledger_id=1)
    d = ledger_debt(1, m, {B, C}, entry_bytes=mean_entry_bytes(m))
    # A held 6 of 9 entries; each now has one copy.
    assert (d.entries_below_qw, d.entries_single_copy, d.entries_no_copy) == (6, 6, 0)
    assert d.bytes_below_qw == 600 and d.references_lost and d.lost_bookies == (A,)
    both = ledger_debt(1, m, {C})
    assert (both.entries_below_qw, both.entries_single_copy, both.entries_no_copy) == (9, 6, 3)
    # A scrubber on B reports entry 1 missing (B holds 0, 1, 3, 4, 6, 7).
    rep = ledger_debt(1, m, everyone, reported={B: [(1, 2)]})
    assert (rep.entries_below_qw, rep.entries_single_copy) == (1, 1) and not rep.references_lost
    assert rep.needs_mark


def test_debt_of_open_ledgers_needs_the_lac() -> None:
    m = md(((0, (A, B, C)), (6, (D, B, C))))
    d = ledger_debt(1, m, {B, C, A})  # D is gone, in the open fragment
    assert d.unknown_extent and d.is_short and d.entries_below_qw == 0
    d = ledger_debt(1, m, {B, C, A}, lac=11)  # D holds 6, 8, 9, 11
    assert not d.unknown_extent and d.entries_below_qw == 4
    assert mean_entry_bytes(m, 11, 1200) == 100
    # A gone from a final fragment only: counted without a LAC.
    assert ledger_debt(1, m, {B, C, D}).entries_below_qw == 4
    # An empty last fragment naming a gone bookie: not short, but needs a mark.
    empty = md(((0, (A, B, C)), (9, (D, B, C))), closed_at=8)
    e = ledger_debt(1, empty, {A, B, C})
    assert not e.is_short and e.needs_mark
    unknown = ledger_debt(1, md(((0, (A, B, C)),), closed_at=8), {A, B, C},
                          reported_unknown=[B])
    assert unknown.is_short and unknown.unknown_extent


@given(st.integers(1, 5), st.data())
def test_debt_matches_brute_force(e: int, data: st.DataObject) -> None:
    qw = data.draw(st.integers(1, e))
    rng = random.Random(data.draw(st.integers(0, 1000)))
    starts = sorted(set(data.draw(st.lists(st.integers(1, 40), max_size=3))))
    ensembles = tuple((first, tuple(rng.sample(BOOKIES, e))) for first in [0, *starts])
    m = md(ensembles, closed_at=data.draw(st.integers(-1, 50)), e=e, qw=qw)
    available = set(data.draw(st.sets(st.sampled_from(BOOKIES))))
    reported = {b: [tuple(sorted(pair)) for pair in data.draw(st.lists(
                    st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=3))]
                for b in data.draw(st.sets(st.sampled_from(BOOKIES), max_size=3))}
    copies = []
    for x in range(m.last_entry_id + 1):
        ensemble = m.ensemble_for(x)
        holders = {ensemble[(x + k) % e] for k in range(qw)}
        copies.append(sum(1 for h in holders if h in available and not any(
            a <= x <= b for a, b in reported.get(h, ()))))
    d = ledger_debt(1, m, available, reported=reported)
    assert d.entries_below_qw == sum(1 for c in copies if c < qw)
    assert d.entries_single_copy == copies.count(1)
    assert d.entries_no_copy == copies.count(0)


def test_summary_agreement_age_and_eta() -> None:
    short = LedgerDebt(ledger_id=1, entries_below_qw=10, bytes_below_qw=1000.0,
                       references_lost=True)
    fine = LedgerDebt(ledger_id=2)
    rate = RepairRate(window_s=100)
    rate.observe(0.0, 2000.0, 20)
    rate.observe(10.0, 1000.0, 10)
    report = summarize([short, fine], {1: 5_000, 2: 9_000}, now_ms=15_000, rate=rate)
    assert report.short_ledgers == 1 and report.entries_below_qw == 10
    assert report.oldest_underreplicated_age_s == 10.0
    assert report.stale_marks == (2,) and report.unmarked == () and not report.agrees
    assert report.repair_rate_bytes_per_s == 100.0 and report.eta_s == 10.0
    unmarked = summarize([short], {}, now_ms=0)
    assert unmarked.unmarked == (1,) and unmarked.oldest_underreplicated_age_s is None
    assert summarize([fine], {}, now_ms=0).agrees
    # Not falling: no estimate; no debt: zero.
    flat = RepairRate()
    flat.observe(0.0, 1000.0, 10)
    flat.observe(5.0, 1000.0, 10)
    assert flat.eta(1000.0, 10) is None and flat.eta(0.0, 0) == 0.0
