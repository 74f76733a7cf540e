"""The one invariant checker judges the same facts the same way, fed live (as the
simulator feeds it) or as a recorded history (as the fault harness does)."""

from __future__ import annotations

from ledgerd.testing.history import History, LedgerFacts, check


def test_an_acknowledged_entry_left_out_of_the_end_is_lost_either_way() -> None:
    live = LedgerFacts(ledger=7)
    assert live.acked_add(0, b"a", who="w") == []
    assert [v.kind for v in live.ended(-1, who="rec", recovered=True)] == ["acked-lost"]

    h = History()
    h.record(0.1, "w", "invoke", "add", ledger=7, value=b"a", detail="1")
    h.record(0.2, "w", "ok", "add", ledger=7, entry=0, value=b"a", detail="1")
    h.record(0.3, "rec", "ok", "recover", ledger=7, entry=-1)
    h.record(9.0, "final", "ok", "final", ledger=7, entry=-1)
    assert [v.kind for v in check(h)] == ["acked-lost"]


def test_a_read_that_differs_from_the_acknowledged_value_is_caught_live() -> None:
    live = LedgerFacts()
    assert live.acked_add(5, b"c2-t3-0", who="c2") == []
    [v] = live.read(5, b"c1-t1-5", who="follower reader")
    assert (v.kind, v.message) == ("read-differs", "follower reader read id 5 as "
                                   "b'c1-t1-5', acknowledged as b'c2-t3-0'")


def test_a_lac_beyond_what_is_committed_is_a_dirty_read_until_a_term_commits_it() -> None:
    live = LedgerFacts()
    assert live.acked_add(0, b"x", who="w") == []
    assert [v.kind for v in live.saw_lac(1, who="r")] == ["dirty-lac"]
    live.committed_upto(1)
    assert live.saw_lac(1, who="r") == []


def test_acks_out_of_order_on_a_bounded_ledger() -> None:
    live = LedgerFacts()
    assert live.acked_add(0, b"a", who="w", in_order=True) == []
    assert [v.kind for v in live.acked_add(2, b"c", who="w", in_order=True)] == ["ack-order"]
