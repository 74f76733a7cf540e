"""Record timestamps inside a RecordBatch v2: which record a ListOffsets by time names.

Kafka answers ListOffsets for a timestamp with the first *record* whose timestamp is at
or after it, and that record's timestamp (``LogSegment.findOffsetByTimestamp``: the
first batch whose maxTimestamp reaches the target, then the first record in it that
does). A batch's records follow its 61-byte header (``records.py``), compressed as a
whole when the batch is; each record is::

    length varint | attributes i8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint | key | valueLength varint | value | headerCount varint | headers

(varints zigzag-encoded). A record's timestamp is baseTimestamp + timestampDelta; in a
LogAppendTime batch (attributes bit 3) every record carries the batch's maxTimestamp.

Decompression is bounded (``MAX_RECORDS_BYTES``): the batch came from a client, and a
small batch can claim a huge expansion. A batch that cannot be opened here (snappy
framing we do not know, lz4 without its module, more than the bound) is answered at
batch granularity: its first record and the batch's maxTimestamp, as before; that is
never after the record Kafka would name.

Pure: bytes in, ``(offset, timestamp)`` out.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator

import cramjam

from ledgerd.base.errors import LedgerdError
from ledgerd.kafka.records import HEADER_SIZE, BatchError, BatchHeader, read_varint

__all__ = ["MAX_RECORDS_BYTES", "RecordsError", "RecordsTooLargeError", "decompressed",
           "first_at_or_after", "record_times", "records_of"]

MAX_RECORDS_BYTES = 64 << 20  # a batch's records, decompressed, at most
LOG_APPEND_TIME = 0x08
_XERIAL = b"\x82SNAPPY\x00"


class RecordsError(LedgerdError, ValueError):
    """A batch's records cannot be read: ``reason`` says where and why."""


class RecordsTooLargeError(RecordsError):
    """A batch's records expand past the bound they are read within."""


def first_at_or_after(batch: bytes, timestamp: int, min_offset: int = 0,
                      ) -> tuple[int, int] | None:
    """``(offset, timestamp)`` of the batch's first record at or above ``min_offset``
    (the log start) whose timestamp is at or after ``timestamp``; None if it has none.
    If its records cannot be read, the batch's first offset (at least ``min_offset``)
    and its maxTimestamp are the answer (the batch granularity Kafka's own index has)."""
    h = BatchHeader.parse(batch)
    if h.next_offset <= min_offset or h.max_timestamp < timestamp:
        return None
    if h.attributes & LOG_APPEND_TIME:
        return max(h.base_offset, min_offset), h.max_timestamp
    try:
        for offset, ts in record_times(batch):
            if ts >= timestamp and offset >= min_offset:
                return offset, ts
        return None
    except RecordsError:
        return max(h.base_offset, min_offset), h.max_timestamp


def latest_record(batch: bytes, min_offset: int = 0) -> tuple[int, int] | None:
    """``(offset, timestamp)`` of the first record at or above ``min_offset`` carrying
    the largest timestamp of those records; None if the batch has none there."""
    h = BatchHeader.parse(batch)
    if h.next_offset <= min_offset:
        return None
    if h.attributes & LOG_APPEND_TIME:
        return max(h.base_offset, min_offset), h.max_timestamp
    best: tuple[int, int] | None = None
    try:
        for offset, ts in record_times(batch):
            if offset >= min_offset and (best is None or ts > best[1]):
                best = offset, ts
    except RecordsError:
        return max(h.base_offset, min_offset), h.max_timestamp
    return best


def record_times(batch: bytes) -> Iterator[tuple[int, int]]:
    """``(offset, timestamp)`` of each record of ``batch``, in order (one at a time: a
    batch may hold millions). Raises RecordsError, when it gets there, for records that
    do not parse or cannot be decompressed here."""
    h = BatchHeader.parse(batch)
    body = records_of(h, memoryview(batch)[HEADER_SIZE:h.length])
    at = 0
    for i in range(h.record_count):
        length, at = _varint(body, at, i)
        end = at + length
        if length < 3 or end > len(body):
            raise RecordsError(f"record {i} claims {length} bytes; {len(body) - at} remain")
        at += 1  # attributes
        delta_ts, at = _varint(body, at, i)
        delta_off, at = _varint(body, at, i)
        if at > end:
            raise RecordsError(f"record {i}'s header runs past its {length} bytes")
        yield h.base_offset + delta_off, h.base_timestamp + delta_ts
        at = end


