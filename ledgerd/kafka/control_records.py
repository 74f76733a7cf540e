"""Kafka's transaction markers (control batches) and a partition's transaction index.

A transaction ends in every partition it wrote with a *control batch* (KIP-98): a
RecordBatch v2 whose attributes carry the transactional (0x10) and control (0x20)
bits, the producer's id and epoch, no sequence (-1), and one record whose key says
what ended and whose value names the coordinator's epoch::

    key   = version i16 (0) | type i16 (0 ABORT, 1 COMMIT)
    value = version i16 (0) | coordinator_epoch i32

(``ControlRecordType.java``, ``EndTransactionMarker.java``). Control batches are never
compressed, and consumers never hand them to the application.

The :class:`TxnIndex` is what a partition knows of its transactions, rebuilt by
observing the log's batch headers in offset order (the leader as it writes, any
other gateway by reading the log back): the *ongoing* transactions (a producer id
whose transactional batch came after its last marker, and the offset of its first
batch), and the *aborted* ones (producer id, first offset, offset of the ABORT
marker). From it:

- the *last stable offset* (LSO): the first offset of the earliest ongoing
  transaction, or the high watermark when none is ongoing; a read_committed consumer
  is served only below it;
- the aborted transactions a fetch of ``[start, end]`` must list, so the consumer
  drops their records (``FetchResponse.AbortedTransactions``).

Pure: bytes and headers in, offsets out.
"""

from __future__ import annotations

import enum
import struct
import time
from collections import deque
from dataclasses import dataclass, field

import google_crc32c

from ledgerd.kafka.records import (
    CONTROL,
    HEADER_SIZE,
    TRANSACTIONAL,
    BatchError,
    BatchHeader,
    read_varint,
    zigzag,
)

__all__ = ["MAX_ABORTED", "ControlType", "TxnIndex", "batch_kind", "committed_prefix",
           "control_batch", "control_type"]

MAX_ABORTED = 100_000  # aborted transactions a partition's index remembers (oldest go)
_HEADER = struct.Struct(">qiibIhiqqqhii")
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


def control_batch(*, producer_id: int, producer_epoch: int, commit: bool,
                  coordinator_epoch: int = 0, timestamp_ms: int | None = None) -> bytes:
    """A marker batch (base offset 0: the appender sets it) ending ``producer_id``'s
    transaction: COMMIT if ``commit`` else ABORT."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    key = _KEY.pack(0, ControlType.COMMIT if commit else ControlType.ABORT)
    value = _VALUE.pack(0, coordinator_epoch)
    body = (b"\x00" + zigzag(0) + zigzag(0) + zigzag(len(key)) + key
            + zigzag(len(value)) + value + zigzag(0))
    record = zigzag(len(body)) + body
    attributes = TRANSACTIONAL | CONTROL
    # the part the CRC covers: attributes onwards
    tail = struct.pack(">hiqqqhii", attributes, 0, ts, ts, producer_id, producer_epoch,
                       -1, 1) + record
    crc = google_crc32c.value(tail)
    head = struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, crc)
    batch = head + tail
    assert len(batch) == HEADER_SIZE + len(record)
    return batch


def control_type(batch: bytes | memoryview) -> ControlType:
    """What a control batch marks (the key of its first record). Raises BatchError if
    it is not a control batch or its key is not one Kafka defines."""
    h = BatchHeader.parse(batch)
    if not h.attributes & CONTROL:
        raise BatchError(87, "not a control batch")
    at = HEADER_SIZE
    _length, at = read_varint(batch, at)
    at += 1  # attributes
    _ts, at = read_varint(batch, at)
    _off, at = read_varint(batch, at)
    key_len, at = read_varint(batch, at)
    if key_len < 4 or at + key_len > len(batch):
        raise BatchError(2, f"control record key of {key_len} bytes")
    _version, kind = _KEY.unpack_from(batch, at)
    try:
        return ControlType(kind)
    except ValueError:
        raise BatchError(87, f"unknown control record type {kind}") from None


@dataclass(slots=True)
class TxnIndex:
    """A partition's transactions as seen in its log up to ``covered`` (the next offset
    not yet observed); see the module docstring. Observe batches in offset order."""

    covered: int = 0
    ongoing: dict[int, int] = field(default_factory=dict)  # pid -> first offset
    # (pid, first offset, marker offset), in marker order (so by last offset)
    aborted: deque[tuple[int, int, int]] = field(default_factory=deque)

    def observe(self, header: BatchHeader, kind: ControlType | None = None) -> None:
        """Account for one batch of the log (``kind``: what it marks, if a control
        batch). A batch below ``covered`` was seen already and is ignored."""
        if header.base_offset < self.covered:
            return
        self.covered = header.next_offset
        if not header.attributes & TRANSACTIONAL:
            return
        pid = header.producer_id
        if header.attributes & CONTROL:
            first = self.ongoing.pop(pid, None)
            if kind is ControlType.ABORT and first is not None:
                self.aborted.append((pid, first, header.base_offset))
                while len(self.aborted) > MAX_ABORTED:
                    self.aborted.popleft()
            return
        self.ongoing.setdefault(pid, header.base_offset)

    def skip_to(self, offset: int) -> None:
        """Nothing transactional lies below ``offset`` (the log had no transaction
        before it): start observing there."""
        self.covered = max(self.covered, offset)

    def last_stable_offset(self, high_watermark: int) -> int:
        """The LSO: below the earliest ongoing transaction and the high watermark."""
        return min([high_watermark, *self.ongoing.values()])

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """``(producer id, first offset)`` of the aborted transactions with a record in
        ``[start, end]``: begun at or before ``end``, ended (marker) after ``start``."""
        return [(pid, first) for pid, first, last in self.aborted
                if first <= end and last >= start]


def batch_kind(batch: bytes | memoryview, header: BatchHeader) -> ControlType | None:
    """``control_type`` of a control batch, None for any other (an unreadable marker
    counts as an ABORT: its records are then never shown to read_committed readers)."""
    if not header.attributes & CONTROL:
        return None
    try:
        return control_type(batch)
    except BatchError:
        return ControlType.ABORT


def committed_prefix(records: bytes, lso: int) -> tuple[bytes, int]:
    """The whole batches of ``records`` that begin below ``lso`` (a transaction's first
    batch, or the high watermark, so never one that straddles it), and the last
    offset they hold (-1: none)."""
    at = 0
    last = -1
    while at + HEADER_SIZE <= len(records):
        h = BatchHeader.parse(records, at)
        if h.base_offset >= lso:
            break
        last = h.last_offset
        at += h.length
    return records[:at], last


def _check() -> None:
    b = control_batch(producer_id=7, producer_epoch=3, commit=True, timestamp_ms=1)
    h = BatchHeader.parse(b)
    assert h.length == len(b) and h.record_count == 1 and h.last_offset_delta == 0
    assert google_crc32c.value(b[21:]) == h.crc
    assert control_type(b) is ControlType.COMMIT
    assert _HEADER.size == HEADER_SIZE


_check()
