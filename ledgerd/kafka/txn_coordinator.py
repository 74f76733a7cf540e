"""The transaction coordinator's decisions (KIP-98), as a pure machine.

A *transactional id* names a producer across restarts. Its record holds the producer
id and epoch it was last given, the state of its current transaction, the partitions
and consumer groups that transaction touched, and the offsets it committed to those
groups (visible only once it commits). States and transitions (Kafka's
``TransactionState``)::

    EMPTY / COMPLETE_* --AddPartitions/AddOffsets--> ONGOING
    ONGOING --EndTxn(commit)--> PREPARE_COMMIT --markers written--> COMPLETE_COMMIT
    ONGOING --EndTxn(abort) / timeout / InitProducerId--> PREPARE_ABORT --> COMPLETE_ABORT

Rules kept here:

- InitProducerId bumps the epoch, so every request of an older producer (a zombie)
  is refused PRODUCER_FENCED (INVALID_PRODUCER_EPOCH to older request versions); a
  transaction still ONGOING is aborted first with the epoch bumped (the client is
  told CONCURRENT_TRANSACTIONS and retries), as is one whose producer stayed silent
  past its ``transaction.timeout.ms``.
- The decision (PREPARE_COMMIT / PREPARE_ABORT) is made durable before any marker is
  written; whoever finds a record in a PREPARE state (the coordinator after a crash,
  another gateway after the ownership moved) writes the markers again and completes
  it. Markers are idempotent in effect: a second COMMIT for a transaction that has
  ended changes nothing a reader sees.
- A transaction in a PREPARE state takes no new request (CONCURRENT_TRANSACTIONS):
  the next transaction starts only once every marker of the last is written, so a
  producer's late batch can never land after its own marker (Jepsen's "hanging
  transaction"; the partitions also check, ``partitions.py``). The one exception is
  the coordinator that wrote those markers: its next change of the record may
  complete it first (``settle``), so COMPLETE_* rides on the producer's next request
  (AddPartitionsToTxn, usually) instead of costing a write of its own.
- One phase (``one_phase``): a transaction that touched one partition and no group,
  ended by the coordinator that leads that partition, needs no PREPARE_* record: the
  marker in that partition's log is its only participant's decision. Its record stays
  as stored, ONGOING with that partition, which is what recovery needs (a coordinator
  that finds it so writes a marker there, and a marker with no transaction open
  changes nothing a reader sees); the coordinator keeps the true state in memory and
  writes it later, or never, if the producer's next transaction fits under the stored
  record (``covered``). So a steady producer's transactions write no record at all.

Every change is a function ``record -> record`` applied under compare-and-set by the
gateway (``metadata.cas.cas_update``); a refusal raises :class:`TxnRefused` with the
Kafka error code, leaving the record as it was. Time comes in as ``now_ms``
(wall-clock milliseconds: records move between gateways).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ledgerd.errors import LedgerdError
from ledgerd.kafka.api import ErrorCode
from ledgerd.metadata.errors import ChangeRejectedError
from ledgerd.metadata.kafka_txns import MAX_EPOCH, PendingOffset, TxnRecord, TxnState

__all__ = [
    "MAX_EPOCH", "MAX_TXN_OFFSETS", "MAX_TXN_PARTITIONS", "Marker", "PendingOffset",
    "TxnRecord", "TxnRefused", "TxnState", "add_offsets", "add_partitions", "begin_end",
    "complete", "covered", "init_producer", "markers", "needs_completion", "new_record",
    "one_phase", "pending_offsets", "settle",
    "time_out", "txn_offset_commit",
]

MAX_TXN_PARTITIONS = 10_000  # partitions one transaction may touch
MAX_TXN_OFFSETS = 10_000  # offsets one transaction may commit
MAX_TIMEOUT_MS = 900_000  # Kafka: transaction.max.timeout.ms


PREPARED = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})
IDLE = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})


class TxnRefused(ChangeRejectedError):
    """A request the record's state refuses; ``code`` is the Kafka error to answer."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        self.code = code
        super().__init__(reason)


class NeedProducerId(LedgerdError):
    """The transactional id has no record yet, or its epoch is exhausted: allocate a
    producer id and apply the change again with it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Marker:
    """One control batch to write: into ``topic``/``partition``, ending the
    transaction of ``producer_id`` at ``producer_epoch``."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool


