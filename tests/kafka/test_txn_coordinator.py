"""The transaction coordinator's machine, driven without sockets or ZooKeeper: epochs
and fencing, the states a transaction goes through, what a crash leaves to complete,
timeouts; and the partition side (control batches, the transaction index, the LSO)."""

from __future__ import annotations

import pytest

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.control_records import (
    ControlType,
    TxnIndex,
    batch_kind,
    committed_prefix,
    control_batch,
    control_type,
)
from ledgerd.kafka.records import BatchError, BatchHeader, split_batches, with_base_offset
from ledgerd.kafka.txn_coordinator import (
    PendingOffset,
    TxnRecord,
    TxnRefused,
    TxnState,
    add_offsets,
    add_partitions,
    begin_end,
    complete,
    covered,
    fenced_abort,
    init_producer,
    markers,
    new_record,
    one_phase,
    pending_offsets,
    settle,
    time_out,
    txn_offset_commit,
)


def _ongoing(now: int = 1000) -> TxnRecord:
    r = new_record("app-1", 42, 60000, now)
    return add_partitions(r, producer_id=42, producer_epoch=0,
                          partitions=[("t", 0), ("t", 1), ("t", 0)], now_ms=now)


def test_record_round_trips_through_json() -> None:
    r = txn_offset_commit(
        add_offsets(_ongoing(), producer_id=42, producer_epoch=0, group="g", now_ms=5),
        producer_id=42, producer_epoch=0, group="g", now_ms=6,
        offsets=[PendingOffset(group="g", topic="in", partition=3, offset=17,
                               metadata=None)])
    assert TxnRecord.from_json(r.to_json(), "/x") == r


def test_a_transaction_commits_through_prepare_then_complete() -> None:
    r = _ongoing()
    assert r.state is TxnState.ONGOING and r.partitions == (("t", 0), ("t", 1))
    prepared = begin_end(r, producer_id=42, producer_epoch=0, commit=True, now_ms=2000)
    assert prepared.state is TxnState.PREPARE_COMMIT
    assert [(m.topic, m.partition, m.commit, m.producer_epoch) for m in markers(prepared)] \
        == [("t", 0, True, 0), ("t", 1, True, 0)]
    # a retry while it completes is told to wait; nothing new starts meanwhile
    with pytest.raises(TxnRefused) as exc:
        begin_end(prepared, producer_id=42, producer_epoch=0, commit=True, now_ms=2001)
    assert exc.value.code == ErrorCode.CONCURRENT_TRANSACTIONS
    with pytest.raises(TxnRefused) as exc:
        add_partitions(prepared, producer_id=42, producer_epoch=0, partitions=[("t", 2)],
                       now_ms=2001)
    assert exc.value.code == ErrorCode.CONCURRENT_TRANSACTIONS
    done = complete(prepared, prepared=prepared, now_ms=2002)
    assert done.state is TxnState.COMPLETE_COMMIT and not done.partitions
    assert markers(done) == []
    # the client's retry of the commit after a lost answer: accepted, unchanged
    assert begin_end(done, producer_id=42, producer_epoch=0, commit=True,
                     now_ms=2003) is done
    with pytest.raises(TxnRefused) as exc:
        begin_end(done, producer_id=42, producer_epoch=0, commit=False, now_ms=2003)
    assert exc.value.code == ErrorCode.INVALID_TXN_STATE


