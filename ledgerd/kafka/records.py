"""Kafka RecordBatch v2, as far as the gateway needs it: split, check, re-offset.

One produced batch becomes one ledger entry, byte for byte, with its ``baseOffset``
set to the Kafka offset the gateway assigned; compressed batches pass through
untouched. Layout (``DefaultRecordBatch.java``), big-endian::

    0  baseOffset i64   8 batchLength i32 (bytes after this field)   12 leaderEpoch i32
    16 magic i8 (=2)   17 crc u32 (CRC-32C of bytes 21..end)          21 attributes i16
    23 lastOffsetDelta i32   27 baseTimestamp i64   35 maxTimestamp i64
    43 producerId i64   51 producerEpoch i16   53 baseSequence i32   57 recordCount i32
    61 records...

The CRC leaves out baseOffset, batchLength, leaderEpoch and magic, so rewriting the
base offset keeps it valid. attributes: bits 0-2 compression (0 none, 1 gzip,
2 snappy, 3 lz4, 4 zstd), bit 3 LogAppendTime, bit 4 transactional, bit 5 control.

The records section (compressed as a whole by the codec) holds ``recordCount`` records,
each (``DefaultRecord.java``; varints zigzag-encoded)::

    length varint (bytes after it) | attributes i8 | timestampDelta varint
    | offsetDelta varint | keyLength varint (-1: null) | key | valueLength varint
    (-1: null, a tombstone) | value | headerCount varint | headers...

``record_spans`` reads that layout and ``batch_with_records`` writes a batch from
records kept byte for byte (compaction, ``compaction.py``): both sides of the layout
are here. ``check_records`` walks a produced batch's records before it is stored.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from ledgerd.base.errors import LedgerdError

__all__ = ["HEADER_SIZE", "BatchError", "BatchHeader", "RecordSpan", "batch_with_records",
           "batches_below", "check_records", "empty_run_end", "read_varint", "record_spans", "split_batches", "with_base_offset",
           "with_log_append_time", "zigzag"]

HEADER_SIZE = 61
_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class BatchError(LedgerdError, ValueError):
    """A produced record set that is not a valid RecordBatch v2; ``code`` is the Kafka
    error to answer (CORRUPT_MESSAGE, INVALID_RECORD, UNSUPPORTED_*)."""

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    length: int  # whole batch, header included
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    leader_epoch: int = -1  # partitionLeaderEpoch: the epoch of the leader that wrote it

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> str:
        return CODECS.get(self.attributes & 7, f"codec {self.attributes & 7}")

    @classmethod
    def parse(cls, data: bytes | memoryview, at: int = 0) -> BatchHeader:
        if len(data) - at < HEADER_SIZE:
            raise BatchError(2, f"record batch of {len(data) - at} bytes is shorter than "
                                f"its {HEADER_SIZE}-byte header")
        (base, blen, epoch, magic, crc, attrs, lod, bts, mts, pid, pep, seq,
         count) = _HEADER.unpack_from(data, at)
        return cls(base, blen + 12, magic, crc, attrs, lod, bts, mts, pid, pep, seq, count,
                   epoch)


def split_batches(records: bytes, *, max_batch_bytes: int,
                  limit_name: str = "max_batch_bytes",
                  transactional: bool = False) -> list[tuple[BatchHeader, bytes]]:
    """The batches of a produced record set, each checked: magic 2, length within the
    set and under ``max_batch_bytes``, CRC-32C, no control batch, transactional exactly
    when the request is (``transactional``: it names a transactional id; then each
    batch carries a producer id), a record count that matches lastOffsetDelta. Raises
    BatchError naming the fault."""
    out: list[tuple[BatchHeader, bytes]] = []
    view = memoryview(records)
    at = 0
    while at < len(view):
        if len(view) - at < 17:
            raise BatchError(2, f"{len(view) - at} trailing bytes after batch {len(out)}")
        magic = view[at + 16]
        if magic != 2:
            raise BatchError(35, f"message format magic {magic}: only RecordBatch v2 "
                                 "(magic 2, Kafka 0.11+) is accepted")
        h = BatchHeader.parse(view, at)
        if h.length < HEADER_SIZE or at + h.length > len(view):
            raise BatchError(2, f"batch {len(out)} claims {h.length} bytes; "
                                f"{len(view) - at} are there")
        if h.length > max_batch_bytes:
            raise BatchError(10, f"batch of {h.length} bytes is over the "
                                 f"{max_batch_bytes}-byte limit ({limit_name})")
        body = view[at:at + h.length]
        if google_crc32c.value(bytes(body[21:])) != h.crc:
            raise BatchError(2, f"batch {len(out)} fails its CRC-32C")
        if h.attributes & CONTROL:
            raise BatchError(87, "control batches are written by the transaction "
                                 "coordinator, not produced")
        if bool(h.attributes & TRANSACTIONAL) != transactional:
            raise BatchError(87, "a transactional batch in a request without a "
                                 "transactional id" if not transactional else
                                 "a batch without the transactional bit in a "
                                 "transactional request")
        if transactional and (h.producer_id < 0 or h.producer_epoch < 0):
            raise BatchError(87, f"transactional batch {len(out)} has no producer id")
        if h.attributes & 7 not in CODECS:
            raise BatchError(76, f"unknown compression codec {h.attributes & 7}")
        if h.record_count <= 0 or h.last_offset_delta != h.record_count - 1:
            raise BatchError(87, f"batch {len(out)} has {h.record_count} records but "
                                 f"lastOffsetDelta {h.last_offset_delta}")
        out.append((h, bytes(body)))
        at += h.length
    if not out:
        raise BatchError(87, "empty record set")
    return out


def batches_below(batches: bytes, end: int) -> bytes:
    """``batches`` (whole batches, back to back) up to the first one at or past offset
    ``end`` (a high watermark: a fetch never returns a batch beyond it)."""
    at = 0
    while at < len(batches):
        h = BatchHeader.parse(batches, at)
        if h.base_offset >= end:
            return batches[:at]
        at += h.length
    return batches


def empty_run_end(batches: bytes | memoryview) -> int | None:
    """The next offset after ``batches`` (whole batches, back to back) if not one of
    them holds a record (compaction empties batches and keeps them), else None (None
    too for no batch). librdkafka takes a fetch that yields no record as a size limit
    too tight: it doubles the partition's fetch size, and past 1 GiB reports
    MSG_SIZE_TOO_LARGE, so a reader goes on past such a run."""
    at, end = 0, None
    while at < len(batches):
        h = BatchHeader.parse(batches, at)
        if h.record_count:
            return None
        at, end = at + h.length, h.next_offset
    return end


def with_base_offset(batch: bytes, base_offset: int, leader_epoch: int | None = None,
                     ) -> bytes:
    """The batch with its baseOffset rewritten and, if given, its partitionLeaderEpoch
    (as a Kafka leader stamps it; the CRC covers neither)."""
    if leader_epoch is None:
        return struct.pack(">q", base_offset) + batch[8:]
    return struct.pack(">q", base_offset) + batch[8:12] + struct.pack(">i", leader_epoch) \
        + batch[16:]


def with_log_append_time(batch: bytes, now_ms: int) -> bytes:
    """The batch stamped as a broker stamps a LogAppendTime topic's batches: attribute
    bit 3 set and maxTimestamp = ``now_ms`` (consumers then read that time for every
    record), the CRC-32C computed again over the changed bytes."""
    attrs = struct.unpack_from(">h", batch, 21)[0] | LOG_APPEND_TIME
    tail = bytearray(batch[21:])
    struct.pack_into(">h", tail, 0, attrs)
    struct.pack_into(">q", tail, 35 - 21, now_ms)
    return batch[:17] + struct.pack(">I", google_crc32c.value(bytes(tail))) + bytes(tail)


@dataclass(frozen=True, slots=True)
class RecordSpan:
    """One record of a batch's (decompressed) records section: where it lies
    (``start``..``end``, its length prefix included), its offset and timestamp deltas,
    its key (None: null) and whether its value is null (a tombstone)."""

    start: int
    end: int
    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    is_tombstone: bool


def read_varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """A zigzag varint (up to 10 bytes) at ``at``; returns it and the next position.
    Raises BatchError (CORRUPT_MESSAGE) if it does not end."""
    shift = value = 0
    for i in range(at, min(at + 10, len(data))):
        b = data[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), i + 1
        shift += 7
    raise BatchError(2, f"a varint at byte {at} does not end")


def zigzag(n: int) -> bytes:
    """``n`` as a zigzag varint (what ``read_varint`` reads)."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def record_spans(body: bytes | memoryview, count: int) -> list[RecordSpan]:
    """The ``count`` records of a decompressed records section, in order. Raises
    BatchError (CORRUPT_MESSAGE) naming the record that does not parse."""
    out: list[RecordSpan] = []
    at = 0
    for i in range(count):
        start = at
        length, at = read_varint(body, at)
        end = at + length
        if length < 6 or end > len(body):
            raise BatchError(2, f"record {i} claims {length} bytes; {len(body) - at} remain")
        at += 1  # attributes
        ts, at = read_varint(body, at)
        off, at = read_varint(body, at)
        klen, at = read_varint(body, at)
        key = None
        if klen >= 0:
            key, at = bytes(body[at:at + klen]), at + klen
        vlen, at = read_varint(body, at)
        if at > end or (vlen > 0 and at + vlen > end):
            raise BatchError(2, f"record {i}'s fields run past its {length} bytes")
        out.append(RecordSpan(start, end, off, ts, key, vlen < 0))
        at = end
    if at != len(body):
        raise BatchError(2, f"{len(body) - at} bytes after the batch's {count} records")
    return out


