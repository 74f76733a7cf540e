"""A Kafka partition kept as a ledgerd log: appends, offsets, reads.

Partition ``p`` of topic ``t`` is the log ``kafka.<t>.<p>`` (ledger-backed). Each
produced RecordBatch is one entry, stored byte for byte with its baseOffset set to the
Kafka offset of its first record, so the entries themselves are the offset index.
Each ledger the gateway adds starts with a log header (``metadata.logheader``: entry
0, carrying the topic, ``TopicOrigin``, so ``metadata rebuild`` brings back the log and
the topic without a snapshot); such a ledger's batches start at entry 1. The ledger's
custom metadata says which (``first_log_entry``, read once per ledger): ledgers written
before headers hold batches from entry 0, and both kinds may share a log.

- The *high watermark* is the next offset after the last acknowledged entry. The
  partition's leader (the gateway that owns it) is its authority: while it writes, the
  end of what it acknowledged; before its first write, the end of the log once it has
  recovered the log's tail (fenced and closed whatever a previous writer left open),
  never the LAC of a ledger whose writer may be dead, which lags that writer's last
  acknowledgement. Any other gateway serving reads is a follower: it re-reads the
  log's ledger list and the metadata of every ledger it last saw open (a cached view
  from before a recovery is never the truth), and reports closed ledgers' ends or,
  for the open last ledger, its LAC: a lower bound that may lag the leader's, as a
  Kafka follower's does, and moves on once the writer's explicit LAC or the leader's
  recovery reaches the bookies.
- A writer's next offset follows the last acknowledged batch as *recovered*: after
  opening the log for writing (which fences and closes the previous ledgers), the end
  is read from freshly read, CLOSED metadata; read handles opened before that recovery
  are dropped, never asked.
- *Locating* an offset finds the ledger whose first batch starts at or before it (that
  batch's header is read once per ledger and cached), then the entry by binary search
  over that ledger's entries (a handful of reads), and remembers "next offset -> entry"
  so a consumer reading on does no search at all.
- The writing gateway keeps its recently acknowledged batches in a bounded tail cache,
  so consumers at the tail are served without a bookie read.

Writes go through one appender per partition: produce requests queue their batches
and the appender sends everything queued as one ``append_many`` (group append). A full
queue holds the next request back (``wait_for_room``) rather than refusing it: a refusal
is retried by the client while the batches behind it are written, and would put them
out of order. Only the partition's leader gateway writes; opening the log writer fences
any previous one, whose next append then fails and whose clients are told
NOT_LEADER_OR_FOLLOWER.

Idempotent producers are checked as Kafka's broker checks them, by the pure machine
in ``producer_state.py``: a batch whose (producer, epoch, sequence) matches one of that
producer's last five is answered with its first offset and not written again; a batch
that does not continue the producer's last sequence gets OUT_OF_ORDER_SEQUENCE_NUMBER
(the client resends it after the one that failed before it), one from an older epoch
INVALID_PRODUCER_EPOCH. A producer this gateway knows nothing of (new, forgotten, or
older than the log's last 1,000 batches read at takeover) is accepted at any sequence,
as Kafka does since 2.5.

The writer and the producer state are trusted only under the gateway's lease on
leadership (``lease.py``): before each group append and each high watermark answered
from them, ``authority()`` confirms the gateway still leads the partition (its
ZooKeeper session alive within the lease, the partition its own). A gateway whose
session was lost has dropped both (``reset``) before it serves again; they are rebuilt
from the log when it leads the partition again.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from array import array
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import trio

from ledgerd.base.errors import UnavailableError
from ledgerd.base.logs import fields
from ledgerd.errors import EntryUnavailableError, LedgerdError, NoSuchLedgerError
from ledgerd.kafka import decompressing, epochs
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.control_records import TxnIndex, batch_kind
from ledgerd.kafka.producer_state import ProducerState, last_sequence
from ledgerd.kafka.records import (
    CONTROL,
    BatchHeader,
    batches_below,
    empty_run_end,
    with_base_offset,
)
from ledgerd.kafka.timestamps import first_at_or_after, latest_record
from ledgerd.ledgerlog import FENCE_TAIL, LogFencedError, LogWriter
from ledgerd.metadata.errors import NoNodeError
from ledgerd.metadata.kafka_topics import partition_log_name
from ledgerd.metadata.ledger import LedgerState
from ledgerd.metadata.logheader import first_log_entry

if TYPE_CHECKING:
    from ledgerd.client import Client
    from ledgerd.handles import ReadHandle, WriteHandle

__all__ = ["OffsetOutOfRangeError", "PartitionLog", "PartitionSettings", "log_name"]

log = logging.getLogger(__name__)

PRODUCER_SCAN = 1000  # batches read back at takeover to rebuild producer state
START_TTL_S = 1.0  # the log's first offset is read again after this long
TIME_BLOCK = 64  # entries per block of a ledger's timestamp summary (TimeBlocks)
TIME_BLOCKS_MAX = 1 << 15  # blocks remembered per partition (16 bytes each: 512 KiB)
TIME_LEDGERS_MAX = 1024  # ledgers whose blocks a partition remembers
LEDGER_MAX_KEPT = 1 << 16  # closed ledgers whose largest timestamp a partition remembers
NEVER = 2**63 - 1  # a time (wall-clock ms) that never comes
T = TypeVar("T")
END_READS = 5  # walks of the ledger list for the log's end while the list changes
# reads past a run of batches compaction emptied, within one fetch (each reads on from
# where the last stopped: a ledger's end, the read-ahead's, or the fetch's byte budget)
EMPTY_READS = 64


class _ListChanged(LedgerdError):
    """A walk over a log's ledgers found one gone that the list no longer names."""


def log_name(topic: str, partition: int) -> str:
    return partition_log_name(topic, partition)


class StaleViewError(UnavailableError):
    """The log's batches up to an offset this gateway reported were not where its view
    of the log put them (ledgers replaced or dropped since): retried by the client
    (REQUEST_TIMED_OUT), never answered as OFFSET_OUT_OF_RANGE, whose high watermark
    at or above the fetch offset would make a consumer reset its position."""

    def __init__(self, log_name: str, offset: int) -> None:
        super().__init__(f"log {log_name!r}: the batch at offset {offset} is not where "
                         "this gateway's view of the log put it; try again")


class OffsetOutOfRangeError(LedgerdError):
    def __init__(self, offset: int, start: int, end: int) -> None:
        self.offset, self.start, self.end = offset, start, end
        super().__init__(f"offset {offset} is outside the partition's [{start}, {end}]")


@dataclass(frozen=True, slots=True)
class PartitionSettings:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    roll_bytes: int
    tail_cache_bytes: int
    max_append_bytes: int  # one append_many's batches at most (several entries)
    read_ahead_bytes: int = 4 << 20  # batches read ahead of a consumer (0 = off)
    log_headers: bool = True  # new ledgers begin with a log header (gateway_log_headers)


@dataclass(slots=True)
class _Produce:
    batches: list[tuple[BatchHeader, bytes]]
    done: trio.Event = field(default_factory=trio.Event)
    base_offset: int = -1
    error: BaseException | None = None  # the append failed
    code: int = 0  # a Kafka error code refusing the batches (nothing written)
    producer: tuple[int, int, int, int] | None = None  # (pid, epoch, first seq, last seq)
    txn: tuple[int, int] | None = None  # transactional batches: (pid, epoch) verified
    marker: tuple[int, int] | None = None  # a transaction marker: (pid, epoch)
    append_time: int = -1  # the time stamped on LogAppendTime batches (ms)