def test_init_producer_id_bumps_the_epoch_and_fences_the_old_producer() -> None:
    r = init_producer(new_record("app-1", 42, 60000, 0), timeout_ms=60000, now_ms=1)
    assert (r.producer_id, r.producer_epoch, r.state) == (42, 1, TxnState.EMPTY)
    for request in (
            lambda: add_partitions(r, producer_id=42, producer_epoch=0,
                                   partitions=[("t", 0)], now_ms=2),
            lambda: add_offsets(r, producer_id=42, producer_epoch=0, group="g", now_ms=2),
            lambda: begin_end(r, producer_id=42, producer_epoch=0, commit=True, now_ms=2)):
        with pytest.raises(TxnRefused) as exc:
            request()
        assert exc.value.code == ErrorCode.PRODUCER_FENCED
    with pytest.raises(TxnRefused) as exc:
        add_partitions(r, producer_id=7, producer_epoch=1, partitions=[("t", 0)], now_ms=2)
    assert exc.value.code == ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_init_producer_id_aborts_an_ongoing_transaction_of_the_previous_epoch() -> None:
    r = _ongoing()
    with pytest.raises(TxnRefused) as exc:
        init_producer(r, timeout_ms=60000, now_ms=3000)
    assert exc.value.code == ErrorCode.CONCURRENT_TRANSACTIONS
    fence = fenced_abort(exc.value)
    assert fence is not None
    # the abort carries the bumped epoch: the zombie's batches and requests are refused
    assert (fence.state, fence.producer_epoch, fence.last_epoch) == \
        (TxnState.PREPARE_ABORT, 1, 0)
    assert [(m.commit, m.producer_epoch) for m in markers(fence)] == [(False, 1), (False, 1)]
    with pytest.raises(TxnRefused) as exc:
        begin_end(fence, producer_id=42, producer_epoch=0, commit=True, now_ms=3001)
    assert exc.value.code == ErrorCode.PRODUCER_FENCED
    # until the abort completes the new producer waits; then it gets the next epoch
    with pytest.raises(TxnRefused) as exc:
        init_producer(fence, timeout_ms=60000, now_ms=3002)
    assert exc.value.code == ErrorCode.CONCURRENT_TRANSACTIONS
    aborted = complete(fence, prepared=fence, now_ms=3003)
    assert aborted.state is TxnState.COMPLETE_ABORT
    again = init_producer(aborted, timeout_ms=60000, now_ms=3004)
    assert (again.producer_epoch, again.state) == (2, TxnState.EMPTY)


def test_kip360_resume_with_the_epoch_before_the_fence() -> None:
    r = complete(time_out(_ongoing(), now_ms=10**9), prepared=time_out(_ongoing(),
                                                                       now_ms=10**9),
                 now_ms=10**9)
    assert r.last_epoch == 0 and r.producer_epoch == 1
    resumed = init_producer(r, timeout_ms=60000, now_ms=10**9 + 1, producer_id=42,
                            producer_epoch=0)
    assert resumed.producer_epoch == 2
    with pytest.raises(TxnRefused) as exc:
        init_producer(resumed, timeout_ms=60000, now_ms=10**9 + 2, producer_id=42,
                      producer_epoch=0)
    assert exc.value.code == ErrorCode.PRODUCER_FENCED


def test_a_silent_producer_times_out_and_its_transaction_is_aborted() -> None:
    r = _ongoing(now=1000)
    assert time_out(r, now_ms=1000 + 60000) is r
    out = time_out(r, now_ms=1000 + 60001)
    assert (out.state, out.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    idle = init_producer(new_record("app-1", 1, 100, 0), timeout_ms=100, now_ms=1)
    assert time_out(idle, now_ms=10**9) is idle


def test_offsets_wait_in_the_record_and_need_the_group_added() -> None:
    r = _ongoing()
    offsets = [PendingOffset(group="g", topic="in", partition=0, offset=5, metadata="m")]
    with pytest.raises(TxnRefused) as exc:
        txn_offset_commit(r, producer_id=42, producer_epoch=0, group="g",
                          offsets=offsets, now_ms=1)
    assert exc.value.code == ErrorCode.INVALID_TXN_STATE
    r = add_offsets(r, producer_id=42, producer_epoch=0, group="g", now_ms=1)
    r = txn_offset_commit(r, producer_id=42, producer_epoch=0, group="g", offsets=offsets,
                          now_ms=2)
    r = txn_offset_commit(r, producer_id=42, producer_epoch=0, group="g", now_ms=3,
                          offsets=[PendingOffset(group="g", topic="in", partition=0,
                                                 offset=9, metadata=None)])
    assert [o.offset for o in r.offsets] == [9]
    aborted = begin_end(r, producer_id=42, producer_epoch=0, commit=False, now_ms=4)
    assert aborted.offsets == r.offsets  # the gateway stores them only for a commit
    assert complete(aborted, prepared=aborted, now_ms=5).offsets == ()


def test_offsets_are_unstable_while_the_transaction_may_still_commit_them() -> None:
    r = add_offsets(_ongoing(), producer_id=42, producer_epoch=0, group="g", now_ms=1)
    assert pending_offsets(r, "g") == frozenset() and pending_offsets(None, "g") == set()
    r = txn_offset_commit(r, producer_id=42, producer_epoch=0, group="g", now_ms=2,
                          offsets=[PendingOffset(group="g", topic="in", partition=p,
                                                 offset=9, metadata=None) for p in (0, 3)])
    assert pending_offsets(r, "g") == {("in", 0), ("in", 3)}
    assert pending_offsets(r, "other") == frozenset()
    committing = begin_end(r, producer_id=42, producer_epoch=0, commit=True, now_ms=3)
    assert pending_offsets(committing, "g") == {("in", 0), ("in", 3)}
    assert pending_offsets(complete(committing, prepared=committing, now_ms=4), "g") == set()
    aborting = begin_end(r, producer_id=42, producer_epoch=0, commit=False, now_ms=3)
    assert pending_offsets(aborting, "g") == frozenset()  # the committed ones stand


def test_bad_timeout_is_refused() -> None:
    with pytest.raises(TxnRefused) as exc:
        new_record("x", 1, 0, 0)
    assert exc.value.code == ErrorCode.INVALID_TRANSACTION_TIMEOUT


# -- the partition side ------------------------------------------------------------------


def _data(pid: int, offset: int, n: int = 1, *, transactional: bool = True) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0,
                                  is_transactional=transactional, producer_id=pid,
                                  producer_epoch=0, base_sequence=0, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1000, key=None, value=b"v%d" % i, headers=[])
    return with_base_offset(bytes(b.build()), offset)