def _varint_at(data: bytes, at: int) -> tuple[int, int]:
    """``read_varint`` with the one- and two-byte cases first (IndexError past the end)."""
    b = data[at]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), at + 1
    c = data[at + 1]
    if c < 0x80:
        z = (b & 0x7F) | (c << 7)
        return (z >> 1) ^ -(z & 1), at + 2
    return read_varint(data, at)


def check_records(section: bytes | memoryview, count: int, batch_no: int = 0) -> None:
    """A produced batch's records section (decompressed) holds exactly ``count``
    records, each parsed whole (``DefaultRecord.readFrom``: its key, value and headers
    within its length, nothing over), with offset deltas 0, 1, ... as Kafka's log
    validator checks: a batch whose count lies would take offsets its records do not
    have (more) or give two records one offset (fewer), and consumers fail on records
    that do not parse. Raises BatchError: CORRUPT_MESSAGE for records that do not
    parse, INVALID_RECORD for a count or an offset delta that does not match."""
    data = bytes(section)
    n = len(data)
    at = 0
    i = -1
    varint = _varint_at
    try:
        for i in range(count):
            # one-byte varints (most fields) read inline; wider ones by ``varint``
            b = data[at]
            if b < 0x80:
                length, p = (b >> 1) ^ -(b & 1), at + 1
            elif data[at + 1] < 0x80:
                z = (b & 0x7F) | (data[at + 1] << 7)
                length, p = (z >> 1) ^ -(z & 1), at + 2
            else:
                length, p = varint(data, at)
            end = p + length
            if length < 6 or end > n:
                raise BatchError(2, f"batch {batch_no}: record {i} of {count} claims "
                                    f"{length} bytes; {n - p} remain")
            p += 1  # attributes
            if data[p] < 0x80:  # timestampDelta
                p += 1
            elif data[p + 1] < 0x80:
                p += 2
            else:
                _, p = varint(data, p)
            b = data[p]
            if b < 0x80:
                delta, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                delta, p = varint(data, p)
            if delta != i:
                raise BatchError(87, f"batch {batch_no}: record {i} has offset delta "
                                     f"{delta}")
            b = data[p]
            if b < 0x80:
                klen, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                klen, p = varint(data, p)
            if klen > 0:
                p += klen
            b = data[p]
            if b < 0x80:
                vlen, p = (b >> 1) ^ -(b & 1), p + 1
            elif data[p + 1] < 0x80:
                z = (b & 0x7F) | (data[p + 1] << 7)
                vlen, p = (z >> 1) ^ -(z & 1), p + 2
            else:
                vlen, p = varint(data, p)
            if vlen > 0:
                p += vlen
            b = data[p]
            if b < 0x80:
                headers, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                headers, p = varint(data, p)
            if klen < -1 or vlen < -1 or headers < 0 or p > end:
                raise BatchError(2, f"batch {batch_no}: record {i}'s key, value or header "
                                    f"count runs past its {length} bytes")
            for _ in range(headers) if headers else ():
                hk, p = varint(data, p)
                if hk < 0:
                    raise BatchError(2, f"batch {batch_no}: record {i} has a header "
                                        "without a key")
                hv, p = varint(data, p + hk)
                if hv > 0:
                    p += hv
                if hv < -1 or p > end:
                    raise BatchError(2, f"batch {batch_no}: record {i}'s headers run "
                                        f"past its {length} bytes")
            if p != end:
                raise BatchError(2, f"batch {batch_no}: record {i} has {end - p} bytes "
                                    "after its fields")
            at = end
    except IndexError:
        raise BatchError(2, f"batch {batch_no}: record {i} of {count} runs past the "
                            f"records' {n} bytes") from None
    if at != n:
        raise BatchError(87, f"batch {batch_no}: {n - at} bytes after the {count} records "
                             "its header counts")


def batch_with_records(header: bytes | memoryview, records: bytes, count: int) -> bytes:
    """A batch with ``header``'s 61 bytes (base offset, lastOffsetDelta, timestamps,
    producer id, epoch and base sequence, attributes and codec kept) around
    ``records``, the records section already compressed with the header's codec
    and holding ``count`` records: batchLength, recordCount and the CRC-32C new."""
    head = bytearray(header[:HEADER_SIZE])
    struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(records))
    struct.pack_into(">i", head, 57, count)
    tail = bytes(head[21:]) + records
    struct.pack_into(">I", head, 17, google_crc32c.value(tail))
    return bytes(head[:21]) + tail
