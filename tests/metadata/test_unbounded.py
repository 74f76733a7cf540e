"""Unbounded ledgers' metadata: terms, no-ops, trimmed fragments, the compact form."""

from __future__ import annotations

import pytest

from ledgerd.machines.changes import (
    TermChangedError,
    begin_term,
    change_ensemble,
    close_as_writer,
    open_term,
)
from ledgerd.metadata.errors import ChangeRejectedError
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState

BOOKIES = [f"10.0.0.{i}:3181" for i in range(6)]


def unbounded(fragments: int = 1) -> LedgerMetadata:
    ensembles = tuple((i * 100, tuple(BOOKIES[(i + j) % 6] for j in range(3)))
                      for i in range(fragments))
    return LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2, unbounded=True,
                          term=1, ensembles=ensembles)


def test_a_term_cycle_raises_the_term_twice_and_records_the_noop() -> None:
    md = begin_term(unbounded())
    assert (md.state, md.term) == (LedgerState.IN_RECOVERY, 2)
    opened = open_term(md, 2, {40: tuple(BOOKIES[3:6])}, [41])
    assert (opened.state, opened.term, opened.noops) == (LedgerState.OPEN, 3, (41,))
    assert opened.last_ensemble == (40, tuple(BOOKIES[3:6]))
    assert open_term(opened, 2, {}, [41]) is opened  # the CAS landed before a retry
    assert opened.noops_before(41) == 0 and opened.noops_before(42) == 1


def test_a_raised_term_rejects_the_former_writers_changes() -> None:
    md = open_term(begin_term(unbounded()), 2, {}, [5])  # now term 3
    with pytest.raises(TermChangedError):
        change_ensemble(md, md.last_ensemble[1], 6, tuple(BOOKIES[3:6]), term=1)
    with pytest.raises(TermChangedError):
        close_as_writer(md, 9, 90, term=1)
    with pytest.raises(TermChangedError):
        open_term(begin_term(md), 2, {}, [])
    assert change_ensemble(md, md.last_ensemble[1], 6, tuple(BOOKIES[3:6]), term=3)


def test_bounded_ledgers_have_no_terms_to_raise() -> None:
    bounded = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
                             ensembles=((0, (BOOKIES[0],)),))
    with pytest.raises(ChangeRejectedError):
        begin_term(bounded)
    with pytest.raises(ChangeRejectedError):
        bounded.trimmed_before(10)


def test_trimming_drops_whole_fragments_from_the_front() -> None:
    md = unbounded(5)
    assert md.trimmed_before(50) is md
    cut = md.trimmed_before(250)
    assert cut.start_entry == 200 and [f for f, _ in cut.ensembles] == [200, 300, 400]
    assert md.trimmed_before(10_000).ensembles == md.ensembles[-1:]
    again = LedgerMetadata.from_json(cut.to_json(), "/l")
    assert again == cut


def test_ten_thousand_fragments_stay_far_below_the_node_limit() -> None:
    md = unbounded(10_000)
    raw = md.to_json()
    assert len(raw) < 300_000, len(raw)
    assert LedgerMetadata.from_json(raw, "/l") == md
    assert b"10.0.0.5:3181" in raw and raw.count(b"10.0.0.5:3181") == 1


def test_a_compact_ensemble_index_outside_the_table_is_corrupt() -> None:
    raw = unbounded().to_json().replace(b'"ensembles":[[0,[0,1,2]]]', b'"ensembles":[[0,[0,1,9]]]')
    with pytest.raises(Exception, match="bookie index 9"):
        LedgerMetadata.from_json(raw, "/ledgers/7")
