"""The read machines, byte-free: replica order, failover, speculation, runs, coverage."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given
from hypothesis import strategies as st

from ledgerd.machines.quorum import is_definite, write_set
from ledgerd.machines.reads import (
    EntryReads,
    FollowerLac,
    LacTally,
    LongPollTally,
    RangeReads,
    SendRange,
    SendRead,
)
from ledgerd.wire.status import Status


def test_entry_read_fails_over_in_order_and_the_first_good_answer_wins() -> None:
    m = EntryReads([(7, ["a", "b", "c"])], speculative_timeout=2.0, read_timeout=5.0)
    assert m.begin(0.0) == [SendRead(7, "a")]
    assert m.on_failure(7, "a", OSError("reset"), 0.1) == [SendRead(7, "b")]
    assert m.on_found(7, 0.2) == [] and m.is_done and m.failed() == []
    assert [b for b, _ in m.failures(7)] == ["a"]


def test_slow_replica_gets_a_speculative_second_ask_then_the_entry_times_out() -> None:
    m = EntryReads([(1, ["a", "b"])], speculative_timeout=2.0, read_timeout=5.0)
    m.begin(0.0)
    assert m.next_deadline() == 2.0
    assert m.on_timer(1.9) == []
    assert m.on_timer(2.0) == [SendRead(1, "b")]
    assert m.next_deadline() == 7.0  # every replica asked: the read timeout counts now
    assert m.on_timer(7.0) == [] and m.is_done and m.timed_out == [1] and m.failed() == [1]
    assert m.next_deadline() is None


def test_all_replicas_failing_fails_the_entry_and_lists_every_cause() -> None:
    m = EntryReads([(3, ["a", "b"]), (4, [])], speculative_timeout=0, read_timeout=5.0)
    assert m.begin(0.0) == [SendRead(3, "a")]  # entry 4 has no replica: failed at once
    m.on_failure(3, "a", ValueError("x"), 0.1)
    m.on_failure(3, "b", ValueError("y"), 0.2)
    assert m.is_done and m.failed() == [3, 4]
    assert [str(e) for _, e in m.failures(3)] == ["x", "y"]


def test_range_runs_continue_short_answers_and_end_failed_ones() -> None:
    fragments = [(0, -1, ("a", "b", "c"))]
    m = RangeReads(fragments, 0, 9, ensemble_size=3, write_quorum=3, run_limit=5,
                   skip=frozenset(), speculative_timeout=2.0)
    sends = m.begin(0.0)
    assert [(s.bookie, s.first_entry_id, s.max_count) for s in sends] == [("a", 0, 5),
                                                                         ("b", 5, 5)]
    assert m.on_answer(0, 3, False, 0.1) == [SendRange(0, "a", 3, 2)]  # cut at max_bytes
    assert m.on_answer(0, 2, False, 0.2) == [] and m.wanted(0) == 0
    assert m.on_answer(1, 1, True, 0.3) == []  # a bad digest at entry 6
    assert m.is_done and m.avoid == {"b"}


def test_strided_runs_ask_each_bookie_once_and_advance_by_the_stride() -> None:
    m = RangeReads([(0, -1, ("a", "b", "c"))], 0, 11, ensemble_size=3, write_quorum=2,
                   run_limit=100, skip=frozenset(), speculative_timeout=2.0, strided=True)
    sends = m.begin(0.0)
    # Entry e is asked of the last bookie of its write set: (e + 1) % 3.
    assert sorted(sends, key=lambda s: s.first_entry_id) == [
        SendRange(0, "b", 0, 4, 3), SendRange(1, "c", 1, 4, 3), SendRange(2, "a", 2, 4, 3)]
    run = next(s.run for s in sends if s.first_entry_id == 1)
    # Two entries (1, 4) and the byte limit: the rest (7, 10) is asked for next.
    assert m.on_answer(run, 2, False, 0.1) == [SendRange(run, "c", 7, 2, 3)]
    assert m.wanted(run) == 2
    assert m.on_answer(run, 2, False, 0.2) == [] and m.wanted(run) == 0
    # Without ``strided`` the same range is a ReadRange per run of Qw entries.
    plain = RangeReads([(0, -1, ("a", "b", "c"))], 0, 11, ensemble_size=3, write_quorum=2,
                       run_limit=100, skip=frozenset(), speculative_timeout=2.0)
    assert len(plain.begin(0.0)) == 6 and all(s.stride == 1 for s in plain.begin(0.0))


def test_silent_range_run_ends_at_the_speculative_timeout() -> None:
    m = RangeReads([(0, -1, ("a",))], 0, 3, ensemble_size=1, write_quorum=1, run_limit=10,
                   skip=frozenset(), speculative_timeout=2.0)
    m.begin(0.0)
    assert m.next_deadline() == 2.0
    m.on_timer(2.0)
    assert m.is_done and m.avoid == {"a"} and m.next_deadline() is None


def test_long_poll_ends_at_the_first_lac_past_the_mark_or_when_all_answered() -> None:
    t = LongPollTally(3, previous_lac=5)
    t.on_answer(5)
    t.on_answer(None)
    assert not t.is_done
    t.on_answer(7)
    assert t.is_done and t.best == 7
    quiet = LongPollTally(2, previous_lac=5)
    quiet.on_answer(None)
    quiet.on_answer(5)
    assert quiet.is_done and quiet.best == 5


def _no_ack_quorum_hides(e: int, qw: int, qa: int, definite: set[int]) -> bool:
    """Brute force: no Qa bookies of any write set are all without a definite answer,
    so no ack quorum of a writer can have formed where the reader did not look."""
    for start in range(e):
        for group in combinations(write_set(start, e, qw), qa):
            if not definite.intersection(group):
                return False
    return True


@given(st.data())
def test_lac_coverage_matches_brute_force(data: st.DataObject) -> None:
    e = data.draw(st.integers(1, 6))
    qw = data.draw(st.integers(1, e))
    qa = data.draw(st.integers(1, qw))
    statuses = data.draw(st.lists(st.sampled_from([Status.OK, Status.NO_SUCH_ENTRY,
                                                   Status.NO_SUCH_LEDGER, Status.IO_ERROR,
                                                   Status.UNAUTHORIZED]),
                                  min_size=e, max_size=e))
    tally = LacTally(e, qw, qa)
    for index, status in enumerate(statuses):
        tally.on_answer(index, status, lac=index if status == Status.OK else -1)
    definite = {i for i, s in enumerate(statuses) if is_definite(s)}
    assert tally.is_done
    assert tally.covered == _no_ack_quorum_hides(e, qw, qa, definite)
    oks = [i for i, s in enumerate(statuses) if s == Status.OK]
    assert tally.best == (max(oks) if oks else -1)


def test_a_bounded_ledgers_follower_reads_up_to_every_lac_at_once() -> None:
    f = FollowerLac(unbounded=False)
    assert f.on_lac(7) is False and f.readable == 7
    assert f.on_lac(3) is False and (f.lac, f.readable) == (7, 7)  # never backwards


def test_an_unbounded_ledgers_follower_reads_past_its_metadata_only_after_reading_it_again(
        ) -> None:
    f = FollowerLac(unbounded=True)
    assert f.on_lac(7) is True and f.readable == -1
    covers = f.metadata_read_begins()
    assert f.on_lac(9) is True  # heard while the metadata read was on its way
    f.on_metadata(covers)
    assert f.readable == 7  # that read began before 9 was heard: it covers 7 only
    assert f.on_lac(9) is True
    f.on_metadata(f.metadata_read_begins())
    assert f.readable == 9 and f.on_lac(9) is False and f.on_lac(4) is False


def test_a_closed_ledgers_end_is_readable_whatever_was_heard() -> None:
    f = FollowerLac(unbounded=True, lac=2)
    assert f.readable == 2
    f.on_metadata(f.metadata_read_begins(), last_entry_id=12)
    assert (f.lac, f.readable) == (12, 12)
