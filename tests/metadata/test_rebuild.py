"""Rebuild planning (pure): from what each bookie holds back to ledger metadata, under
the striping rule and the recovery rule for the end; checked against a brute-force
reference of where a known ledger's entries went."""

from __future__ import annotations

import google_crc32c
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
from ledgerd.metadata.rebuild import BookieLedger, detect_digest, merge_ranges, plan_ledger

BOOKIES = ("b0:1", "b1:1", "b2:1", "b3:1", "b4:1")


def _held(ensemble: tuple[str, ...], qw: int, last: int, *, lac: int,
          drop: frozenset[tuple[str, int]] = frozenset()) -> list[BookieLedger]:
    """What each bookie holds after a writer wrote entries 0..last (the reference)."""
    size = len(ensemble)
    ids: dict[str, list[int]] = {b: [] for b in ensemble}
    for e in range(last + 1):
        for i in range(qw):
            b = ensemble[(e + i) % size]
            if (b, e) not in drop:
                ids[b].append(e)
    return [BookieLedger(bookie_id=b, ledger_id=7, ranges=merge_ranges([(e, e) for e in got]),
                         lac=min(lac, max(got)), key_check="ab" * 32)
            for b, got in ids.items() if got]  # a bookie sent nothing holds no ledger


@given(st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(1, n), st.permutations(BOOKIES[:n]), st.integers(0, 40))))
def test_striped_ensemble_and_end_come_back(case: tuple[int, int, list[str], int]) -> None:
    size, qw, order, last = case
    ensemble = tuple(order)
    plan = plan_ledger(7, _held(ensemble, qw, last, lac=max(-1, last - 1)))
    md = plan.metadata
    assert md is not None and not plan.problems, plan
    assert md.state is LedgerState.OPEN and plan.end == last  # recovery closes it there
    assert md.password_check == "ab" * 32
    if last + qw >= size:  # every position got an entry: the ensemble can be known
        assert (md.ensemble_size, md.write_quorum) == (size, qw)
        # The same write sets: every entry is where the reads will look for it.
        for e in range(last + 1):
            want = {ensemble[(e + i) % size] for i in range(qw)}
            got = {md.ensembles[0][1][(e + i) % size] for i in range(qw)}
            assert got == want, (e, ensemble, md.ensembles)


def test_the_end_is_the_last_entry_held_past_the_lac_and_a_lost_acked_entry_is_named() -> None:
    ensemble = BOOKIES[:3]
    held = _held(ensemble, 2, 9, lac=5, drop=frozenset({("b2:1", 8), ("b0:1", 8)}))
    plan = plan_ledger(7, held)
    assert plan.metadata is not None and plan.end == 7
    held = _held(ensemble, 2, 9, lac=9, drop=frozenset({("b2:1", 8), ("b0:1", 8)}))
    plan = plan_ledger(7, held)
    assert plan.metadata is not None and plan.end == 9
    assert any("entry 8" in p and "lost" in p for p in plan.problems)


def test_snapshot_quorums_and_a_closed_end_win() -> None:
    snap = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=1,
                          ensembles=((0, BOOKIES[:3]),), state=LedgerState.CLOSED,
                          last_entry_id=4, length=50, digest_type="crc32")
    plan = plan_ledger(7, _held(BOOKIES[:3], 2, 4, lac=3), snapshot=snap)
    assert plan.metadata == snap and plan.source == "snapshot"


def test_bookies_that_disagree_on_the_key_leave_the_ledger_out() -> None:
    held = _held(BOOKIES[:2], 2, 3, lac=3)
    held[1] = BookieLedger(bookie_id=held[1].bookie_id, ledger_id=7, ranges=held[1].ranges,
                           key_check="cd" * 32)
    plan = plan_ledger(7, held)
    assert plan.metadata is None and "disagree" in plan.problems[0]


def test_digest_type_from_entry_zero() -> None:
    header = (7).to_bytes(8, "big") + (0).to_bytes(8, "big") + (-1).to_bytes(8, "big",
                                                                            signed=True)
    payload = b"hello"
    head = header + len(payload).to_bytes(8, "big")
    crc = google_crc32c.value(head + payload).to_bytes(4, "big")
    assert detect_digest(head + crc + payload) == "crc32c"
    assert detect_digest(head + bytes(20) + payload) == "hmac"
    assert detect_digest(head + payload) == "dummy"


def test_an_unbounded_ledger_without_a_snapshot_names_its_unknown_noops() -> None:
    held = [BookieLedger(bookie_id=h.bookie_id, ledger_id=7, ranges=h.ranges, lac=h.lac,
                         term=2, key_check=h.key_check)
            for h in _held(BOOKIES[:3], 3, 9, lac=8)]
    plan = plan_ledger(7, held)
    assert plan.metadata is not None and plan.metadata.unbounded and plan.metadata.term == 2
    assert any("no-op entries" in p for p in plan.problems), plan.problems
