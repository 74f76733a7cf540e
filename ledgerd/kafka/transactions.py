"""The gateway's transaction coordinator: the I/O around ``txn_coordinator``'s machine.

The coordinator of a transactional id is the gateway that rendezvous hashing gives
``txn/<id>`` (FindCoordinator key type 1), as for groups. Its record lives in
ZooKeeper at ``<root>/kafka/transactions/<id>`` (``metadata.kafka_txns``) and every change
is a compare-and-set of the machine's transition over the record just read, so a
coordinator that crashed, or lost the id to another gateway, leaves nothing that the
next one does not see. In memory there is only a cache of the records this gateway
wrote (used to check transactional produce requests without a ZooKeeper read),
dropped whenever the set of live gateways or the ZooKeeper session changes. With each
record it wrote the cache keeps its znode version, so the next change of that record
is a compare-and-set against it without reading it first (a version conflict reads
it; ``metadata.cas``), and completing a transaction this gateway just prepared does
not read back what it just wrote: a steady producer's transaction costs two writes
(ONGOING together with the last one's COMPLETE_*, then PREPARE_*; see below) and no
read, or none at all when it ends in one phase (below).

Ending a transaction: EndTxn writes PREPARE_COMMIT / PREPARE_ABORT, then the markers
(one control batch per partition the transaction touched) and, for a commit, the
offsets it committed to consumer groups (as the groups' cursors), then
COMPLETE_*. EndTxn is answered once the markers are written, or after
``COMPLETE_WAIT_S`` at most: the decision is durable by then and completing it is
the recovery task's job. COMPLETE_* is not written at once: the producer's next
request (AddPartitionsToTxn, usually within milliseconds) writes it together with its
own change (``txn_coordinator.settle``, applied by every change this gateway makes to
a record whose markers it wrote): two ZooKeeper writes per transaction instead of
three. If no change comes within ``FOLD_WAIT_S`` this gateway writes COMPLETE_* alone;
meanwhile the record is PREPARE_*, which any other gateway treats as before (it
writes the markers again and completes it). A marker for a partition this gateway leads goes into its
log through the partition's appender; one for a partition another gateway leads is
sent to it as WriteTxnMarkers (``peer.py``), and retried until it is written.

One phase (``txn_coordinator.one_phase``): EndTxn of a transaction that touched one
partition, led here, and no group writes that partition's marker and nothing else.
Until the marker is written the cache holds the transaction PREPARE_* (in memory
only: the other requests for the id are refused CONCURRENT_TRANSACTIONS), then
COMPLETE_*; ``_stored`` keeps what ZooKeeper holds meanwhile (ONGOING with that
partition), and every change of the id is decided on the cache: one the stored record
covers (``txn_coordinator.covered``: the next transaction on the same partition) is
not written once a stat read shows the stored version unchanged (``_still_stored``),
any other is written over the stored version; the one-phase marker is written after
the same check. ``FOLD_WAIT_S`` after the
transaction the true state is written unless the next one began under the stored
record. A marker that is not written (refused as stale, not led here any more, or not
answered in ``COMPLETE_WAIT_S``) sends EndTxn down the two-phase path. Losing the cache
(the gateway dies, or its view changes) leaves the stored ONGOING record, from which
any coordinator ends the transaction as its producer asks next (see
``txn_coordinator``).

Recovery: every ``TICK_S`` each gateway reads the records of the transactional ids it
coordinates; it completes those found in a PREPARE state (a coordinator killed
between the decision and the markers) and aborts, with the producer's epoch bumped,
those ONGOING past their ``transaction.timeout.ms`` (a producer that is gone), and
deletes those idle (no transaction open) for ``transactional_id_expiration_ms``, as
Kafka expires transactional ids, so the records do not grow without bound.

Produce: a transactional batch is accepted only for a partition that the producer's
ongoing transaction added (KIP-890's verification): ``verify`` asks the record, and
the partition remembers the answer until it writes a marker for that producer, so a
batch arriving after its transaction ended is refused INVALID_TXN_STATE instead of
opening a transaction nobody will ever end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from ledgerd.base.fanout import each_at_most
from ledgerd.base.logs import fields
from ledgerd.errors import LedgerdError
from ledgerd.kafka.api import ApiKey, ErrorCode
from ledgerd.kafka.control_records import committed_prefix, control_batch
from ledgerd.kafka.peer import PeerAuthError
from ledgerd.kafka.records import BatchHeader
from ledgerd.kafka.storage_errors import storage_error_code
from ledgerd.kafka.txn_coordinator import (
    Marker,
    NeedProducerId,
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
    needs_completion,
    new_record,
    one_phase,
    pending_offsets,
    settle,
    time_out,
    txn_offset_commit,
)
from ledgerd.metadata.errors import (
    BadVersionError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
)
from ledgerd.metadata.kafka_groups import group_znode
from ledgerd.metadata.kafka_txns import TxnStore
from ledgerd.wire.status import FencedError

if TYPE_CHECKING:
    from ledgerd.kafka.gateway import Gateway
    from ledgerd.kafka.partitions import PartitionLog, _Produce

__all__ = ["TxnCoordinator", "admit_transactional", "read_committed"]

log = logging.getLogger(__name__)

_IDLE = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
TICK_S = 1.0  # how often each gateway looks for transactions to complete or time out
COMPLETE_WAIT_S = 10.0  # EndTxn waits this long for its markers before answering
FOLD_WAIT_S = 0.25  # how long COMPLETE_* waits to ride on the next transaction's write
MARKER_RETRY_S = 0.2
PENDING_READS = 16  # records read at once for one OffsetFetch's require_stable

# the first version of each API that knows PRODUCER_FENCED (older ones are told
# INVALID_PRODUCER_EPOCH, which they treat as fenced too)
_FENCED_FROM = {ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 2,
                ApiKey.ADD_OFFSETS_TO_TXN: 2, ApiKey.END_TXN: 2,
                ApiKey.TXN_OFFSET_COMMIT: 1 << 30}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _code(api: ApiKey, version: int, code: int) -> int:
    if code == ErrorCode.PRODUCER_FENCED and version < _FENCED_FROM[api]:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


class TxnCoordinator:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.records = TxnStore(gateway.store, gateway.root)
        self.cache: dict[str, TxnRecord] = {}  # records this gateway wrote (see module doc)
        self._versions: dict[str, int] = {}  # their znode versions, where known
        self._cache_view: tuple[frozenset[int], int] = (frozenset(), 0)
        self._completing: dict[str, trio.Lock] = {}
        # PREPARE_* records whose markers (and a commit's offsets) this gateway wrote,
        # not yet marked COMPLETE_* (see the module docstring)
        self._finished: dict[str, TxnRecord] = {}
        # what ZooKeeper holds of the records whose true state (in ``cache``) this
        # gateway keeps ahead of it: one-phase transactions (see the module docstring)
        self._stored: dict[str, TxnRecord] = {}
        # one change of an id's record at a time (its reads, writes and cache): a
        # change not written must not interleave with one that is
        self._changing: dict[str, trio.Lock] = {}

    # -- records ------------------------------------------------------------------------

    def owns(self, transactional_id: str) -> bool:
        return self.gw.owns(f"txn/{transactional_id}")

    def _cache_valid(self) -> bool:
        view = (frozenset(self.gw.nodes), self.gw.lease.session_id)
        if view != self._cache_view:
            # one-phase transactions that ended here and whose end is not stored yet:
            # stored now (over the version known; a record changed meanwhile is left
            # to whoever changed it), or the stored ONGOING would time out their idle
            # producers
            ended = [(self.cache[tid], self._versions[tid]) for tid in self._stored
                     if tid in self.cache and tid in self._versions
                     and self.cache[tid].state in _IDLE]
            if ended and self.gw.nursery is not None:
                self.gw.nursery.start_soon(self._store_dropped, ended)
            self.cache.clear()
            self._versions.clear()
            self._stored.clear()
            self._cache_view = view
            return False
        return True

    def _remember(self, record: TxnRecord, version: int | None = None) -> None:
        """Cache ``record``, as stored at ``version`` (None: not known)."""
        self._cache_valid()
        tid = record.transactional_id
        self.cache[tid] = record
        self._stored.pop(tid, None)
        if version is None:
            self._versions.pop(tid, None)
        else:
            self._versions[tid] = version
        while len(self.cache) > 10000:
            oldest = next(iter(self.cache))
            self._forget(oldest)

    def _forget(self, transactional_id: str) -> None:
        """Drop what this gateway holds of the record: the stored one decides again (a
        one-phase transaction's true state goes with it; the stored record still stands
        for it in recovery)."""
        self.cache.pop(transactional_id, None)
        self._versions.pop(transactional_id, None)
        self._stored.pop(transactional_id, None)

    def _cached(self, transactional_id: str) -> TxnRecord | None:
        return self.cache.get(transactional_id) if self._cache_valid() else None

    async def get(self, transactional_id: str, *, fresh: bool = False) -> TxnRecord | None:
        """The record as stored (``fresh``: as the ZooKeeper leader holds it)."""
        return await self.records.get(transactional_id, fresh=fresh)

    def current(self, record: TxnRecord) -> TxnRecord:
        """``record`` as read from the store, or this gateway's true state of it if it
        keeps that ahead of the store (the admin APIs answer with it)."""
        tid = record.transactional_id
        ahead = self.cache.get(tid) if tid in self._stored and self._cache_valid() else None
        return ahead if ahead is not None and self.owns(tid) else record

    @asynccontextmanager
    async def _exclusive(self, transactional_id: str) -> AsyncIterator[None]:
        lock = self._changing.setdefault(transactional_id, trio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._changing.pop(transactional_id, None)

    async def change(self, transactional_id: str,
                     fn: Callable[[TxnRecord], TxnRecord], *,
                     settling: bool = True) -> TxnRecord:
        """As ``_change``, one change of the id at a time."""
        async with self._exclusive(transactional_id):
            return await self._change(transactional_id, fn, settling=settling)

    async def _change(self, transactional_id: str,
                      fn: Callable[[TxnRecord], TxnRecord], *,
                      settling: bool = True) -> TxnRecord:
        """Apply ``fn`` to the stored record under compare-and-set (raises TxnRefused
        from ``fn``, NoNodeError if there is no record); tried first on the record this
        gateway last wrote, if its version is known. ``settling``: a PREPARE_* record
        whose markers this gateway wrote is completed in the same write, before ``fn``
        (``txn_coordinator.settle``). If cancelled, the change may or may not have been
        written."""
        cached = self._cached(transactional_id)
        version = self._versions.get(transactional_id)
        stored = self._stored.get(transactional_id)
        if cached is not None and stored is not None and version is not None:
            # the true state is this gateway's, ahead of the store: decided on it
            ahead = await self._change_ahead(cached, stored, version, fn)
            if ahead is not None:
                return ahead
            cached = None  # changed elsewhere: the stored record decides
        known = (cached, version) if cached is not None and version is not None else None
        finished = self._finished.get(transactional_id) if settling else None

        def settled(r: TxnRecord) -> TxnRecord:
            return fn(settle(r, completed=finished, now_ms=_now_ms()))

        record, version = await self.records.update_versioned(
            transactional_id, settled if finished is not None else fn, known=known)
        self._remember(record, version)
        if finished is not None and not needs_completion(record) and \
                self._finished.get(transactional_id) == finished:
            del self._finished[transactional_id]
            log.info("kafka_txn_completed", extra=fields(
                transactional_id=transactional_id, producer_id=finished.producer_id,
                epoch=finished.producer_epoch, state=finished.state.value,
                partitions=len(finished.partitions), with_next_change=True))
        return record

    async def _change_ahead(self, cached: TxnRecord, stored: TxnRecord, version: int,
                            fn: Callable[[TxnRecord], TxnRecord]) -> TxnRecord | None:
        """``change`` of a record whose true state, ``cached``, is ahead of ``stored``
        (at ``version``): decided on ``cached``; not written if ``stored`` covers the
        result and is still what ZooKeeper holds, else written over ``version``. None
        if the record changed elsewhere (forgotten here: the caller reads it)."""
        tid = cached.transactional_id
        try:
            wanted = fn(cached)
        except TxnRefused:
            if await self._still_stored(tid, version):
                raise
            return None  # refused what may be stale: the stored record decides
        if wanted is cached:
            # unchanged only if the stored record is still the one this gateway knows
            return cached if await self._still_stored(tid, version) else None
        if covered(stored, wanted):
            if not await self._still_stored(tid, version) or self._cached(tid) is not cached:
                return None  # changed elsewhere, or the view changed: read it
            self.cache[tid] = wanted
            return wanted
        try:
            version = await self.records.set_versioned(wanted, version)
        except BadVersionError:
            self._forget(tid)
            return None
        except NoNodeError:
            self._forget(tid)
            raise
        if self._cache_valid():
            self._remember(wanted, version)
        return wanted

    async def _still_stored(self, transactional_id: str, version: int) -> bool:
        """True if ZooKeeper still holds the record at ``version`` (one stat read); else
        the record is forgotten here. Another gateway may have changed it while both
        took themselves for its coordinator (their views of the live gateways differing
        for a moment), and what it wrote then decides: it may have ended the
        transaction this gateway holds as ONGOING, and the producer's next one would
        then begin unwritten, and its EndTxn be taken for a retry of the ended one."""
        if await self.records.version(transactional_id) == version:
            return True
        self._forget(transactional_id)
        return False

    # -- requests -----------------------------------------------------------------------

    async def init_producer_id(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        tid = body["transactional_id"]
        if not tid:
            return {"error_code": ErrorCode.INVALID_REQUEST}
        if not self.owns(tid):
            return {"error_code": ErrorCode.NOT_COORDINATOR}
        timeout = body["transaction_timeout_ms"]
        new_pid: list[int] = []  # a producer id allocated for an exhausted epoch
        fenced: list[TxnRecord] = []

        def change(r: TxnRecord) -> TxnRecord:
            fenced.clear()
            try:
                return init_producer(r, timeout_ms=timeout, now_ms=_now_ms(),
                                     producer_id=body["producer_id"],
                                     producer_epoch=body["producer_epoch"],
                                     new_producer_id=new_pid[0] if new_pid else None)
            except TxnRefused as exc:
                fence = fenced_abort(exc)
                if fence is None:
                    raise
                fenced.append(fence)
                return fence

        for _ in range(5):
            try:
                if await self.get(tid) is None:
                    pid = await self.gw.new_producer_id()
                    record = new_record(tid, pid, timeout, _now_ms())
                    try:
                        await self.records.create(record)
                    except NodeExistsError:
                        continue
                    self._remember(record, 0)  # a new znode's version
                    log.info("kafka_txn_producer", extra=fields(
                        transactional_id=tid, producer_id=pid, epoch=0))
                    return {"error_code": 0, "producer_id": pid, "producer_epoch": 0}
                record = await self.change(tid, change)
            except NeedProducerId:
                new_pid[:] = [await self.gw.new_producer_id()]
                continue
            except TxnRefused as exc:
                return {"error_code": _code(ApiKey.INIT_PRODUCER_ID, version, exc.code)}
            except NoNodeError:
                continue
            if fenced:
                log.info("kafka_txn_fenced", extra=fields(
                    transactional_id=tid, producer_id=record.producer_id,
                    epoch=record.producer_epoch, reason="InitProducerId"))
                await self._try_complete(record, COMPLETE_WAIT_S)
                return {"error_code": ErrorCode.CONCURRENT_TRANSACTIONS}
            log.info("kafka_txn_producer", extra=fields(
                transactional_id=tid, producer_id=record.producer_id,
                epoch=record.producer_epoch))
            return {"error_code": 0, "producer_id": record.producer_id,
                    "producer_epoch": record.producer_epoch}
        return {"error_code": ErrorCode.CONCURRENT_TRANSACTIONS}

    async def _txn_change(self, api: ApiKey, version: int, tid: str,
                          fn: Callable[[TxnRecord], TxnRecord]) -> tuple[int, TxnRecord | None]:
        """A request's change to its transaction: (error code, the record written)."""
        if not self.owns(tid):
            return ErrorCode.NOT_COORDINATOR, None
        try:
            return 0, await self.change(tid, fn)
        except NoNodeError:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        except TxnRefused as exc:
            if exc.code not in (ErrorCode.CONCURRENT_TRANSACTIONS,):
                log.info("kafka_txn_refused", extra=fields(
                    transactional_id=tid, api=api.name, error=ErrorCode(exc.code).name,
                    reason=str(exc)))
            return _code(api, version, exc.code), None
        except MetadataError as exc:
            log.warning("kafka_txn_store_failed", extra=fields(transactional_id=tid,
                                                               error=repr(exc)))
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None

    async def add_partitions(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        wanted: list[tuple[str, int]] = []
        bad: set[tuple[str, int]] = set()
        for t in body["topics"]:
            count = await self.gw.partition_count(t["name"])
            for p in t["partitions"]:
                if count is not None and 0 <= p < count:
                    wanted.append((t["name"], p))
                else:
                    bad.add((t["name"], p))
        if bad:
            # Kafka refuses the whole request: the unknown ones, the rest OPERATION_NOT_ATTEMPTED
            code: int = -2
        else:
            code, _ = await self._txn_change(
                ApiKey.ADD_PARTITIONS_TO_TXN, version, body["transactional_id"],
                lambda r: add_partitions(r, producer_id=body["producer_id"],
                                         producer_epoch=body["producer_epoch"],
                                         partitions=wanted, now_ms=_now_ms()))
        results = []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                c = code
                if code == -2:
                    c = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if (t["name"], p) in bad \
                        else ErrorCode.OPERATION_NOT_ATTEMPTED
                parts.append({"partition_index": p, "error_code": c})
            results.append({"name": t["name"], "results": parts})
        return {"results": results}

    async def add_offsets(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        code, _ = await self._txn_change(
            ApiKey.ADD_OFFSETS_TO_TXN, version, body["transactional_id"],
            lambda r: add_offsets(r, producer_id=body["producer_id"],
                                  producer_epoch=body["producer_epoch"],
                                  group=body["group_id"], now_ms=_now_ms()))
        return {"error_code": code}

    async def end_txn(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        tid = body["transactional_id"]
        if self.gw.config.transaction_one_phase and self.owns(tid) and \
                await self._end_in_one_phase(body):
            return {"error_code": 0}
        code, record = await self._txn_change(
            ApiKey.END_TXN, version, tid,
            lambda r: begin_end(r, producer_id=body["producer_id"],
                                producer_epoch=body["producer_epoch"],
                                commit=body["committed"], now_ms=_now_ms()))
        if record is not None and needs_completion(record):
            log.info("kafka_txn_ending", extra=fields(
                transactional_id=tid, producer_id=record.producer_id,
                epoch=record.producer_epoch, state=record.state.value,
                partitions=len(record.partitions), offsets=len(record.offsets)))
            await self._try_complete(record, COMPLETE_WAIT_S, defer=True)
        elif code == ErrorCode.CONCURRENT_TRANSACTIONS and self.gw.nursery is not None:
            # a retry of an EndTxn whose completion a crash interrupted: complete it now
            # rather than at the next sweep
            prepared = await self._prepared(tid)
            if prepared is not None:
                self.gw.nursery.start_soon(self._complete_bounded, prepared)
        return {"error_code": code}

    async def _end_in_one_phase(self, body: dict[str, Any]) -> bool:
        """EndTxn of a transaction that ``one_phase`` allows, with its partition led
        here: its marker written, and nothing else (the true state kept in memory and
        written ``FOLD_WAIT_S`` later unless the next transaction fits under the stored
        record). True if so; False if the two-phase path must answer (not allowed, or
        the marker was not written: that path writes the decision, then the marker
        again, and a marker written twice is harmless)."""
        tid = body["transactional_id"]
        try:
            async with self._exclusive(tid):
                begun = await self._begin_one_phase(body)
        except MetadataError:
            return False  # ZooKeeper away: the two-phase path answers (retriably)
        if begun is None:
            return False
        record, prepared, marker = begun
        view = self._cache_view
        code: int | None = -1
        try:
            with trio.move_on_after(COMPLETE_WAIT_S):
                code = await self.gw.write_marker(marker, here_only=True)
        except (LedgerdError, FencedError) as exc:
            code = storage_error_code(exc) or -1
        finally:
            written = code == 0
            if self._cache_view == view and self.cache.get(tid) is prepared:
                if written:
                    done = complete(prepared, prepared=prepared, now_ms=_now_ms())
                    self.cache[tid] = done
                    if self.gw.nursery is not None:
                        self.gw.nursery.start_soon(self._store_later, done)
                else:
                    self.cache[tid] = record  # still ONGOING: the two phases decide
        if not written:
            log.info("kafka_txn_one_phase_refused", extra=fields(
                transactional_id=tid, topic=marker.topic, partition=marker.partition,
                error=code))
            return False
        log.debug("kafka_txn_completed", extra=fields(
            transactional_id=tid, producer_id=prepared.producer_id,
            epoch=prepared.producer_epoch, state=prepared.state.value, partitions=1,
            one_phase=True))
        return True

    async def _begin_one_phase(self, body: dict[str, Any],
                               ) -> tuple[TxnRecord, TxnRecord, Marker] | None:
        """(the ONGOING record, its PREPARE_* in memory, the marker) of an EndTxn that
        may end in one phase, the cache holding the PREPARE_* now; else None."""
        tid = body["transactional_id"]
        record = self._cached(tid)
        version = self._versions.get(tid)
        if record is None or version is None or tid in self._finished:
            return None
        stored = self._stored.get(tid, record)
        try:
            prepared = begin_end(record, producer_id=body["producer_id"],
                                 producer_epoch=body["producer_epoch"],
                                 commit=body["committed"], now_ms=_now_ms())
        except TxnRefused:
            return None  # decided (and answered) on the stored record
        marker = one_phase(stored, prepared) if record.state is TxnState.ONGOING else None
        if marker is None or not await self._still_stored(tid, version):
            return None  # (forgotten if not: the two phases decide on the stored record)
        if self._cached(tid) is not record:
            return None  # the view changed meanwhile
        # in memory only, until the marker is written: every other request for this
        # id is told the transaction is completing (CONCURRENT_TRANSACTIONS)
        self.cache[tid] = prepared
        self._stored[tid] = stored
        return record, prepared, marker

    async def _store_later(self, record: TxnRecord) -> None:
        """Write the true state ``record`` of a one-phase transaction over the stored
        one, ``FOLD_WAIT_S`` after it ended, unless it moved on meanwhile (the next
        transaction began under the stored record, or changed it)."""
        await trio.sleep(FOLD_WAIT_S)
        await self._store_ahead(record)

    async def _store_ahead(self, record: TxnRecord) -> None:
        async with self._exclusive(record.transactional_id):
            await self._store_ahead_now(record)

    async def _store_dropped(self, ended: list[tuple[TxnRecord, int]]) -> None:
        """Store the ends of one-phase transactions whose true state a view change
        dropped from the cache, each over the version known of it (best effort)."""
        for record, version in ended:
            try:
                await self.records.set_versioned(record, version)
            except (MetadataError, LedgerdError) as exc:
                log.info("kafka_txn_end_not_stored", extra=fields(
                    transactional_id=record.transactional_id, error=repr(exc)))

    async def _store_ahead_now(self, record: TxnRecord) -> None:
        tid = record.transactional_id
        version = self._versions.get(tid)
        if self._cached(tid) is not record or tid not in self._stored or version is None:
            return
        try:
            version = await self.records.set_versioned(record, version)
        except (BadVersionError, NoNodeError):
            if self.cache.get(tid) is record:
                self._forget(tid)  # changed elsewhere: the stored record decides
            return
        except MetadataError as exc:  # the sweep tries again
            log.warning("kafka_txn_store_failed", extra=fields(transactional_id=tid,
                                                               error=repr(exc)))
            return
        if self.cache.get(tid) is record and self._cache_valid():
            self._remember(record, version)

    async def _prepared(self, tid: str) -> TxnRecord | None:
        if tid in self._stored:
            return None  # a one-phase transaction completing here, not a stored decision
        try:
            record = await self.get(tid)
        except MetadataError:
            return None
        return record if record is not None and needs_completion(record) else None

    async def txn_offset_commit(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """On the group's coordinator: the offsets go into the transaction's record
        (visible as the group's offsets only when it commits)."""
        gid = body["group_id"]
        group = await self.gw._existing_group(gid) if gid else ErrorCode.INVALID_GROUP_ID
        code = group if isinstance(group, int) else 0 if group is None else \
            group.check_txn_commit(member_id=body["member_id"],
                                   generation=body["generation_id"],
                                   instance_id=body["group_instance_id"])
        pending: list[PendingOffset] = []
        for t in body["topics"]:
            count = await self.gw.partition_count(t["name"])
            for pr in t["partitions"]:
                if count is None or not 0 <= pr["partition_index"] < count:
                    code = code or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                pending.append(PendingOffset(group=gid, topic=t["name"],
                                             partition=pr["partition_index"],
                                             offset=pr["committed_offset"],
                                             metadata=pr["committed_metadata"],
                                             leader_epoch=pr["committed_leader_epoch"]))
        if not code:
            tid = body["transactional_id"]
            try:
                # with the group's pending-offsets entry (OffsetFetch's require_stable)
                await self.records.update_offsets(
                    tid, group_znode(gid), lambda r: txn_offset_commit(
                        r, producer_id=body["producer_id"],
                        producer_epoch=body["producer_epoch"], group=gid, offsets=pending,
                        now_ms=_now_ms()))
            except NoNodeError:
                code = ErrorCode.INVALID_PRODUCER_ID_MAPPING
            except TxnRefused as exc:
                code = _code(ApiKey.TXN_OFFSET_COMMIT, version, exc.code)
            except MetadataError:
                code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        return {"topics": [{"name": t["name"], "partitions": [
            {"partition_index": pr["partition_index"], "error_code": code}
            for pr in t["partitions"]]} for t in body["topics"]]}

    async def unstable_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """On the group's coordinator: the partitions whose committed offsets in the
        group a transaction may still change (OffsetFetch's ``require_stable``,
        KIP-447), from the group's pending-offsets index: each entry's record read
        (PENDING_READS at a time); an entry whose record holds none of the group's
        offsets is dropped if neither it nor the record changed since they were read.
        Raises the first MetadataError met (not a group of them)."""
        group = group_znode(group_id)
        out: set[tuple[str, int]] = set()
        failed: list[MetadataError] = []

        async def check(name: str) -> None:
            try:
                version = await self.records.pending_version(group, name)
                if version is None:
                    return
                record, record_version = await self.records.get_named_versioned(name)
            except MetadataError as exc:
                failed.append(exc)
                return
            held = pending_offsets(record, group_id)
            if held:
                out.update(held)
                return
            try:  # (best effort: a later OffsetFetch drops it if this one cannot)
                dropped = await self.records.drop_pending(group, name, version, record_version)
            except MetadataError:
                return
            if dropped:
                log.debug("kafka_txn_pending_offsets_dropped", extra=fields(
                    group=group_id, transactional_id=name))

        # another gateway (the group's coordinator before this one) may have written
        # the entries and records: read them as ZooKeeper's leader has them
        await self.records.sync_pending(group)
        await each_at_most(PENDING_READS, check, await self.records.pending(group))
        if failed:
            raise failed[0]
        return out

    async def forget_group(self, group_id: str) -> None:
        """DeleteGroups: the group's stale pending-offsets entries dropped (as
        ``unstable_offsets`` drops them), then its index node if that left it empty,
        so the index keeps nothing of a deleted group but transactions still holding
        its offsets."""
        await self.unstable_offsets(group_id)
        await self.records.drop_pending_group(group_znode(group_id))

    # -- completion ---------------------------------------------------------------------

    async def complete(self, record: TxnRecord, *, defer: bool = False) -> bool:
        """Write the markers of a PREPARE_* record (retrying each until written or
        cancelled; not again if this gateway wrote them), store a commit's offsets,
        then mark it COMPLETE_* (``defer``: leave that to the next transaction's first
        change, or to a task ``FOLD_WAIT_S`` later). True when done; if cancelled, the
        record stays PREPARE_* for the next attempt."""
        tid = record.transactional_id
        lock = self._completing.setdefault(tid, trio.Lock())
        try:
            async with lock:
                # ``record`` still the one this gateway wrote last (end_txn's PREPARE,
                # or what the sweep just read): no need to read it back
                current = record if self._cached(tid) is record else await self.get(tid)
                if current is None or current.state is not record.state or \
                        current.producer_epoch != record.producer_epoch:
                    if self._finished.get(tid) == record:
                        del self._finished[tid]
                    return True  # completed meanwhile (another attempt, or gateway)
                if self._finished.get(tid) != current:
                    async with trio.open_nursery() as nursery:
                        for m in markers(current):
                            nursery.start_soon(self._write_marker, m, current)
                    if current.state is TxnState.PREPARE_COMMIT:
                        for o in current.offsets:
                            count = await self.gw.partition_count(o.topic)
                            if count is None or o.partition >= count:
                                continue  # its topic was deleted: no offset to keep
                            await self.gw._commit(o.group, o.topic, o.partition, o.offset,
                                                  o.metadata, o.leader_epoch)
                    self._finished[tid] = current
                if defer and self.gw.nursery is not None:
                    self.gw.nursery.start_soon(self._complete_later, current)
                    return True
                try:
                    await self.change(tid, lambda r: complete(r, prepared=current,
                                                              now_ms=_now_ms()),
                                      settling=False)
                except TxnRefused:
                    return True
                finally:
                    if self._finished.get(tid) == current:
                        del self._finished[tid]
                log.info("kafka_txn_completed", extra=fields(
                    transactional_id=tid, producer_id=current.producer_id,
                    epoch=current.producer_epoch, state=current.state.value,
                    partitions=len(current.partitions)))
                return True
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._completing.pop(tid, None)

    async def _write_marker(self, marker: Marker, prepared: TxnRecord) -> None:
        """Write one marker of ``prepared`` into its partition's log, wherever it is led;
        retried until it is written (the caller bounds the wait), but never once the
        record has moved on: another coordinator completed it, and the producer may
        have begun its next transaction at the same epoch, which a late marker of this
        one would end (committing what it aborts, or hiding what it commits)."""
        first = True
        while True:
            if not first:
                current = await self.get(prepared.transactional_id)
                if current is None or current.state is not prepared.state or \
                        current.producer_epoch != prepared.producer_epoch or \
                        current.producer_id != prepared.producer_id:
                    log.info("kafka_txn_marker_abandoned", extra=fields(
                        topic=marker.topic, partition=marker.partition,
                        transactional_id=prepared.transactional_id))
                    return
            first = False
            try:
                code = await self.gw.write_marker(marker)
            except (LedgerdError, FencedError, OSError, trio.BrokenResourceError,
                    trio.TooSlowError) as exc:
                # (a gateway that cannot authenticate to another says so louder: only
                # its operator can fix that)
                (log.warning if isinstance(exc, PeerAuthError) else log.info)(
                    "kafka_txn_marker_retry", extra=fields(
                        topic=marker.topic, partition=marker.partition, error=str(exc)
                        if isinstance(exc, PeerAuthError) else repr(exc)))
                code = -1
            if code == 0 or code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                return  # written (or the topic was deleted: nothing left to end)
            await trio.sleep(MARKER_RETRY_S)

    async def write_local_marker(self, marker: Marker) -> int:
        """Write a marker into a partition this gateway leads: 0, or an error code
        (NOT_LEADER_OR_FOLLOWER if it does not lead it)."""
        gw = self.gw
        count = await gw.partition_count(marker.topic)
        if count is None or not 0 <= marker.partition < count:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if not gw.owns(f"{marker.topic}/{marker.partition}"):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert gw.nursery is not None
        part = gw.partition(marker.topic, marker.partition)
        batch = control_batch(producer_id=marker.producer_id,
                              producer_epoch=marker.producer_epoch, commit=marker.commit)
        item = part.enqueue([(BatchHeader.parse(batch), batch)], gw.nursery,
                            marker=(marker.producer_id, marker.producer_epoch))
        await item.done.wait()
        if item.error is not None:
            return storage_error_code(item.error)
        return item.code

    async def write_txn_markers(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """WriteTxnMarkers from another gateway's coordinator: each marker into each
        partition this gateway leads (NOT_LEADER_OR_FOLLOWER for the others)."""
        out = []
        for m in body["markers"]:
            topics = []
            for t in m["topics"]:
                parts: list[dict[str, Any]] = []
                for p in t["partition_indexes"]:
                    marker = Marker(topic=t["name"], partition=p,
                                    producer_id=m["producer_id"],
                                    producer_epoch=m["producer_epoch"],
                                    commit=m["transaction_result"])
                    try:
                        code = await self.write_local_marker(marker)
                    except (LedgerdError, FencedError) as exc:
                        code = storage_error_code(exc)
                    parts.append({"partition_index": p, "error_code": code})
                topics.append({"name": t["name"], "partitions": parts})
            out.append({"producer_id": m["producer_id"], "topics": topics})
        return {"markers": out}

    async def forget_topic(self, topic: str) -> None:
        """A deleted topic's partitions hold no transaction any more."""
        await self.records.forget_topic(topic)

    async def partition_flag(self, topic: str, partition: int, offset: int | None,
                             ) -> int | None:
        """The offset from which the partition's log may hold transactions (see
        ``metadata.kafka_txns``): ``offset`` None reads it, else records it there."""
        return await self.records.partition_start(topic, partition, offset)

    # -- produce ------------------------------------------------------------------------

    async def verify(self, tid: str, producer_id: int, producer_epoch: int, topic: str,
                     partition: int) -> int:
        """0 if ``tid``'s ongoing transaction, at this producer id and epoch, includes
        the partition; else the error for its batches."""
        record = self.cache.get(tid) if self.owns(tid) and self._cache_valid() else None
        if record is None:
            try:
                # Synced: the marker that ended the transaction here came after its
                # coordinator stored the end, and this gateway's ZooKeeper server may
                # be a follower still behind that write.
                record = await self.get(tid, fresh=True)
            except MetadataError:
                return ErrorCode.NOT_ENOUGH_REPLICAS  # retriable
        if record is None or record.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if producer_epoch != record.producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if record.state is not TxnState.ONGOING or (topic, partition) not in record.partitions:
            return ErrorCode.INVALID_TXN_STATE
        return 0

    # -- recovery -----------------------------------------------------------------------

    async def run(self) -> None:
        """Every TICK_S: complete what a crashed coordinator left prepared, abort what
        timed out (see the module docstring)."""
        while True:
            await trio.sleep(TICK_S)
            try:
                await self.sweep()
            except Exception as exc:  # ZooKeeper away: the next tick tries again
                log.warning("kafka_txn_sweep_failed", extra=fields(error=repr(exc)))

    async def sweep(self) -> None:
        children = await self.records.names()
        cached = self._cache_valid()
        for child in children:
            if not child.startswith("x-") and not self.owns(child):
                continue
            known = self.cache.get(child) if cached else None
            if known is not None and known.state in _IDLE and child not in self._stored:
                # idle, and only this gateway changes its state
                if self._expired(known):
                    await self._expire(known.transactional_id)
                continue
            if known is None or child not in self._stored:
                stored = await self.records.get_named(child)
                if stored is None:
                    continue
                known = self.cache.get(stored.transactional_id) \
                    if stored.transactional_id in self._stored and self._cache_valid() else None
                record = stored if known is None else known
            else:
                record = known
            tid = record.transactional_id
            if not self.owns(tid):
                continue
            if known is not None:
                # a one-phase transaction's true state, ahead of the store
                if needs_completion(record):
                    continue  # in memory only: its EndTxn is writing the marker
                if record.state in _IDLE:
                    if _now_ms() - record.updated_ms >= FOLD_WAIT_S * 1000:
                        await self._store_ahead(record)  # its own write did not happen
                    continue
            else:
                self._remember(record)
            if self._expired(record):
                await self._expire(tid)
                continue
            if record.state is TxnState.ONGOING:
                now = _now_ms()
                if now <= record.started_ms + record.timeout_ms:
                    continue
                try:
                    record = await self.change(tid, lambda r: time_out(r, now_ms=_now_ms()))
                except TxnRefused:
                    continue
                if not needs_completion(record):
                    continue
                log.warning("kafka_txn_timed_out", extra=fields(
                    transactional_id=tid, producer_id=record.producer_id,
                    epoch=record.producer_epoch, timeout_ms=record.timeout_ms))
            if needs_completion(record):
                assert self.gw.nursery is not None
                self.gw.nursery.start_soon(self._complete_bounded, record)

    def _expired(self, record: TxnRecord) -> bool:
        """Idle past ``transactional_id_expiration_ms`` (Kafka's rule: no transaction
        open, none begun or ended for that long)."""
        return record.state in _IDLE and _now_ms() - record.updated_ms > \
            self.gw.config.transactional_id_expiration_ms

    async def _expire(self, transactional_id: str) -> None:
        if await self.records.expire(transactional_id, self._expired):
            self._forget(transactional_id)
            log.info("kafka_txn_id_expired", extra=fields(transactional_id=transactional_id))

    async def _complete_bounded(self, record: TxnRecord) -> None:
        lock = self._completing.get(record.transactional_id)
        if lock is not None and lock.locked():
            return  # being completed already
        log.info("kafka_txn_recovering", extra=fields(
            transactional_id=record.transactional_id, state=record.state.value))
        await self._try_complete(record, 30.0)

    async def _complete_later(self, prepared: TxnRecord) -> None:
        """COMPLETE_* for ``prepared`` (its markers written) unless the producer's next
        transaction wrote it within ``FOLD_WAIT_S``."""
        await trio.sleep(FOLD_WAIT_S)
        if self._finished.get(prepared.transactional_id) == prepared:
            await self._try_complete(prepared, 30.0)

    async def _try_complete(self, record: TxnRecord, bound: float, *,
                            defer: bool = False) -> None:
        """``complete`` for at most ``bound`` seconds; a failure is logged (the record
        stays prepared, and the next sweep tries again)."""
        with trio.move_on_after(bound):
            try:
                await self.complete(record, defer=defer)
            except Exception as exc:
                log.warning("kafka_txn_complete_failed", extra=fields(
                    transactional_id=record.transactional_id, error=repr(exc)))


async def admit_transactional(gw: Gateway, part: PartitionLog, tid: str,
                              batches: list[tuple[BatchHeader, bytes]]) -> int | _Produce:
    """Queue a transactional produce request's batches for ``part`` once the
    coordinator confirms the producer's ongoing transaction includes the partition (or
    the partition remembers it did); else the error code. A marker this partition
    placed for the producer while the coordinator was asked voids the answer."""
    assert gw.nursery is not None
    h = batches[0][0]
    pid, epoch = h.producer_id, h.producer_epoch
    if any(bh.producer_id != pid or bh.producer_epoch != epoch for bh, _ in batches):
        return ErrorCode.INVALID_RECORD
    try:
        await part.mark_transactional()
    except (LedgerdError, FencedError) as exc:
        return storage_error_code(exc)
    for _ in range(3):
        if part.txn_verified.get(pid) == epoch:
            return part.enqueue(batches, gw.nursery, txn=(pid, epoch))
        placed = part.markers_placed
        code = await gw.txn.verify(tid, pid, epoch, part.topic, part.partition)
        if code:
            log.info("kafka_txn_produce_refused", extra=fields(
                transactional_id=tid, topic=part.topic, partition=part.partition,
                producer_id=pid, epoch=epoch, error=ErrorCode(code).name))
            return code
        if part.markers_placed == placed:
            part.txn_verified[pid] = epoch
            while len(part.txn_verified) > 10000:
                part.txn_verified.popitem(last=False)
    return ErrorCode.CONCURRENT_TRANSACTIONS  # markers kept coming: the client retries


async def read_committed(part: PartitionLog, fetch_offset: int, records: bytes, hw: int,
                         ) -> tuple[bytes, int, list[dict[str, int]]]:
    """A read_committed fetch's answer from what a read_uncommitted one would get:
    the batches below the last stable offset, that LSO, and the aborted transactions
    among them (the consumer drops their records)."""
    lso, index = await part.stable_view(hw)
    if index is None:
        return records, hw, []
    kept, last = committed_prefix(records, lso)
    aborted = index.aborted_between(fetch_offset, last) if kept else []
    return kept, lso, [{"producer_id": pid, "first_offset": first} for pid, first in aborted]