def _varint(data: bytes | memoryview, at: int, record: int) -> tuple[int, int]:
    """``records.read_varint``, its failure naming the record."""
    try:
        return read_varint(data, at)
    except BatchError:
        raise RecordsError(f"record {record}: a varint at byte {at} does not end") from None


def records_of(h: BatchHeader, raw: memoryview) -> bytes | memoryview:
    """The records section of the batch ``h`` heads (``raw``: its bytes after the
    header), decompressed (bounded by ``MAX_RECORDS_BYTES``). Raises RecordsError."""
    return decompressed(h.attributes & 7, raw)


def decompressed(codec: int, raw: bytes | memoryview,
                 limit: int = MAX_RECORDS_BYTES) -> bytes | memoryview:
    """``raw`` decompressed with ``codec`` (a batch's attributes bits 0-2: 0 none,
    1 gzip, 2 snappy, 3 lz4, 4 zstd), at most ``limit`` bytes (at most
    ``MAX_RECORDS_BYTES``). Raises RecordsError."""
    limit = min(limit, MAX_RECORDS_BYTES)
    if codec == 0:
        return raw
    if codec == 1:  # gzip
        d = zlib.decompressobj(wbits=47)  # gzip or zlib header
        try:
            out = d.decompress(raw, limit + 1)
        except zlib.error as exc:
            raise RecordsError(f"gzip: {exc}") from None
        if len(out) <= limit and not d.eof:
            raise RecordsError("gzip: the stream ends before its end")
        return _bounded(out, limit)
    if codec == 2:
        return _snappy(bytes(raw), limit)
    if codec == 3:
        try:
            import lz4.frame  # type: ignore[import-untyped,import-not-found,unused-ignore]
        except ImportError:
            raise RecordsError("lz4: the lz4 module is not installed") from None
        try:
            return _bounded(lz4.frame.LZ4FrameDecompressor().decompress(
                bytes(raw), max_length=limit + 1), limit)
        except RuntimeError as exc:
            raise RecordsError(f"lz4: {exc}") from None
    if codec == 4:
        import zstandard

        try:
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as r:
                return _bounded(r.read(limit + 1), limit)
        except zstandard.ZstdError as exc:
            raise RecordsError(f"zstd: {exc}") from None
    raise RecordsError(f"unknown compression codec {codec}")


def _bounded(out: bytes, limit: int = MAX_RECORDS_BYTES) -> bytes:
    if len(out) > limit:
        raise RecordsTooLargeError(f"records expand past {limit} bytes")
    return out


def _snappy(data: bytes, limit: int = MAX_RECORDS_BYTES) -> bytes:
    """Kafka's snappy: the Java client's xerial framing (magic, version, compat, then
    [length i32][raw block]...) or one raw block (librdkafka); at most ``limit`` bytes."""
    if not data.startswith(_XERIAL):
        return _snappy_block(data, limit)
    at, out = 16, bytearray()
    while at < len(data):
        if at + 4 > len(data):
            raise RecordsError("snappy: a truncated xerial block length")
        n = int.from_bytes(data[at:at + 4], "big")
        at += 4
        out += _snappy_block(data[at:at + n], limit - len(out))
        at += n
        if len(out) > limit:
            raise RecordsTooLargeError(f"records expand past {limit} bytes")
    return bytes(out)


def _snappy_block(data: bytes, limit: int = MAX_RECORDS_BYTES) -> bytes:
    """One raw snappy block (the format's preamble and elements), at most ``limit``
    bytes."""
    size = shift = at = 0
    while True:
        if at >= len(data) or at > 4:
            raise RecordsError("snappy: a bad length preamble")
        b = data[at]
        at += 1
        size |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    if size > limit:
        raise RecordsTooLargeError(f"snappy: a block of {size} bytes is over {limit}: "
                                   "records expand past what is read")
    # cramjam's decoder (C speed: a pure-Python one took 100 ms a MiB, and every
    # compressed produced batch is decompressed for its record check)
    try:
        out = bytes(cramjam.snappy.decompress_raw(bytes(data)))
    except cramjam.DecompressionError as exc:
        raise RecordsError(str(exc) if str(exc).startswith("snappy") else f"snappy: {exc}"
                           ) from None
    if len(out) != size:
        raise RecordsError(f"snappy: {len(out)} bytes decoded, the preamble said {size}")
    return out
