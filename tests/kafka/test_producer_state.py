"""The idempotent producers' rules as a pure machine (``producer_state.py``), driven
without a partition or a socket: duplicates answered with their first offset (also
within one append group), sequence gaps and old epochs refused, a new epoch from 0,
an unknown producer at any sequence, sequences wrapping after 2**31 - 1, and only the
last five batches of a producer remembered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.producer_state import (
    PRODUCER_BATCHES,
    SEQUENCE_WRAP,
    ProducerState,
    last_sequence,
)


def _written(state: ProducerState, *batches: tuple[int, int, int, int, int]) -> None:
    for pid, epoch, first, records, offset in batches:
        state.note(pid, epoch, first, last_sequence(first, records), offset)


def test_a_retry_is_answered_with_its_first_offset_and_a_gap_or_old_epoch_refused() -> None:
    state = ProducerState()
    _written(state, (7, 1, 0, 3, 100), (7, 1, 3, 2, 103))
    group = state.group()
    assert group.admit((7, 1, 0, 2), 200) == (100, 0)  # a retry: not written again
    assert group.admit((7, 1, 3, 4), 200) == (103, 0)
    assert group.admit((7, 1, 6, 6), 200) == (None, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert group.admit((7, 0, 5, 5), 200) == (None, ErrorCode.INVALID_PRODUCER_EPOCH)
    assert group.admit((7, 2, 1, 1), 200) == (None, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert group.admit((7, 1, 5, 9), 200) == (None, 0)  # continues: placed at 200
    assert group.admit((7, 1, 10, 10), 205) == (None, 0)  # continues what this group placed
    assert group.admit((7, 1, 5, 9), 206) == (200, 0)  # a retry of a batch still queued
    assert group.admit((9, 4, 1234, 1240), 206) == (None, 0)  # unknown producer: any sequence
    assert group.admit((7, 2, 0, 0), 207) == (None, 0)  # a bumped epoch starts at 0


def test_nothing_is_remembered_until_a_batch_is_noted_and_sequences_wrap() -> None:
    state = ProducerState()
    state.group().admit((1, 0, 0, 4), 0)
    assert 1 not in state  # admitted, not written: the group failed, say
    _written(state, (1, 0, SEQUENCE_WRAP - 2, 2, 10))
    assert last_sequence(SEQUENCE_WRAP - 2, 2) == SEQUENCE_WRAP - 1
    assert state.sequence_error((1, 0, 0, 3)) == 0  # after 2**31 - 1 comes 0
    assert state.sequence_error((1, 0, SEQUENCE_WRAP, 3)) == \
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    state.note(1, 0, -1, -1, 99)  # no sequence: not an idempotent producer's batch
    assert state.duplicate((1, 0, -1, -1)) is None


@given(st.integers(min_value=1, max_value=20))
def test_only_the_last_batches_of_a_producer_are_remembered(count: int) -> None:
    state = ProducerState()
    for i in range(count):
        state.note(3, 0, i * 10, i * 10 + 9, 1000 + i)
    remembered = [i for i in range(count)
                  if state.duplicate((3, 0, i * 10, i * 10 + 9)) is not None]
    assert remembered == list(range(max(0, count - PRODUCER_BATCHES), count))


def test_a_batch_reusing_an_ended_transactions_sequences_is_refused_not_answered() -> None:
    """The outside audit's loss: a transactional batch stored but unanswered (its
    gateway killed), the transaction aborted (marker), then the next transaction's
    batch with the same epoch and sequences. Answered as a duplicate, with the aborted
    batch's offset, its records were lost though its commit succeeded; now it is
    refused (the producer aborts and bumps its epoch). A retry within a transaction
    still is a duplicate, and one matching only a batch's first sequence is not."""
    state = ProducerState()
    _written(state, (7, 2, 0, 3, 23))  # the aborted transaction's batch
    assert state.group().admit((7, 2, 0, 2), 30) == (23, 0)  # its retry, before the end
    state.end(7, 26)  # the abort marker
    assert state.group().admit((7, 2, 0, 2), 30) == (None, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert state.group().admit((7, 2, 3, 5), 30) == (None, 0)  # the sequence goes on
    _written(state, (7, 2, 3, 3, 27))
    assert state.group().admit((7, 2, 3, 5), 40) == (27, 0)  # a retry in the new one
    assert state.group().admit((7, 2, 3, 3), 40) == (None, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)


def test_a_marker_in_the_same_append_group_ends_the_retries_before_it() -> None:
    state = ProducerState()
    _written(state, (7, 2, 0, 3, 23))
    group = state.group()
    group.end(7)
    assert group.admit((7, 2, 0, 2), 30) == (None, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)


def test_a_marker_older_than_the_producers_newest_epoch_is_stale() -> None:
    """A coordinator that ends a transaction with its marker alone (one phase) must
    learn when its record has moved on: a marker of an epoch older than one the
    partition has seen of the producer (a batch's, a marker's, or one placed earlier
    in the same append group) is stale; one of the same or a newer epoch is not, and
    neither is any marker of a producer not known here."""
    state = ProducerState()
    assert not state.group().stale_marker(7, 0)
    state.note(7, 3, 0, 9, 100)
    group = state.group()
    assert group.stale_marker(7, 2) and not group.stale_marker(7, 3)
    assert not group.stale_marker(7, 4)
    group.end(7, 5)  # a fencing abort placed in this group
    assert group.stale_marker(7, 4) and not group.stale_marker(7, 5)
    state.end(7, 110, 5)
    assert state.epoch(7) == 5 and state.group().stale_marker(7, 4)
    state.clear()
    assert state.epoch(7) == -1 and not state.group().stale_marker(7, 0)
    state.end(8, 5, 2)  # a marker of a producer whose batches are not remembered
    assert state.epoch(8) == 2 and state.group().stale_marker(8, 1)


def test_a_batch_older_than_the_producers_last_marker_is_fenced() -> None:
    """As Kafka's partitions do: a marker written at a bumped epoch (the coordinator
    fenced the producer) fences that producer's batches of older epochs, so a zombie's
    batch cannot open a transaction after it; the new epoch's batches go on."""
    state = ProducerState()
    state.note(7, 3, 0, 9, 100)
    state.end(7, 110, 4)
    group = state.group()
    assert group.admit((7, 3, 10, 19), 111) == (None, ErrorCode.INVALID_PRODUCER_EPOCH)
    assert group.admit((7, 5, 0, 9), 111) == (None, 0)
    other = state.group()
    other.end(8, 2)
    assert other.admit((8, 1, 0, 0), 112) == (None, ErrorCode.INVALID_PRODUCER_EPOCH)
    assert other.admit((8, 2, 0, 0), 112) == (None, 0)