def _check_timeout(timeout_ms: int) -> None:
    if not 0 < timeout_ms <= MAX_TIMEOUT_MS:
        raise TxnRefused(ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                         f"transaction.timeout.ms {timeout_ms}: allowed 1-{MAX_TIMEOUT_MS}")


def new_record(transactional_id: str, producer_id: int, timeout_ms: int,
               now_ms: int) -> TxnRecord:
    """The first record of a transactional id: a fresh producer id at epoch 0."""
    _check_timeout(timeout_ms)
    return TxnRecord(transactional_id=transactional_id, producer_id=producer_id,
                     producer_epoch=0, timeout_ms=timeout_ms, updated_ms=now_ms)


def _fence(record: TxnRecord, now_ms: int) -> TxnRecord:
    """Abort the ONGOING transaction with the epoch bumped: its producer is fenced."""
    return replace(record, state=TxnState.PREPARE_ABORT, last_epoch=record.producer_epoch,
                   producer_epoch=min(record.producer_epoch + 1, MAX_EPOCH + 1),
                   updated_ms=now_ms)


def init_producer(record: TxnRecord, *, timeout_ms: int, now_ms: int,
                  producer_id: int = -1, producer_epoch: int = -1,
                  new_producer_id: int | None = None) -> TxnRecord:
    """InitProducerId for an existing transactional id: the next epoch (or a new
    producer id with ``new_producer_id`` once the epoch is exhausted). An ONGOING
    transaction is aborted first (fenced) and the request refused
    CONCURRENT_TRANSACTIONS, as is one still completing. ``producer_id`` /
    ``producer_epoch`` (v3+, KIP-360): the caller's current ones, -1 if none; they
    must be the record's (or its epoch before the last fencing bump)."""
    _check_timeout(timeout_ms)
    if producer_id >= 0:
        if producer_id != record.producer_id:
            raise TxnRefused(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                             f"producer id {producer_id} is not the transactional id's")
        if producer_epoch not in (record.producer_epoch, record.last_epoch):
            raise TxnRefused(ErrorCode.PRODUCER_FENCED,
                             f"epoch {producer_epoch} was fenced by epoch "
                             f"{record.producer_epoch}")
    if record.state in PREPARED:
        raise TxnRefused(ErrorCode.CONCURRENT_TRANSACTIONS,
                         f"the last transaction is completing ({record.state.value})")
    if record.state is TxnState.ONGOING:
        raise _Fenced(_fence(record, now_ms))
    if record.producer_epoch >= MAX_EPOCH:
        if new_producer_id is None:
            raise NeedProducerId(f"epoch {record.producer_epoch} exhausted")
        return replace(record, producer_id=new_producer_id, producer_epoch=0, last_epoch=-1,
                       timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=(),
                       groups=(), offsets=(), started_ms=-1, updated_ms=now_ms)
    return replace(record, producer_epoch=record.producer_epoch + 1, last_epoch=-1,
                   timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=(), groups=(),
                   offsets=(), started_ms=-1, updated_ms=now_ms)


class _Fenced(TxnRefused):
    """InitProducerId found a transaction ONGOING: write ``record`` (its abort, the
    epoch bumped), complete it, and answer CONCURRENT_TRANSACTIONS."""

    def __init__(self, record: TxnRecord) -> None:
        self.record = record
        super().__init__(ErrorCode.CONCURRENT_TRANSACTIONS,
                         "the ongoing transaction is being aborted")


def fenced_abort(exc: TxnRefused) -> TxnRecord | None:
    """The record to write when ``exc`` asks for an ongoing transaction's abort."""
    return exc.record if isinstance(exc, _Fenced) else None


def _check_producer(record: TxnRecord, producer_id: int, producer_epoch: int) -> None:
    if producer_id != record.producer_id:
        raise TxnRefused(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                         f"producer id {producer_id} is not {record.transactional_id!r}'s "
                         f"({record.producer_id})")
    if producer_epoch != record.producer_epoch:
        raise TxnRefused(ErrorCode.PRODUCER_FENCED,
                         f"producer epoch {producer_epoch} is not the current "
                         f"{record.producer_epoch}: fenced")