def _marker(pid: int, offset: int, commit: bool) -> bytes:
    return with_base_offset(control_batch(producer_id=pid, producer_epoch=0,
                                          commit=commit), offset)


def test_control_batch_is_a_valid_marker_that_clients_cannot_produce() -> None:
    for commit in (True, False):
        raw = control_batch(producer_id=9, producer_epoch=4, commit=commit,
                            coordinator_epoch=3, timestamp_ms=77)
        h = BatchHeader.parse(raw)
        assert (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == \
            (9, 4, -1, 1)
        assert h.attributes == 0x30
        assert control_type(raw) is (ControlType.COMMIT if commit else ControlType.ABORT)
        from kafka.record.default_records import DefaultRecordBatch

        oracle = DefaultRecordBatch(raw)  # kafka-python reads it as Kafka writes it
        assert oracle.validate_crc() and oracle.is_control_batch and oracle.is_transactional
        [record] = list(oracle)
        assert record.key == bytes([0, 0, 0, int(commit)])
        assert record.value == b"\x00\x00\x00\x00\x00\x03"
        with pytest.raises(BatchError):
            split_batches(raw, max_batch_bytes=1 << 20, transactional=True)
    # transactional batches only in a transactional request, and only those there
    assert split_batches(_data(1, 0), max_batch_bytes=1 << 20, transactional=True)
    with pytest.raises(BatchError):
        split_batches(_data(1, 0), max_batch_bytes=1 << 20)
    with pytest.raises(BatchError):
        split_batches(_data(1, 0, transactional=False), max_batch_bytes=1 << 20,
                      transactional=True)


def test_index_gives_the_lso_and_the_aborted_transactions_a_fetch_lists() -> None:
    log = [_data(1, 0, 2), _data(0, 2, transactional=False), _data(2, 3), _marker(1, 4, False),
           _data(3, 5), _marker(2, 6, True)]
    index = TxnIndex()
    lsos = []
    for raw in log:
        h = BatchHeader.parse(raw)
        index.observe(h, batch_kind(raw, h))
        lsos.append(index.last_stable_offset(h.next_offset))
    # pid 1 holds the LSO at 0 until its abort at 4, then pid 2 (from 3) until 6, pid 3
    # (from 5) stays open
    assert lsos == [0, 0, 0, 3, 3, 5]
    assert index.covered == 7
    assert index.aborted_between(0, 6) == [(1, 0)]
    assert index.aborted_between(5, 6) == []  # ended (at 4) before the fetch's start
    index.observe(BatchHeader.parse(log[0]))  # seen already: nothing changes
    assert index.last_stable_offset(7) == 5
    records = b"".join(log)
    kept, last = committed_prefix(records, 5)
    assert last == 4 and kept == b"".join(log[:4])
    assert committed_prefix(records, 0) == (b"", -1)
    assert committed_prefix(records, 7) == (records, 6)


def test_the_coordinator_that_wrote_the_markers_settles_the_record_in_its_next_change(
        ) -> None:
    """Issue #47: COMPLETE_* and the next change (here the next transaction's
    ONGOING, or a new producer's epoch) in one write, but only from the very PREPARE
    record whose markers the caller wrote."""
    prepared = begin_end(_ongoing(), producer_id=42, producer_epoch=0, commit=True,
                         now_ms=2000)
    with pytest.raises(TxnRefused) as exc:
        add_partitions(prepared, producer_id=42, producer_epoch=0, partitions=[("u", 0)],
                       now_ms=3000)
    assert exc.value.code == ErrorCode.CONCURRENT_TRANSACTIONS
    settled = settle(prepared, completed=prepared, now_ms=3000)
    assert settled.state is TxnState.COMPLETE_COMMIT and settled.partitions == ()
    nxt = add_partitions(settled, producer_id=42, producer_epoch=0, partitions=[("u", 0)],
                         now_ms=3000)
    assert (nxt.state, nxt.partitions, nxt.started_ms) == (TxnState.ONGOING, (("u", 0),), 3000)
    assert init_producer(settled, timeout_ms=60000, now_ms=3000).producer_epoch == 1
    # nothing to settle: the same object; a later transaction prepared at the same
    # epoch is not the one whose markers exist
    later = begin_end(nxt, producer_id=42, producer_epoch=0, commit=False, now_ms=4000)
    for r, done in ((later, prepared), (prepared, later), (prepared, None), (nxt, nxt)):
        assert settle(r, completed=done, now_ms=5000) is r


def test_one_phase_only_for_one_partition_no_group_under_the_stored_record() -> None:
    """A transaction may end with its marker alone only when it touched one partition
    and no group, and the stored record (what a coordinator taking over sees) stands
    for it: ONGOING at its epoch with that partition, begun at most a quarter of the
    timeout earlier (the next transactions begin under it while that holds)."""
    stored = add_partitions(new_record("a", 42, 60000, 1000), producer_id=42,
                            producer_epoch=0, partitions=[("t", 0)], now_ms=1000)
    end = begin_end(stored, producer_id=42, producer_epoch=0, commit=True, now_ms=1001)
    marker = one_phase(stored, end)
    assert marker is not None and (marker.topic, marker.partition, marker.commit) == \
        ("t", 0, True)
    two = add_partitions(stored, producer_id=42, producer_epoch=0,
                         partitions=[("t", 1)], now_ms=1002)
    assert one_phase(two, begin_end(two, producer_id=42, producer_epoch=0, commit=True,
                                    now_ms=1003)) is None
    grouped = add_offsets(stored, producer_id=42, producer_epoch=0, group="g", now_ms=1002)
    assert one_phase(grouped, begin_end(grouped, producer_id=42, producer_epoch=0,
                                        commit=False, now_ms=1003)) is None
    assert one_phase(stored, stored) is None  # not ended yet
    done = complete(end, prepared=end, now_ms=1002)
    later = add_partitions(done, producer_id=42, producer_epoch=0, partitions=[("t", 0)],
                           now_ms=1000 + 15000)
    assert covered(stored, later) and one_phase(stored, begin_end(
        later, producer_id=42, producer_epoch=0, commit=True, now_ms=16001)) is not None
    stale = add_partitions(done, producer_id=42, producer_epoch=0, partitions=[("t", 0)],
                           now_ms=1000 + 15001)
    assert not covered(stored, stale)
    wider = add_partitions(later, producer_id=42, producer_epoch=0, partitions=[("t", 1)],
                           now_ms=16002)
    assert not covered(stored, wider)
    fenced = init_producer(done, timeout_ms=60000, now_ms=1003)
    assert not covered(stored, add_partitions(fenced, producer_id=42, producer_epoch=1,
                                              partitions=[("t", 0)], now_ms=1004))
