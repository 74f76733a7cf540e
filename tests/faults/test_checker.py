"""The history checker finds each violation it promises, and nothing in a correct history;
its report shows the smallest failing window."""

from __future__ import annotations

from ledgerd.tools.faults.history import History, check, report


def _base() -> History:
    """w acks e0 and e1 of L7; r reads e0; rec recovers L7 at e1; the final read agrees."""
    h = History()
    h.record(0.0, "w", "ok", "create", ledger=7)
    h.record(0.1, "w", "invoke", "add", ledger=7, value=b"a", detail="1")
    h.record(0.2, "w", "ok", "add", ledger=7, entry=0, value=b"a", detail="1")
    h.record(0.3, "w", "invoke", "add", ledger=7, value=b"b", detail="2")
    h.record(0.4, "w", "ok", "add", ledger=7, entry=1, value=b"b", detail="2")
    h.record(0.5, "r", "ok", "lac", ledger=7, entry=0)
    h.record(0.6, "r", "ok", "read", ledger=7, entry=0, value=b"a")
    h.record(0.7, "rec", "ok", "recover", ledger=7, entry=1)
    return h


def _final(h: History, last: int, entries: dict[int, bytes]) -> History:
    h.record(9.0, "final", "ok", "final", ledger=7, entry=last)
    for eid, value in entries.items():
        h.record(9.0, "final", "ok", "final", ledger=7, entry=eid, value=value)
    return h


def test_a_correct_history_has_no_violations() -> None:
    h = _final(_base(), 1, {0: b"a", 1: b"b"})
    assert check(h) == []
    assert report(h, []) == "no violations"


def test_an_acknowledged_entry_missing_at_the_end_is_found() -> None:
    h = _final(_base(), 0, {0: b"a"})
    kinds = sorted(v.kind for v in check(h))
    assert kinds == ["acked-lost", "end-differs"]
    lost = next(v for v in check(h) if v.kind == "acked-lost")
    # The recovery that ended the ledger without e1 is not it (it says e1); the final
    # read is what left it out.
    assert lost.events[0] == 4


def test_a_read_that_differs_from_the_end_and_a_lac_beyond_it() -> None:
    h = _base()
    h.record(0.8, "r", "ok", "read", ledger=7, entry=1, value=b"other")
    h.record(0.9, "r", "ok", "lac", ledger=7, entry=5)
    _final(h, 1, {0: b"a", 1: b"b"})
    assert sorted(v.kind for v in check(h)) == ["lac-beyond-end", "read-differs"]


def test_an_add_started_after_recovery_must_not_be_acknowledged() -> None:
    h = _base()
    h.record(0.8, "w", "invoke", "add", ledger=7, value=b"c", detail="3")
    h.record(0.9, "w", "ok", "add", ledger=7, entry=2, value=b"c", detail="3")
    _final(h, 2, {0: b"a", 1: b"b", 2: b"c"})
    found = check(h)
    assert sorted(v.kind for v in found) == ["end-differs", "fenced-ack"]
    fenced = next(v for v in found if v.kind == "fenced-ack")
    assert fenced.events == (7, 8, 9)


def test_the_report_shows_the_smallest_window_with_the_faults_in_it() -> None:
    h = History()
    h.record(0.0, "w", "ok", "add", ledger=1, entry=0, value=b"x", detail="1")
    for i in range(20):
        h.record(0.1, "w", "ok", "add", ledger=2, entry=i, value=b"%d" % i, detail=str(i + 2))
    h.record(0.2, "nemesis", "info", "fault", detail="kill-bookie: b1")
    h.record(0.3, "r", "ok", "read", ledger=2, entry=3, value=b"wrong")
    h.record(0.4, "final", "ok", "final", ledger=2, entry=19)
    for i in range(20):
        h.record(0.4, "final", "ok", "final", ledger=2, entry=i, value=b"%d" % i)
    h.record(0.5, "final", "ok", "final", ledger=1, entry=-1)
    found = check(h)
    assert sorted(v.kind for v in found) == ["acked-lost", "read-differs"]
    text = report(h, found)
    assert "read-differs" in text.splitlines()[0]
    assert "kill-bookie" in text and "wrong" in text
    assert "2 violation(s)" in text