def _begin(record: TxnRecord, now_ms: int) -> TxnRecord:
    if record.state in PREPARED:
        raise TxnRefused(ErrorCode.CONCURRENT_TRANSACTIONS,
                         f"the last transaction is completing ({record.state.value})")
    if record.state is TxnState.ONGOING:
        return record
    return replace(record, state=TxnState.ONGOING, partitions=(), groups=(), offsets=(),
                   started_ms=now_ms, updated_ms=now_ms)


def add_partitions(record: TxnRecord, *, producer_id: int, producer_epoch: int,
                   partitions: list[tuple[str, int]], now_ms: int) -> TxnRecord:
    """AddPartitionsToTxn: the transaction (begun if idle) includes ``partitions``."""
    _check_producer(record, producer_id, producer_epoch)
    begun = _begin(record, now_ms)
    new = [p for p in dict.fromkeys(partitions) if p not in begun.partitions]
    if not new:
        return begun
    if len(begun.partitions) + len(new) > MAX_TXN_PARTITIONS:
        raise TxnRefused(ErrorCode.INVALID_REQUEST,
                         f"a transaction touches at most {MAX_TXN_PARTITIONS} partitions")
    return replace(begun, partitions=begun.partitions + tuple(new), updated_ms=now_ms)


def add_offsets(record: TxnRecord, *, producer_id: int, producer_epoch: int, group: str,
                now_ms: int) -> TxnRecord:
    """AddOffsetsToTxn: the transaction (begun if idle) commits offsets of ``group``."""
    _check_producer(record, producer_id, producer_epoch)
    begun = _begin(record, now_ms)
    if group in begun.groups:
        return begun
    if len(begun.groups) >= 100:
        raise TxnRefused(ErrorCode.INVALID_REQUEST, "a transaction commits offsets of at "
                                                    "most 100 groups")
    return replace(begun, groups=(*begun.groups, group), updated_ms=now_ms)


def txn_offset_commit(record: TxnRecord, *, producer_id: int, producer_epoch: int,
                      group: str, offsets: list[PendingOffset], now_ms: int) -> TxnRecord:
    """TxnOffsetCommit: ``offsets`` wait in the record until the transaction commits
    (a later one for the same group and partition replaces an earlier one)."""
    _check_producer(record, producer_id, producer_epoch)
    if record.state is not TxnState.ONGOING or group not in record.groups:
        raise TxnRefused(ErrorCode.INVALID_TXN_STATE,
                         f"group {group!r} was not added to an ongoing transaction "
                         "(AddOffsetsToTxn first)")
    keys = {(o.group, o.topic, o.partition) for o in offsets}
    kept = tuple(o for o in record.offsets if (o.group, o.topic, o.partition) not in keys)
    merged = kept + tuple(offsets)
    if len(merged) > MAX_TXN_OFFSETS:
        raise TxnRefused(ErrorCode.INVALID_REQUEST,
                         f"a transaction commits at most {MAX_TXN_OFFSETS} offsets")
    return replace(record, offsets=merged, updated_ms=now_ms)


def pending_offsets(record: TxnRecord | None, group: str) -> frozenset[tuple[str, int]]:
    """The partitions whose committed offset in ``group`` the transaction may still
    change (KIP-447's unstable offsets): those it gave offsets of the group while
    ONGOING or committing. An aborting transaction's offsets are dropped, so the
    committed ones already stand."""
    if record is None or record.state not in (TxnState.ONGOING, TxnState.PREPARE_COMMIT):
        return frozenset()
    return frozenset((o.topic, o.partition) for o in record.offsets if o.group == group)


def begin_end(record: TxnRecord, *, producer_id: int, producer_epoch: int, commit: bool,
              now_ms: int) -> TxnRecord:
    """EndTxn: ONGOING -> PREPARE_COMMIT / PREPARE_ABORT (then ``markers`` and
    ``complete``). A retry of an EndTxn that already completed returns the record
    unchanged; one still completing is refused CONCURRENT_TRANSACTIONS."""
    _check_producer(record, producer_id, producer_epoch)
    want = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    if record.state is TxnState.ONGOING:
        return replace(record, state=want, updated_ms=now_ms)
    if record.state is done:
        return record
    if record.state is want:
        raise TxnRefused(ErrorCode.CONCURRENT_TRANSACTIONS,
                         f"the transaction is completing ({record.state.value})")
    raise TxnRefused(ErrorCode.INVALID_TXN_STATE,
                     f"{'commit' if commit else 'abort'} of a transaction in state "
                     f"{record.state.value}")