class PartitionLog:
    """One partition's state on this gateway; see the module docstring."""

    def __init__(self, client: Client, topic: str, partition: int,
                 settings: PartitionSettings, nursery: trio.Nursery | None = None, *,
                 authority: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.client = client
        self.nursery = nursery  # runs the read-ahead
        # True while this gateway may lead the partition (lease confirmed, owner); None:
        # a partition used on its own (tests), which leads while it has a writer
        self.authority = authority
        self.generation = 0  # bumped whenever writer and producer state are dropped
        self._opening: trio.Lock = trio.Lock()
        # the leader's recovered end before it writes: (ledger list, end, when checked)
        self._settled: tuple[tuple[int, ...], int, float] | None = None
        self.topic = topic
        self.partition = partition
        self.name = log_name(topic, partition)
        self.settings = settings
        self.writer: LogWriter | None = None
        self.next_offset = -1  # assigned to the next batch (writer only)
        self.acked_end = -1  # high watermark while this gateway writes
        # where the bookies' last add confirmed (piggybacked on later adds) is known to
        # have reached: every batch before this is visible to a follower reading the
        # log (one group append behind acked_end)
        self.visible_end = -1
        self.queue: deque[_Produce] = deque()
        self.queued_bytes = 0
        self.appending = False
        self.changed = trio.Event()  # set (and replaced) whenever acked_end moves
        self.room = trio.Event()  # set (and replaced) whenever the appender takes a group
        # ledger -> the entry id of its first batch: 1 below a log header, else 0
        self.first_entries: dict[int, int] = {}
        self.first_offsets: dict[int, int | None] = {}  # ledger -> offset of its 1st batch
        self.first_epochs: dict[int, int] = {}  # ledger -> leader epoch of its 1st batch
        # what each new ledger's log header carries of the topic (``TopicOrigin`` JSON):
        # ``origin`` reads it when the writer opens (set by the gateway), which also
        # keeps ``header_extra`` (and the writer's) current as the topic record changes
        self.origin: Callable[[], Awaitable[bytes]] | None = None
        self.header_extra = b""
        self.origin_source: object = None  # the cached topic record last looked at
        self.origin_record: object = None  # what header_extra holds of it (origin_record)
        self._epoch: tuple[float, int] | None = None  # the log's epoch as read, and when
        # ledger -> its timestamp summary (ListOffsets by time and MAX_TIMESTAMP), at
        # most TIME_BLOCKS_MAX blocks in all; one scan of a ledger at a time
        self.time_blocks: OrderedDict[int, TimeBlocks] = OrderedDict()
        self.time_locks: dict[int, trio.Lock] = {}
        self.ledger_max: dict[int, int] = {}  # closed ledger -> its largest timestamp
        self.positions: OrderedDict[int, tuple[int, int]] = OrderedDict()  # next off -> pos
        self.tail: deque[tuple[int, int, bytes]] = deque()  # (base, next offset, batch)
        self.tail_bytes = 0
        self.handles: OrderedDict[int, ReadHandle] = OrderedDict()
        # pid -> its last batches' (epoch, first sequence, last sequence, base offset): a
        # retried batch (same epoch and sequence) is answered with its first offset, not
        # appended again; the next batch must continue the last sequence
        self.producers = ProducerState()  # idempotent producers (producer_state.py)
        self._remote_end: tuple[float, int] | None = None
        # the log's first offset as last read (ledgers dropped from the front by
        # retention or DeleteRecords move it), and when
        self._start: tuple[float, int] | None = None
        self.floor = 0  # the low watermark DeleteRecords set (the topic record's)
        # when the first deletion the log's record defers is due (wall-clock ms; NEVER:
        # none), as last read or noted (``retention.reap``)
        self.deferred_due_ms = NEVER
        self.summaries: dict[int, tuple[int, int]] = {}  # closed ledger -> bytes, newest
        self.last_used = trio.current_time()
        self.uses = 0  # times handed out by ``Gateway.partition``
        # read-ahead: consecutive batches (base, next offset, bytes) read from the bookies
        # ahead of the consumer, and where the next read starts; one run at a time
        self.ahead: deque[tuple[int, int, bytes]] = deque()
        self.ahead_bytes = 0
        self.ahead_from: tuple[int, int] | None = None
        self.ahead_generation = 0
        self.ahead_running = False
        self.ahead_expect = -1  # the offset the consumer asks for next
        self.ahead_progress = trio.Event()
        # transactions (``control_records``, ``transactions.py``): the index of the log's
        # transactions (None until needed), the offset before which the log holds none
        # (None: none known), how it is looked up or recorded (set by the gateway), the
        # producers whose transaction the coordinator confirmed includes this partition
        # (pid -> epoch, until this partition writes their marker), markers placed
        self.txn: TxnIndex | None = None
        self.txn_from: int | None = None
        self.txn_flag: Callable[[int | None], Awaitable[int | None]] | None = None
        # (bytes, seconds) at which the writer's ledger rolls, read before each append:
        # the topic's segment.bytes / segment.ms (``TopicPolicy.rolling``); None: the
        # settings' roll_bytes, no age limit
        self.rolling: Callable[[], tuple[int, float]] | None = None
        self._txn_checked: tuple[int, int] | None = None
        self._txn_lock = trio.Lock()
        self.txn_verified: OrderedDict[int, int] = OrderedDict()
        self.markers_placed = 0

    # -- writing ------------------------------------------------------------------------

    def enqueue(self, batches: list[tuple[BatchHeader, bytes]], nursery: trio.Nursery, *,
                txn: tuple[int, int] | None = None, marker: tuple[int, int] | None = None,
                ) -> _Produce:
        """Queue one request's batches (in the order requests arrive) and make sure the
        appender runs; await ``item.done`` for the outcome. ``txn``: transactional
        batches of (pid, epoch), written only while ``txn_verified`` holds them;
        ``marker``: a control batch ending (pid, epoch)'s transaction."""
        self.last_used = trio.current_time()
        item = _Produce(batches, txn=txn, marker=marker)
        h = batches[0][0]
        if h.producer_id >= 0 and h.base_sequence >= 0:
            records = sum(bh.record_count for bh, _ in batches)
            item.producer = (h.producer_id, h.producer_epoch, h.base_sequence,
                             last_sequence(h.base_sequence, records))
        self.queue.append(item)
        self.queued_bytes += sum(len(b) for _, b in batches)
        if not self.appending:
            self.appending = True
            nursery.start_soon(self._append_loop)
        return item

    async def wait_for_room(self, size: int, deadline: float) -> bool:
        """Wait until the produce queue takes ``size`` more bytes (it holds at most
        8 x ``max_append_bytes``, or one request of any size when empty); False if it
        is still full at ``deadline``. Called in a connection's request order, so a
        producer that outruns the bookies is held back, not refused."""
        limit = 8 * self.settings.max_append_bytes
        with trio.move_on_at(deadline):
            while self.queued_bytes and self.queued_bytes + size > limit:
                await self.room.wait()
        return not self.queued_bytes or self.queued_bytes + size <= limit

    async def _append_loop(self) -> None:
        try:
            while self.queue:
                take: list[_Produce] = []
                size = 0
                while self.queue and (not take or size < self.settings.max_append_bytes):
                    item = self.queue.popleft()
                    size += sum(len(b) for _, b in item.batches)
                    take.append(item)
                self.queued_bytes -= size
                self.room.set()
                self.room = trio.Event()
                await self._append(take)
        finally:
            self.appending = False

    async def _append(self, items: list[_Produce]) -> None:
        generation = self.generation
        try:
            if not await self.leads():
                # the lease lapsed and this gateway no longer leads the partition (or
                # cannot confirm it does): nothing is written, the clients go elsewhere
                for item in items:
                    item.code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    item.done.set()
                return
            if self.writer is None or generation != self.generation:
                await self.open_writer()
                generation = self.generation
            assert self.writer is not None
            writer = self.writer
            payloads: list[bytes] = []
            placed: list[tuple[int, int, bytes]] = []  # (base, next offset, batch) written
            fresh: list[_Produce] = []
            # idempotent producers' batches, checked in the order they are placed (a
            # retry of a batch still queued when its request timed out rides on the
            # first copy)
            admission = self.producers.group()
            for item in items:
                if item.marker is not None:
                    # the transaction ends here: a batch of it that comes later is
                    # refused (it would open a transaction nobody ends)
                    mpid, mepoch = item.marker
                    if admission.stale_marker(mpid, mepoch):
                        # its coordinator's record has moved on (``producer_state.py``)
                        item.code = ErrorCode.INVALID_PRODUCER_EPOCH
                        continue
                    if self.txn_verified.get(mpid, -1) <= mepoch:
                        self.txn_verified.pop(mpid, None)
                    self.markers_placed += 1
                    admission.end(mpid, mepoch)  # its earlier batches are retried no more
                elif item.txn is not None and self.txn_verified.get(item.txn[0]) != item.txn[1]:
                    item.code = ErrorCode.INVALID_TXN_STATE
                    continue
                if item.producer is not None:
                    dup, item.code = admission.admit(item.producer, self.next_offset)
                    if dup is not None:
                        item.base_offset = dup
                        continue
                    if item.code:
                        continue
                item.base_offset = self.next_offset
                for h, raw in item.batches:
                    batch = with_base_offset(raw, self.next_offset, writer.epoch)
                    payloads.append(batch)
                    placed.append((self.next_offset, self.next_offset + h.record_count, batch))
                    self.next_offset += h.record_count
                fresh.append(item)
            if payloads:
                if self.rolling is not None:
                    try:
                        writer.roll_bytes, writer.roll_interval = self.rolling()
                    except Exception as exc:  # the topic's policy: keep the last limits
                        log.warning("kafka_roll_limits_unread", extra=fields(
                            log=self.name, error=repr(exc)))
                await writer.append_many(payloads)
            elif any(item.code for item in items) and not await self._still_writer(writer):
                # A sequence refused without writing anything has not touched the
                # bookies, so it has not learnt whether another gateway took the log
                # over (and the producer's sequence on): that producer is told to go
                # to the leader, not that its sequence is wrong.
                raise LogFencedError(self.name, "another writer took the log over")
        except BaseException as exc:
            for item in items:
                item.error = exc
                item.done.set()
            if generation == self.generation:
                await self._drop_writer(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if generation != self.generation:
            # The state was dropped while the append was out (the session was lost):
            # the batches are in the log (the bookies took them on a ledger nobody had
            # fenced) and are answered as written; what this gateway remembers of them
            # goes, and the next writer reads them back from the log.
            for item in items:
                item.done.set()
            return
        for base, nxt, batch in placed:  # the bytes written, not rewritten again
            self._remember(base, nxt, batch)
        for item in fresh:  # in the order placed
            if item.producer is not None:
                self.producers.note(*item.producer, item.base_offset,
                                    timestamp=item.batches[-1][0].max_timestamp)
            elif item.marker is not None:
                self.producers.end(item.marker[0], item.base_offset, item.marker[1])
        if placed:
            self.visible_end = self.acked_end
            self.acked_end = placed[-1][1]
            if self.txn is not None and self.txn.covered == placed[0][0]:
                for _base, _nxt, batch in placed:  # contiguous: the index follows the log
                    bh = BatchHeader.parse(batch)
                    self.txn.observe(bh, batch_kind(batch, bh))
        for item in items:
            item.done.set()
        self._wake()

    async def _still_writer(self, writer: LogWriter) -> bool:
        """True if ``writer``'s ledger is still the log's last one and OPEN (nobody has
        fenced it): one metadata read, for the rare answers that write nothing."""
        ledgers = await self._ledgers()
        if not ledgers or ledgers[-1] != writer.ledger_id:
            return False
        md = await self.client.ledger_metadata(writer.ledger_id)
        return md.state is LedgerState.OPEN

    async def _rebuild_producers(self, skip: int) -> None:
        """Producer state from the log's last ``PRODUCER_SCAN`` batches, as Kafka
        rebuilds it from its log: a producer retrying a batch that the previous writer
        stored (its acknowledgement lost with that gateway) gets the stored offset."""
        self.producers.clear()

        async def walk(ledgers: tuple[int, ...], _mark: int) -> list[BatchHeader]:
            found: list[BatchHeader] = []
            for lid in reversed(ledgers):
                if lid == skip or len(found) >= PRODUCER_SCAN:
                    continue
                try:
                    last = await self._last_entry(lid)
                except NoSuchLedgerError:
                    await self._pass_gone(lid)  # swapped by compaction: the list again
                    continue
                first = max(await self._first_entry(lid),
                            last - (PRODUCER_SCAN - len(found)) + 1)
                h = await self._handle(lid)
                eid = last
                while eid >= first:
                    lo = max(first, eid - 255)
                    batch = await h.read_batch(lo, eid)
                    found.extend(BatchHeader.parse(e.payload) for e in reversed(batch))
                    eid = lo - 1
            return found

        for bh in reversed(await self._walk(walk)):
            if bh.producer_id >= 0 and bh.attributes & CONTROL:
                self.producers.end(bh.producer_id, bh.base_offset, bh.producer_epoch)
            elif bh.producer_id >= 0:
                # lastOffsetDelta, not recordCount: compaction removes records from a
                # batch and keeps its offsets, so its last sequence (as Kafka's)
                self.producers.note(bh.producer_id, bh.producer_epoch, bh.base_sequence,
                                    last_sequence(bh.base_sequence, bh.last_offset_delta + 1),
                                    bh.base_offset, timestamp=bh.max_timestamp)

    def _remember(self, base: int, nxt: int, batch: bytes) -> None:
        self.tail.append((base, nxt, batch))
        self.tail_bytes += len(batch)
        while self.tail and self.tail_bytes > self.settings.tail_cache_bytes:
            self.tail_bytes -= len(self.tail.popleft()[2])

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def leads(self) -> bool:
        """True if this gateway may act as the partition's leader now (``authority``
        confirms its lease and ownership; without one, a partition used on its own
        always may)."""
        return self.authority is None or await self.authority()

    async def open_writer(self) -> None:
        """Become the partition's writer: fence the previous one, find the log's end
        from the recovered (closed) metadata of its ledgers, read its producers' state
        back. If cancelled, the log may hold a new empty ledger (harmless). Raises
        LogFencedError if the state was dropped meanwhile (``reset``)."""
        async with self._opening:  # one writer at a time, whoever asks
            if self.writer is not None:
                return
            generation = self.generation
            s = self.settings
            if self.origin is not None:
                self.header_extra = await self.origin()
            writer = await self.client.logs.open_writer(
                self.name, s.ensemble_size, s.write_quorum, s.ack_quorum,
                roll_bytes=s.roll_bytes, create=True, header=s.log_headers,
                header_extra=self.header_extra)
            try:
                # Handles opened before the recovery above see the old writer's ledger
                # OPEN at a LAC that may lag its last acknowledged entry: drop them.
                await self._forget_reads()
                end = await self._closed_end(writer.handle.ledger_id)
                await self._rebuild_producers(writer.handle.ledger_id)
                if generation != self.generation:
                    raise LogFencedError(self.name, "the gateway's leadership state was "
                                                    "dropped while it opened the log")
            except BaseException:
                with trio.move_on_after(5, shield=True):
                    try:
                        await writer.close()
                    except Exception:
                        pass
                raise
            self.writer = writer
            self.next_offset = self.acked_end = self.visible_end = end
            self._settled = None
            self.tail.clear()
            self.tail_bytes = 0
            log.info("kafka_partition_writer", extra=fields(
                topic=self.topic, partition=self.partition, ledger=writer.ledger_id,
                next_offset=end))

    def drop_leadership(self) -> LogWriter | None:
        """Forget at once (no await: nothing is served in between) the writer, the
        producers' sequences and every high watermark remembered; returns the writer
        for the caller to let go of."""
        writer, self.writer = self.writer, None
        self.generation += 1
        self.next_offset = self.acked_end = self.visible_end = -1
        self.producers.clear()
        self._remote_end = None
        self._settled = None
        self.tail.clear()
        self.tail_bytes = 0
        # the index stays (it describes acknowledged batches, which do not change); what
        # the coordinator confirmed for this leadership goes
        self.txn_verified.clear()
        self._txn_checked = None
        self._wake()  # long polls waiting on this writer look again
        return writer

    async def _drop_writer(self, exc: BaseException) -> None:
        writer = self.drop_leadership()
        if writer is not None:
            log.warning("kafka_partition_writer_lost", extra=fields(
                topic=self.topic, partition=self.partition, ledger=writer.ledger_id,
                error=repr(exc)))
            with trio.move_on_after(5, shield=True):
                try:
                    await writer.handle.abandon()
                except Exception:
                    pass

    async def reset(self, reason: str) -> None:
        """Drop the writer and producer state (the gateway's ZooKeeper session was lost):
        synchronously first (``drop_leadership``), so nothing is answered from them
        after this is called; then ``let_go`` of the ledger."""
        await self.let_go(self.drop_leadership(), reason)

    async def let_go(self, writer: LogWriter | None, reason: str) -> None:
        """After ``drop_leadership``: stop ``writer`` without closing its ledger (left
        OPEN for the next writer's recovery; a close could race that recovery), and
        drop the read state (handles opened before that recovery)."""
        if writer is not None:
            log.warning("kafka_partition_reset", extra=fields(
                topic=self.topic, partition=self.partition, ledger=writer.ledger_id,
                reason=reason))
            with trio.move_on_after(5, shield=True):
                try:
                    await writer.handle.abandon()
                except Exception:
                    pass
        await self._forget_reads()

    async def _forget_reads(self) -> None:
        """Drop read handles, remembered positions and the read-ahead."""
        self.ahead_generation += 1
        self.ahead.clear()
        self.ahead_bytes = 0
        self.ahead_from = None
        self.positions.clear()
        handles = list(self.handles.values())
        self.handles.clear()
        for rh in handles:
            await rh.close()

    async def shed(self) -> None:
        """Drop what an idle partition keeps for readers (read-ahead, read handles,
        remembered positions); a writer keeps its ledger and tail cache."""
        await self._forget_reads()

    async def release(self) -> None:
        """Stop writing (leadership moved elsewhere, or shutdown): close the ledger."""
        writer = self.drop_leadership()
        if writer is not None:
            with trio.move_on_after(5, shield=True):
                try:
                    await writer.close()
                except Exception as exc:
                    log.warning("kafka_partition_close_failed", extra=fields(
                        topic=self.topic, partition=self.partition, error=repr(exc)))
        await self._forget_reads()

    # -- reading ------------------------------------------------------------------------

    async def _ledgers(self) -> tuple[int, ...]:
        return (await self._listing())[0]

    async def _listing(self) -> tuple[tuple[int, ...], int]:
        """The log's ledgers and its ``mark`` (the next offset after the last batch
        retention dropped: a lower bound of the log's end), from one read."""
        try:
            record, _ = await self.client.logs.store.get(self.name)
        except NoNodeError:
            return (), 0  # created with the topic, no ledger written yet
        self._epoch = (trio.current_time(), epochs.current_epoch(record.writers))
        self.deferred_due_ms = min((at for _, at in record.deferred), default=NEVER)
        return record.ledgers, record.mark

    # -- leader epochs (``epochs.py``) --------------------------------------------------

    async def leader_epoch(self, *, fresh: bool = False) -> int:
        """The partition's leader epoch: this gateway's writer's while it writes, else
        the log record's ``writers`` count (``epochs.current_epoch``), as read within
        START_TTL_S (``fresh``: read now). Reads only: if cancelled, nothing changed."""
        if self.writer is not None:
            return self.writer.epoch
        now = trio.current_time()
        if fresh or self._epoch is None or now - self._epoch[0] >= START_TTL_S:
            await self._ledgers()
            if self._epoch is None or now - self._epoch[0] >= START_TTL_S:
                self._epoch = (now, epochs.current_epoch(0))  # no log record yet
        return self._epoch[1]

    async def epoch_starts(self) -> list[tuple[int, int]]:
        """``(leader epoch, first offset)`` of each of the log's ledgers that holds a
        batch, in list order (entry 0 of each read once and remembered)."""
        async def walk(ledgers: tuple[int, ...], _mark: int) -> list[tuple[int, int]]:
            return [(self.first_epochs.get(lid, -1), first)
                    for lid, first in await self._firsts(ledgers)]

        return await self._walk(walk)

    async def _firsts(self, ledgers: tuple[int, ...],
                      limit: int | None = None) -> list[tuple[int, int]]:
        """``(ledger, first offset)`` of those of ``ledgers`` that hold a batch, in
        list order, at most ``limit``; one found gone goes through ``_pass_gone``."""
        out: list[tuple[int, int]] = []
        for lid in ledgers:
            if limit is not None and len(out) >= limit:
                break
            try:
                first = await self._first_offset(lid)
            except NoSuchLedgerError:
                await self._pass_gone(lid)
                continue
            if first is not None:
                out.append((lid, first))
        return out

    async def _handle(self, lid: int) -> WriteHandle | ReadHandle:
        if self.writer is not None and self.writer.ledger_id == lid:
            return self.writer.handle
        rh = self.handles.get(lid)
        if rh is None:
            rh = await self.client.open_ledger(lid, recovery=False)
            self.handles[lid] = rh
            while len(self.handles) > 8:
                _, old = self.handles.popitem(last=False)
                await old.close()
        else:
            self.handles.move_to_end(lid)
        return rh

    async def _last_entry(self, lid: int, *, refresh: bool = True) -> int:
        """The ledger's last readable entry: a closed ledger's last entry, the writer's
        LAC, or (``refresh``) an open ledger's metadata read again (it may have been
        recovered and closed since the handle was opened) and then its LAC from the
        bookies; without ``refresh``, what the handle last heard."""
        h = await self._handle(lid)
        if h.is_closed or (self.writer is not None and h is self.writer.handle):
            return h.last_add_confirmed
        if refresh:
            rh: ReadHandle = h  # type: ignore[assignment]
            await rh.refresh()
            if rh.is_closed:
                return rh.last_add_confirmed
            return await rh.read_lac()
        return h.last_add_confirmed

    async def _first_entry(self, lid: int) -> int:
        """The entry id of the ledger's first batch: 1 when entry 0 is a log header (its
        metadata says so), else 0; read once per ledger."""
        got = self.first_entries.get(lid)
        if got is None:
            h = await self._handle(lid)
            got = self.first_entries[lid] = first_log_entry(h.metadata.custom_metadata)
            while len(self.first_entries) > 4096:  # a memory, not a registry
                self.first_entries.pop(next(iter(self.first_entries)))
        return got

    async def _header(self, lid: int, eid: int) -> BatchHeader:
        h = await self._handle(lid)
        return BatchHeader.parse((await h.read_batch(eid, eid))[0].payload)

    async def _first_offset(self, lid: int) -> int | None:
        """The offset of the ledger's first batch (None: it holds no batch yet)."""
        if lid in self.first_offsets:
            return self.first_offsets[lid]
        first_entry = await self._first_entry(lid)
        if await self._last_entry(lid) < first_entry:
            return None
        header = await self._header(lid, first_entry)
        first = header.base_offset
        self.first_offsets[lid] = first
        self.first_epochs[lid] = header.leader_epoch
        return first

    async def _end_before(self, skip: int | None) -> int:
        """The next offset after the log's last readable entry (ledgers other than
        ``skip``), every open ledger's metadata read again first (``_last_entry``);
        at least the log's mark."""
        async def walk(ledgers: tuple[int, ...], mark: int) -> int:
            for lid in reversed(ledgers):
                if lid == skip:
                    continue
                try:
                    last = await self._last_entry(lid)
                except NoSuchLedgerError:
                    await self._pass_gone(lid)
                    continue
                if last >= await self._first_entry(lid):
                    return max(mark, (await self._header(lid, last)).next_offset)
            return mark

        return await self._walk(walk)

    async def _walk(self, walk: Callable[[tuple[int, ...], int], Awaitable[T]]) -> T:
        """``walk`` over the listed ledgers and the log's mark, started again from the
        list as read anew when it finds a ledger gone that the list no longer names
        (``_pass_gone``); raises LogFencedError if the list keeps changing for
        END_READS walks."""
        for _ in range(END_READS):
            try:
                return await walk(*await self._listing())
            except _ListChanged:
                continue
        raise LogFencedError(self.name, "the log's ledger list kept changing while it "
                                        "was read")

    async def _pass_gone(self, lid: int) -> None:
        """Listed ledger ``lid`` was found gone: raises _ListChanged if the list no
        longer names it (compaction swapped it for a replacement holding the same
        offsets and deleted it, with file.delete.delay.ms 0, or retention dropped it),
        so the walk starts again instead of taking a later ledger's first offset or an
        earlier one's end (found by an outside audit: a consumer from offset 0 of a
        compacted topic told OFFSET_OUT_OF_RANGE); returns if it is still listed (it is
        passed over)."""
        if lid not in await self._ledgers():
            raise _ListChanged(lid)

    async def _closed_end(self, skip: int | None,
                          listing: tuple[tuple[int, ...], int] | None = None) -> int:
        """The next offset after the log's last entry, from ledgers that recovery has
        closed (all but ``skip``, the new writer's): their metadata is read now, never
        taken from a handle opened before. Raises LogFencedError if one is still open
        (another writer is taking the log over).

        Never below the log's mark, read with the list (``listing``: the ledgers and
        mark of one read): retention records there the end of the batches it drops, a
        second guard beside ``retention.drop_front``'s keeping the last batch listed.

        A ledger gone while this reads that the list no longer names (compaction
        swapped it for its replacement and deleted it, with file.delete.delay.ms 0)
        means the list changed: the walk starts again from the list read anew, never
        taking an earlier ledger's end (that would give offsets out twice); one still
        listed but gone is passed over, as before. Raises LogFencedError if the list
        keeps changing for END_READS walks."""
        listed, mark = await self._listing() if listing is None else listing
        for _ in range(END_READS):
            changed = False
            for lid in reversed(listed):
                if lid == skip:
                    continue
                self.handles.pop(lid, None)
                try:
                    h = await self._handle(lid)
                except NoSuchLedgerError:
                    fresh, fresh_mark = await self._listing()
                    if lid in fresh:
                        continue
                    (listed, mark), changed = (fresh, fresh_mark), True
                    break
                if not h.is_closed:
                    raise LogFencedError(self.name, f"ledger {lid} is open again: another "
                                                    "writer is taking the log over")
                if h.last_add_confirmed >= first_log_entry(h.metadata.custom_metadata):
                    return max(mark, (await self._header(lid, h.last_add_confirmed)).next_offset)
            if not changed:
                return mark
        raise LogFencedError(self.name, "the log's ledger list kept changing while its "
                                        "end was read")

    async def _settled_end(self) -> int:
        """The leader's high watermark before it writes: the log's tail recovered (the
        last ledgers fenced and closed, as a new writer does), then its end from the
        closed metadata. Remembered while the ledger list stays the same: nobody can
        add to closed ledgers, and a writer elsewhere would first add a ledger."""
        now = trio.current_time()
        if self._settled is not None and now - self._settled[2] < 0.05:
            return self._settled[1]
        listing = await self._listing()
        ledgers = listing[0]
        if self._settled is not None and self._settled[0] == ledgers:
            self._settled = (ledgers, self._settled[1], now)
            return self._settled[1]
        for lid in ledgers[-FENCE_TAIL:]:
            try:
                md = await self.client.ledger_metadata(lid)
            except NoSuchLedgerError:
                continue
            if not md.is_closed:
                self.handles.pop(lid, None)  # its view from before the recovery
                await self.client.open_ledger(lid, recovery=True)
        end = await self._closed_end(None, listing)
        self._settled = (ledgers, end, now)
        return end

    async def high_watermark(self) -> int:
        """The next offset after the last acknowledged batch (see the module docstring:
        the leader's, or a follower's lower bound)."""
        if self.writer is not None or self.authority is not None:
            generation = self.generation
            leads = await self.leads()
            if leads and self.writer is not None and generation == self.generation:
                return self.acked_end
            if leads and self.authority is not None:
                # not beside a writer being opened here: the recovery would fence the
                # ledger it just added (and it would open another, at a new epoch)
                async with self._opening:
                    if self.writer is not None and generation == self.generation:
                        return self.acked_end
                    return await self._settled_end()
        now = trio.current_time()
        if self._remote_end is not None and now - self._remote_end[0] < 0.05:
            return self._remote_end[1]
        end = await self._end_before(None)
        self._remote_end = (now, end)
        return end

    async def history(self) -> tuple[list[tuple[int, int]], int, int]:
        """``(epoch history, current epoch, log end)`` (``epochs.epoch_history``)."""
        current = await self.leader_epoch()
        end = await self.high_watermark()
        return epochs.epoch_history(await self.epoch_starts(), current, end), current, end

    async def end_offset_for_epoch(self, requested: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: ``(leader epoch, end offset)`` for ``requested``."""
        history, current, end = await self.history()
        return epochs.end_offset_for_epoch(history, current, end, requested)

    async def epoch_of(self, offset: int) -> int:
        """The leader epoch of the batch holding ``offset`` (-1: not known)."""
        history, _, _ = await self.history()
        return epochs.epoch_at(history, offset)

    # -- transactions -------------------------------------------------------------------

    async def mark_transactional(self) -> None:
        """Before this partition's first transactional batch: record (through
        ``txn_flag``, in ZooKeeper) that transactions begin no earlier than its high
        watermark now, so readers look for them from there on, and start the index."""
        if self.txn_from is not None or self.txn_flag is None:
            return
        hw = self.acked_end if self.writer is not None else await self.high_watermark()
        self.txn_from = await self.txn_flag(hw)
        if self.txn is None:
            self.txn = TxnIndex(covered=self.txn_from if self.txn_from is not None else hw)

    async def _txn_start(self, hw: int) -> int | None:
        """The offset from which the log may hold transactions (None: it holds none).
        Asked of ZooKeeper once per leadership while this gateway leads the partition
        (only it writes, and it records the start before its first transactional
        batch), and whenever the high watermark moved on a gateway that only reads."""
        if self.txn_from is not None or self.txn_flag is None:
            return self.txn_from
        key = (self.generation, -1 if self.writer is not None else hw)
        if self._txn_checked == key:
            return None
        self.txn_from = await self.txn_flag(None)
        self._txn_checked = key
        return self.txn_from

    async def stable_view(self, hw: int) -> tuple[int, TxnIndex | None]:
        """``(last stable offset, transaction index)`` as of high watermark ``hw``: the
        index is brought up to ``hw`` by reading the log's batches it has not seen (see
        ``control_records.TxnIndex``); None and LSO = ``hw`` when the log holds no
        transaction."""
        index = self.txn
        if index is None or index.covered < hw:
            async with self._txn_lock:
                start = await self._txn_start(hw)
                if start is None:
                    return hw, None
                if self.txn is None:
                    self.txn = TxnIndex(covered=start)
                index = self.txn
                await self._scan_txn(index, hw)
        return index.last_stable_offset(hw), index

    async def _scan_txn(self, index: TxnIndex, until: int) -> None:
        """Observe the log's batches from ``index.covered`` up to ``until``. Batches
        retention or DeleteRecords removed are skipped (a transaction that began among
        them and ends after them is not known as aborted: see docs/kafka.md)."""
        if index.covered < until:
            index.skip_to(min(until, await self.start_offset()))
        while index.covered < until:
            at = index.covered
            lid, eid = await self.locate(at)
            last = await self._last_entry(lid, refresh=False)
            if eid > last:
                self.positions.pop(at, None)
                lid, eid = await self.locate(at, cached=False)
                last = await self._last_entry(lid, refresh=False)
            if eid > last:
                raise StaleViewError(self.name, at)
            h = await self._handle(lid)
            top = min(last, eid + 63)
            for entry in await h.read_batch(eid, top):
                bh = BatchHeader.parse(entry.payload)
                if bh.next_offset > index.covered:
                    index.observe(bh, batch_kind(entry.payload, bh))
            if index.covered == at:  # no progress: a batch below its own start?
                raise StaleViewError(self.name, at)
            self._note_position(index.covered, lid, top + 1)

    async def start_offset(self) -> int:
        """The partition's low watermark: the first offset of its first ledger (read
        again after START_TTL_S: retention drops ledgers from the front, on this
        gateway or another), or the ``floor`` DeleteRecords set if that is later."""
        now = trio.current_time()
        if self._start is None or now - self._start[0] >= START_TTL_S:
            async def walk(ledgers: tuple[int, ...], mark: int) -> tuple[int | None, int]:
                found = await self._firsts(ledgers, limit=1)
                return (found[0][1] if found else None), mark

            first, mark = await self._walk(walk)
            if first is None:
                # no batch readable: the log as this walk saw it starts and ends at
                # its mark (not at a high watermark read after it, which may already
                # count batches the walk did not see: found by an outside audit, a
                # gateway not leading the partition answered earliest 206 for a log
                # starting at 0)
                return max(self.floor, mark)
            self._start = (now, first)
        return max(self.floor, self._start[1])

    async def forget_unlisted(self) -> bool:
        """Forget what is remembered of ledgers the log no longer lists (compaction
        replaced them, retention dropped them): their handles, the positions and
        read-ahead pointing into them, what was read of them. True if there were any."""
        listed = set(await self._ledgers())
        known = set(self.handles) | {lid for lid, _ in self.positions.values()} \
            | set(self.first_offsets) | set(self.time_blocks) | set(self.ledger_max)
        gone = known - listed
        if not gone:
            return False
        for memory in (self.first_entries, self.first_offsets, self.first_epochs,
                       self.summaries):
            for lid in gone:
                memory.pop(lid, None)
        for lid in gone:
            self.time_blocks.pop(lid, None)
            self.ledger_max.pop(lid, None)
        # the batches kept of recent appends: some may lie in the ledgers gone, which a
        # compaction just rewrote (a fetch must get the replacement's records); all go,
        # with no I/O here (the next fetches read the bookies)
        self.tail.clear()
        self.tail_bytes = 0
        await self._forget_reads()
        self.start_moved()
        return True

    async def read_entries(self, ledger_id: int, first: int, last: int) -> list[bytes]:
        """The payloads of a ledger's entries ``first..last`` (batches; entry 0 of a
        ledger with a log header is its header)."""
        h = await self._handle(ledger_id)
        return [e.payload for e in await h.read_batch(first, last)]

    async def batch_header(self, ledger_id: int, entry_id: int) -> BatchHeader:
        """The header of the batch in that entry."""
        return await self._header(ledger_id, entry_id)

    def start_moved(self) -> None:
        """Forget the remembered first offset (ledgers were just dropped here)."""
        self._start = None

    def note_deferred(self, due_ms: int) -> None:
        """Ledgers just dropped here are to be deleted at ``due_ms`` (wall clock)."""
        self.deferred_due_ms = min(self.deferred_due_ms, due_ms)

    async def ledgers(self) -> tuple[int, ...]:
        """The log's ledgers, as listed now."""
        return await self._ledgers()

    async def holds_batch(self, lid: int) -> bool | None:
        """Whether ledger ``lid`` holds an acknowledged batch: True when known to (a
        closed ledger by its metadata, this gateway's writer's by its LAC: acknowledged
        entries survive any recovery), False when known not to (a closed ledger without
        one), None when that cannot be known here (an open ledger: another writer's, one
        being closed by a roll, or this writer's with nothing acknowledged yet, whose
        batches in flight a recovery may keep or not). A new writer finds the log's
        next offset in the last ledger that holds a batch (``_closed_end``): drops keep
        one (``retention.drop_front``). Raises NoSuchLedgerError."""
        w = self.writer
        if w is not None and w.ledger_id == lid and w.handle.last_add_confirmed >= \
                first_log_entry(w.handle.metadata.custom_metadata):
            return True
        md = await self.client.ledger_metadata(lid)
        if not md.is_closed:
            return None
        return md.last_entry_id >= first_log_entry(md.custom_metadata)

    async def end_of(self, lid: int) -> int | None:
        """The next offset after closed ledger ``lid``'s last batch; None if it holds
        none or is open. Raises NoSuchLedgerError."""
        md = await self.client.ledger_metadata(lid)
        if not md.is_closed or md.last_entry_id < first_log_entry(md.custom_metadata):
            return None
        return (await self._header(lid, md.last_entry_id)).next_offset

    async def first_offset(self, ledger_id: int) -> int | None:
        """The Kafka offset of the ledger's entry 0 (None: no entry yet)."""
        return await self._first_offset(ledger_id)

    async def ledger_summary(self, ledger_id: int) -> tuple[int, int]:
        """A ledger's ``(bytes, max timestamp of its last batch)`` (an open ledger's
        bytes count 0 until it is closed); a closed ledger's is remembered."""
        hit = self.summaries.get(ledger_id)
        if hit is not None:
            return hit
        md = await self.client.ledger_metadata(ledger_id)
        newest = -1
        if md.last_entry_id >= first_log_entry(md.custom_metadata):
            newest = (await self._header(ledger_id, md.last_entry_id)).max_timestamp
        if md.is_closed:
            self.summaries[ledger_id] = (md.length, newest)
            while len(self.summaries) > 4096:  # a memory, not a registry
                self.summaries.pop(next(iter(self.summaries)))
        return md.length, newest

    async def locate(self, offset: int, *, cached: bool = True) -> tuple[int, int]:
        """``(ledger, entry)`` of the batch holding ``offset`` (which is below the high
        watermark); ``cached`` first asks the "next offset -> entry" memory, whose entry
        may be one past a ledger's end."""
        hit = self.positions.get(offset) if cached else None
        if hit is not None:
            return hit
        ledgers = await self._ledgers()
        for lid in reversed(ledgers):
            first = await self._first_offset(lid)
            if first is None or first > offset:
                continue
            lo, hi = await self._first_entry(lid), await self._last_entry(lid)
            while lo < hi:  # the last entry whose base offset is <= offset
                mid = (lo + hi + 1) // 2
                if (await self._header(lid, mid)).base_offset <= offset:
                    lo = mid
                else:
                    hi = mid - 1
            return lid, lo
        raise OffsetOutOfRangeError(offset, await self.start_offset(),
                                    await self.high_watermark())

    def _note_position(self, next_offset: int, lid: int, eid: int) -> None:
        self.positions[next_offset] = (lid, eid)
        while len(self.positions) > 256:
            self.positions.popitem(last=False)

    async def read(self, offset: int, max_bytes: int,
                   min_one: bool = True) -> tuple[bytes, int]:
        """Whole batches from the one holding ``offset``, at most ``max_bytes`` (but at
        least one batch when ``min_one``: the first partition of a fetch, KIP-74), and
        the high watermark. Raises OffsetOutOfRangeError.

        Nothing at or past the high watermark is returned, even when the ledgers hold
        it (the writer's LAC runs ahead of the last batch acknowledged to its producer,
        and a follower's LAC may move on after its high watermark was read): a consumer
        handed such a batch fetches next past the high watermark and is told
        OFFSET_OUT_OF_RANGE (found by an outside audit, with a roll every 100 ms).

        Batches that compaction emptied are not the whole answer while a record follows
        below the high watermark: the read goes on past them, across ledgers (at most
        EMPTY_READS more reads), within ``max_bytes`` (``records.empty_run_end``)."""
        data, hw = await self._read_once(offset, max_bytes, min_one)
        data = batches_below(data, hw)
        parts = [data]
        size = len(data)
        for _ in range(EMPTY_READS):
            after = empty_run_end(parts[-1])
            if after is None or after >= hw or size >= max_bytes:
                break
            try:
                more, more_hw = await self._read_once(after, max_bytes - size, False)
                more = batches_below(more, more_hw)
                hw = max(hw, more_hw)
            except LedgerdError:
                break  # retention or compaction moved it meanwhile: the empty batches
                # are the answer, and the next fetch finds out
            if not more:
                break
            parts.append(more)
            size += len(more)
        return b"".join(parts) if len(parts) > 1 else data, hw

    async def _read_once(self, offset: int, max_bytes: int,
                         min_one: bool) -> tuple[bytes, int]:
        self.last_used = trio.current_time()
        hw = await self.high_watermark()
        if offset == hw:
            return b"", hw
        start = await self.start_offset()
        if offset > hw or offset < start:
            raise OffsetOutOfRangeError(offset, start, hw)
        if self.tail and self.tail[0][0] <= offset < self.tail[-1][1]:
            return self._from_tail(offset, max_bytes, min_one), hw
        while True:
            ahead = self._from_ahead(offset, max_bytes, min_one)
            if ahead is not None:
                self._read_ahead()
                return ahead, hw
            if not (self.ahead_running and offset == self.ahead_expect):
                break
            await self.ahead_progress.wait()  # the read-ahead is fetching exactly this
        for attempt in range(2):
            try:
                return await self._read_stored(offset, max_bytes, min_one), hw
            except (NoSuchLedgerError, EntryUnavailableError) as exc:
                # its ledger was replaced by compaction or dropped (retention,
                # DeleteRecords), perhaps by another gateway, since it was read here: a
                # replacement, which the list names now, holds the same offsets
                if not attempt and await self.forget_unlisted():
                    continue
                if not isinstance(exc, NoSuchLedgerError):
                    raise
                self.start_moved()
                self.positions.clear()
                start = await self.start_offset()
                if offset < start:
                    raise OffsetOutOfRangeError(offset, start, hw) from None
                raise
        raise AssertionError("unreachable")

    async def _read_stored(self, offset: int, max_bytes: int, min_one: bool) -> bytes:
        """Whole batches from the ledgers, from the one holding ``offset``."""
        lid, eid = await self.locate(offset)
        h = await self._handle(lid)
        last = await self._last_entry(lid, refresh=False)
        if eid > last:  # remembered at a ledger's end: the batch opens the next ledger
            self.positions.pop(offset, None)
            lid, eid = await self.locate(offset, cached=False)
            h = await self._handle(lid)
            last = await self._last_entry(lid, refresh=False)
        out: list[bytes] = []
        size = 0
        full = False
        while eid <= last and not full:
            # as many entries as the budget holds at the sizes seen so far (batches run
            # from a few bytes to max_batch_bytes: never read 64 MiB to send 1)
            fits = 1 if not out else (max_bytes - size) * len(out) // size
            top = min(last, eid + max(0, min(63, fits - 1)))
            for entry in await h.read_batch(eid, top):
                if (out or not min_one) and size + len(entry.payload) > max_bytes:
                    top, full = entry.entry_id - 1, True  # the next fetch starts there
                    break
                out.append(entry.payload)
                size += len(entry.payload)
            if not out:  # not even its first batch fits, and none was owed
                return b""
            self._note_position(BatchHeader.parse(out[-1]).next_offset, lid, top + 1)
            eid = top + 1
            full = full or size >= max_bytes
        self.ahead_generation += 1  # a read-ahead from elsewhere is of no use now
        self.ahead.clear()
        self.ahead_bytes = 0
        self.ahead_from = (lid, eid)
        self.ahead_expect = BatchHeader.parse(out[-1]).next_offset
        self._read_ahead()
        return b"".join(out)

    def _from_ahead(self, offset: int, max_bytes: int, min_one: bool) -> bytes | None:
        """Batches from the read-ahead, from the one holding ``offset`` (None: it does
        not hold that offset)."""
        while self.ahead and self.ahead[0][1] <= offset:
            self.ahead_bytes -= len(self.ahead.popleft()[2])
        if not self.ahead or self.ahead[0][0] > offset:
            return None
        out: list[bytes] = []
        size = 0
        while self.ahead and ((min_one and not out)
                              or size + len(self.ahead[0][2]) <= max_bytes):
            _, nxt, batch = self.ahead.popleft()
            self.ahead_bytes -= len(batch)
            out.append(batch)
            size += len(batch)
            self.ahead_expect = nxt
        return b"".join(out)

    def _read_ahead(self) -> None:
        if (self.settings.read_ahead_bytes and not self.ahead_running
                and self.nursery is not None and self.ahead_from is not None):
            self.ahead_running = True
            self.nursery.start_soon(self._ahead_loop, self.ahead_generation)

    async def _ahead_loop(self, generation: int) -> None:
        """Read the entries after the consumer's last fetch into ``ahead`` while it
        processes that one, up to ``read_ahead_bytes``; stops at a ledger's last
        readable entry (the next fetch finds the way on)."""
        try:
            while (generation == self.ahead_generation and self.ahead_from is not None
                   and self.ahead_bytes < self.settings.read_ahead_bytes):
                lid, eid = self.ahead_from
                last = await self._last_entry(lid, refresh=False)
                if eid > last:
                    return
                h = await self._handle(lid)
                room = self.settings.read_ahead_bytes - self.ahead_bytes
                fits = max(1, room * len(self.ahead) // self.ahead_bytes) \
                    if self.ahead else 1
                top = min(last, eid + min(63, fits - 1))
                entries = await h.read_batch(eid, top)
                if generation != self.ahead_generation:
                    return
                for entry in entries:
                    bh = BatchHeader.parse(entry.payload)
                    self.ahead.append((bh.base_offset, bh.next_offset, entry.payload))
                    self.ahead_bytes += len(entry.payload)
                self.ahead_from = (lid, top + 1)
                self._ahead_moved()
        except Exception as exc:  # a read-ahead that fails costs only its speed-up
            log.debug("kafka_read_ahead_failed", extra=fields(
                topic=self.topic, partition=self.partition, error=repr(exc)))
        finally:
            self.ahead_running = False
            self._ahead_moved()

    def _ahead_moved(self) -> None:
        self.ahead_progress.set()
        self.ahead_progress = trio.Event()

    def _from_tail(self, offset: int, max_bytes: int, min_one: bool) -> bytes:
        i = bisect.bisect_right(self.tail, offset, key=lambda t: t[0]) - 1
        out: list[bytes] = []
        size = 0
        for _, _, batch in itertools.islice(self.tail, i, None):
            if (out or not min_one) and size + len(batch) > max_bytes:
                break
            out.append(batch)
            size += len(batch)
        return b"".join(out)

    async def _time_blocks(self, lid: int) -> TimeBlocks | None:
        """The ledger's timestamp summary up to its last readable entry (None: no
        batch yet): the largest batch maxTimestamp and the first offset of each
        ``TIME_BLOCK`` entries. Built by reading the entries once, one scan per ledger
        at a time (others wait for it), its progress kept chunk by chunk (a cancelled
        scan leaves what it read), and extended as the ledger grows: entries below the
        last readable one never change, so a summary only grows."""
        lock = self.time_locks.setdefault(lid, trio.Lock())
        try:
            async with lock:
                return await self._scan_times(lid)
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self.time_locks.pop(lid, None)

    async def _scan_times(self, lid: int) -> TimeBlocks | None:
        last = await self._last_entry(lid)
        first = await self._first_entry(lid)
        if last < first:
            return None
        tb = self.time_blocks.get(lid)
        if tb is None or tb.first != first:
            tb = TimeBlocks(first, first - 1, array("q"), array("q"))
        self._remember_times(lid, tb)
        if tb.upto >= last:
            return tb
        h = await self._handle(lid)
        while tb.upto < last:
            top = min(last, tb.upto + 256)
            entries = await h.read_batch(tb.upto + 1, top)
            for entry in entries:  # in place: a reader looks only up to the upto it saw
                b = (entry.entry_id - first) // TIME_BLOCK
                bh = BatchHeader.parse(entry.payload)
                if b == len(tb.maxes):
                    tb.maxes.append(bh.max_timestamp)
                    tb.offsets.append(bh.base_offset)
                elif bh.max_timestamp > tb.maxes[b]:
                    tb.maxes[b] = bh.max_timestamp
            tb.upto = top
            self._remember_times(lid, tb)
        return tb

    def _remember_times(self, lid: int, tb: TimeBlocks) -> None:
        """Keep ``tb`` as the ledger's summary, the most recently used; the least
        recently used ones go while more than ``TIME_BLOCKS_MAX`` blocks are kept."""
        self.time_blocks[lid] = tb
        self.time_blocks.move_to_end(lid)
        total = sum(len(t.maxes) for t in self.time_blocks.values())
        while (total > TIME_BLOCKS_MAX or len(self.time_blocks) > TIME_LEDGERS_MAX) \
                and len(self.time_blocks) > 1:
            _, gone = self.time_blocks.popitem(last=False)  # a memory, not a registry
            total -= len(gone.maxes)

    async def _note_ledger_max(self, lid: int, tb: TimeBlocks | None) -> None:
        """Remember a closed ledger's largest timestamp (its summary then covers all
        of it), so later lookups skip the ledger without its blocks: a few bytes a
        ledger, kept longer than the blocks. (Not an open one's: a reader's view of
        it may be short of its end.)"""
        if tb is not None and lid not in self.ledger_max \
                and (await self._handle(lid)).is_closed and tb.upto >= (
                    await self._last_entry(lid, refresh=False)):
            self.ledger_max[lid] = max(tb.maxes)
            while len(self.ledger_max) > LEDGER_MAX_KEPT:
                self.ledger_max.pop(next(iter(self.ledger_max)))

    async def largest_timestamp(self, lid: int) -> int:
        """A closed ledger's largest batch maxTimestamp (-1 if it holds no batch): its
        ``TimeBlocks`` read once, then kept in ``ledger_max``."""
        known = self.ledger_max.get(lid)
        if known is not None:
            return known
        tb = await self._time_blocks(lid)
        await self._note_ledger_max(lid, tb)
        return max(tb.maxes) if tb is not None and tb.maxes else -1

    async def _below_start(self, ledgers: list[int], i: int, start: int) -> bool:
        """Does ledger ``ledgers[i]`` end at or before the log start (the next ledger
        begins there or earlier)? Such a ledger waits to be dropped; none of it counts."""
        if i + 1 >= len(ledgers):
            return False
        try:
            nxt = await self._first_offset(ledgers[i + 1])
        except NoSuchLedgerError:
            return False
        return nxt is not None and nxt <= start

    async def offset_for_time(self, timestamp: int) -> tuple[int, int] | None:
        """``(timestamp, offset)`` of the first record at or after the log start whose
        timestamp is at or after ``timestamp``, as Kafka answers (``searchForTimestamp``
        from the log start): the first batch, in offset order, whose maxTimestamp
        reaches it, then the first record in it that does (``first_at_or_after``,
        which opens compressed batches too). Timestamps need not grow with offsets (two
        producers' clocks, CreateTime set upstream): each ledger's ``TimeBlocks`` say
        which stretch of 64 entries holds the first such batch, and only that stretch
        is read. None if no record is that late. Ledgers are searched up to their last
        readable entry (the LAC while open: nothing unconfirmed)."""
        start = await self.start_offset()

        async def walk(listed: tuple[int, ...], _mark: int) -> tuple[int, int] | None:
            ledgers = list(listed)
            for i, lid in enumerate(ledgers):
                if self.ledger_max.get(lid, timestamp) < timestamp:
                    continue  # closed, and nothing in it is that late
                try:
                    if await self._below_start(ledgers, i, start):
                        continue
                    found = await self._time_in(lid, timestamp, start)
                except NoSuchLedgerError:  # dropped or swapped meanwhile
                    await self._pass_gone(lid)
                    continue
                if found is not None:
                    return found[1], found[0]
            return None

        return await self._walk(walk)

    async def _time_in(self, lid: int, timestamp: int, start: int) -> tuple[int, int] | None:
        tb = await self._time_blocks(lid)
        await self._note_ledger_max(lid, tb)
        if tb is None:
            return None
        upto, n = tb.upto, len(tb.maxes)  # (it may grow meanwhile: beyond these, later)
        h = await self._handle(lid)
        for b in range(tb.block_of(start), n):
            if tb.maxes[b] < timestamp:
                continue
            lo = tb.first + b * TIME_BLOCK
            for entry in await h.read_batch(lo, min(upto, lo + TIME_BLOCK - 1)):
                bh = BatchHeader.parse(entry.payload)
                if bh.max_timestamp < timestamp or bh.next_offset <= start:
                    continue
                # in a worker thread: a compressed batch may expand to many records,
                # and the event loop serves every other client meanwhile
                found = await trio.to_thread.run_sync(
                    first_at_or_after, entry.payload, timestamp, start,
                    limiter=decompressing.limiter())
                if found is not None:
                    return found
        return None

    async def offset_of_max_timestamp(self) -> tuple[int, int] | None:
        """ListOffsets' MAX_TIMESTAMP (-3, KIP-734): ``(timestamp, offset)`` of the first
        record at or after the log start carrying the largest timestamp of those
        records; None for an empty log. The ledgers' ``TimeBlocks`` (every batch header
        read once) point at the one stretch of 64 entries that holds it (and the
        stretch holding the log start, whose batches below it do not count)."""
        start = await self.start_offset()

        async def walk(listed: tuple[int, ...], _mark: int) -> tuple[int, int] | None:
            best: tuple[int, int] | None = None  # (offset, timestamp) of the answer so far
            ledgers = list(listed)
            for i, lid in enumerate(ledgers):
                if best is not None and self.ledger_max.get(lid, best[1] + 1) <= best[1]:
                    continue  # closed, and nothing in it is later than the best so far
                try:
                    if await self._below_start(ledgers, i, start):
                        continue
                    best = await self._latest_in(lid, start, best)
                except NoSuchLedgerError:  # dropped or swapped meanwhile
                    await self._pass_gone(lid)
                    continue
            return best

        best = await self._walk(walk)
        return None if best is None else (best[1], best[0])

    async def _latest_in(self, lid: int, start: int, best: tuple[int, int] | None,
                         ) -> tuple[int, int] | None:
        """``best``, or the ledger's first record at or after ``start`` with the largest
        timestamp if that is larger than ``best``'s."""
        tb = await self._time_blocks(lid)
        await self._note_ledger_max(lid, tb)
        if tb is None:
            return best
        upto, n = tb.upto, len(tb.maxes)
        b0 = tb.block_of(start)
        blocks = [b0]  # the block holding the log start: its batches one by one
        rest = tb.maxes[b0 + 1:n]
        if rest:
            top = max(rest)
            blocks.append(b0 + 1 + rest.index(top))  # the first block with the rest's max
        h = await self._handle(lid)
        for b in blocks:
            if best is not None and tb.maxes[b] <= best[1]:
                continue
            lo = tb.first + b * TIME_BLOCK
            for entry in await h.read_batch(lo, min(upto, lo + TIME_BLOCK - 1)):
                bh = BatchHeader.parse(entry.payload)
                if bh.next_offset <= start or (best is not None
                                               and bh.max_timestamp <= best[1]):
                    continue
                found = await trio.to_thread.run_sync(latest_record, entry.payload, start,
                                                      limiter=decompressing.limiter())
                if found is not None and (best is None or found[1] > best[1]):
                    best = found
        return best


@dataclass
class TimeBlocks:
    """A ledger's timestamp summary (Kafka's time index, in memory): for each block of
    ``TIME_BLOCK`` entries from ``first``, the largest batch maxTimestamp among them
    (``maxes``) and the first batch's base offset (``offsets``), summarised up to entry
    ``upto``. It only grows: entries up to ``upto`` never change."""

    first: int
    upto: int
    maxes: array[int]
    offsets: array[int]

    def block_of(self, offset: int) -> int:
        """The first block that may hold ``offset`` or a later one: every block before
        it ends below ``offset``."""
        return max(0, bisect.bisect_right(self.offsets, offset) - 1)


def settings_from(get: Callable[[str], int]) -> PartitionSettings:
    return PartitionSettings(get("ensemble_size"), get("write_quorum_size"),
                             get("ack_quorum_size"), get("log_roll_bytes"),
                             get("tail_cache_bytes"), get("max_append_bytes"))