def time_out(record: TxnRecord, *, now_ms: int) -> TxnRecord:
    """An ONGOING transaction past its timeout is aborted with the epoch bumped (its
    producer fenced); any other record is returned unchanged."""
    if record.state is TxnState.ONGOING and now_ms > record.started_ms + record.timeout_ms:
        return _fence(record, now_ms)
    return record


def needs_completion(record: TxnRecord) -> bool:
    return record.state in PREPARED


def markers(record: TxnRecord) -> list[Marker]:
    """The control batches a PREPARE_* record still needs written (all of them: the
    machine does not remember which were, writing one twice is harmless)."""
    if record.state not in PREPARED:
        return []
    commit = record.state is TxnState.PREPARE_COMMIT
    return [Marker(topic=t, partition=p, producer_id=record.producer_id,
                   producer_epoch=record.producer_epoch, commit=commit)
            for t, p in record.partitions]


def complete(record: TxnRecord, *, prepared: TxnRecord, now_ms: int) -> TxnRecord:
    """PREPARE_* -> COMPLETE_*, once every marker of ``prepared`` (the record whose
    markers were written) is written and, for a commit, its offsets stored. Refused
    if the record moved on meanwhile (another coordinator completed it)."""
    if (record.state is not prepared.state or record.producer_id != prepared.producer_id
            or record.producer_epoch != prepared.producer_epoch):
        raise TxnRefused(ErrorCode.CONCURRENT_TRANSACTIONS, "completed elsewhere")
    state = TxnState.COMPLETE_COMMIT if record.state is TxnState.PREPARE_COMMIT \
        else TxnState.COMPLETE_ABORT
    return replace(record, state=state, partitions=(), groups=(), offsets=(),
                   started_ms=-1, updated_ms=now_ms)


def settle(record: TxnRecord, *, completed: TxnRecord | None, now_ms: int) -> TxnRecord:
    """``record`` completed if it is ``completed``, the very PREPARE_* record whose
    markers (and a commit's offsets) the caller has written, else unchanged (the same
    object): applied before any other change, it folds COMPLETE_* into that change's
    write. A later transaction prepared at the same epoch is a different record."""
    if completed is None or record.state not in PREPARED or record != completed:
        return record
    return complete(record, prepared=completed, now_ms=now_ms)


def covered(stored: TxnRecord, record: TxnRecord) -> bool:
    """True if ``stored`` (the record as ZooKeeper holds it) stands for ``record``, the
    coordinator's ONGOING transaction, in recovery: ONGOING at the same producer id and
    epoch, with every partition ``record`` may have written to, no groups (their
    offsets would be held as unstable), and begun at most a quarter of the timeout
    before it (a coordinator that takes over times the transaction out from the stored
    start). Then the coordinator need not write ``record``."""
    return (stored.state is TxnState.ONGOING and record.state is TxnState.ONGOING
            and record.producer_id == stored.producer_id
            and record.producer_epoch == stored.producer_epoch
            and record.last_epoch == stored.last_epoch
            and record.timeout_ms == stored.timeout_ms
            and not record.groups and not stored.groups and not stored.offsets
            and set(record.partitions) <= set(stored.partitions)
            and 0 <= record.started_ms - stored.started_ms <= record.timeout_ms // 4)


def one_phase(stored: TxnRecord, record: TxnRecord) -> Marker | None:
    """The marker that alone ends ``record``'s ONGOING transaction once EndTxn has
    moved it to PREPARE_* (``record``, in memory only): its one partition's, if the
    transaction touched no group and ``stored`` covers it; else None (the decision is
    written first, in two phases)."""
    if record.state not in PREPARED or len(record.partitions) != 1 or record.groups \
            or record.offsets:
        return None
    ongoing = replace(record, state=TxnState.ONGOING)
    if not covered(stored, ongoing):
        return None
    return markers(record)[0]
