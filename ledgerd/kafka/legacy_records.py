"""Kafka's message sets of magic 0 and 1 (clients before 0.11), up-converted to one
RecordBatch v2 as Kafka's broker up-converts them.

Produce v0-2 carry a *message set*, not record batches (``LegacyRecord.java``,
``AbstractLegacyRecordBatch.java``), big-endian::

    message set  = (offset i64 | messageSize i32 | message)*
    message v0   = crc u32 | magic i8 (=0) | attributes i8 | key bytes | value bytes
    message v1   = crc u32 | magic i8 (=1) | attributes i8 | timestamp i64 | key | value

``bytes`` is an i32 length (-1: null) and the bytes; the CRC is CRC-32 (not 32C) of
everything after it. attributes bits 0-2 are the codec (0 none, 1 gzip, 2 snappy,
3 lz4); a compressed message is a *wrapper* whose value is a whole inner message set,
compressed (inner messages are not compressed again). Bit 3 of a v1 message is the
timestamp type (1: LogAppendTime, the wrapper's timestamp applies to its inner messages).

Kafka 3.x stores every topic in RecordBatch v2 and up-converts (``LogValidator``):
the records in order, offsets assigned in the one new batch, a v0 message's timestamp
``NO_TIMESTAMP`` (-1), a v1 message's its own; no producer id, epoch or sequence. So
does ``upconverted`` here: one uncompressed batch and the codec the wrappers had, which
the produce path compresses with the topic's ``compression.type`` (with that codec when
it is ``producer``, as Kafka keeps the producer's), then checks against
max.message.bytes and stores as a batch produced in v2 (``records.split_batches``).

Every length is checked against the bytes there, the CRC of every message (outer and
inner) is checked, and decompression is bounded for the whole set together (``limit``,
at most ``timestamps.MAX_RECORDS_BYTES``: a request of a few MB of wrappers cannot ask
for GBs); a fault is a BatchError with Kafka's code (CORRUPT_MESSAGE, 2, for lengths,
CRCs and compressed data that do not hold; UNSUPPORTED_COMPRESSION_TYPE, 76, for a
codec a v0/v1 message cannot carry; INVALID_TIMESTAMP, 32, below -1; INVALID_RECORD,
87, for a magic-2 batch in Produce v0-2, as Kafka's ``ProduceRequest.validateRecords``,
an inner message of another magic than its wrapper's or compressed again). lz4 is read in the LZ4 frame format of
magic 1; magic 0's lz4 (Kafka 0.8-0.9, whose frame header checksum was computed wrongly)
is refused as corrupt.

Pure: bytes in, bytes out. ``legacy_message_set`` writes the layout (a client's side,
for tests and tools), so writer and reader share this one declaration.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import google_crc32c

from ledgerd.kafka.compression import Codec, compress, recompress
from ledgerd.kafka.records import HEADER_SIZE, BatchError, zigzag
from ledgerd.kafka.timestamps import MAX_RECORDS_BYTES, RecordsError, decompressed

__all__ = ["LegacyMessage", "legacy_batch", "legacy_message_set", "messages", "upconverted"]

NO_TIMESTAMP = -1
_ENTRY = struct.Struct(">qi")  # offset, messageSize
_HEAD = struct.Struct(">Ibb")  # crc, magic, attributes
_TIMESTAMP = struct.Struct(">q")
_LEN = struct.Struct(">i")
TIMESTAMP_TYPE = 0x08
CORRUPT_MESSAGE = 2
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87
INVALID_TIMESTAMP = 32


@dataclass(frozen=True, slots=True)
class LegacyMessage:
    """One message of a message set, as read (or to write): ``timestamp`` is
    NO_TIMESTAMP for magic 0."""

    key: bytes | None
    value: bytes | None
    timestamp: int = NO_TIMESTAMP
    magic: int = 1


def _bytes(data: memoryview, at: int, end: int, what: str) -> tuple[bytes | None, int]:
    if at + 4 > end:
        raise BatchError(CORRUPT_MESSAGE, f"{what}: its length runs past the message")
    n = _LEN.unpack_from(data, at)[0]
    at += 4
    if n == -1:
        return None, at
    if n < 0 or at + n > end:
        raise BatchError(CORRUPT_MESSAGE, f"{what}: {n} bytes claimed, {end - at} there")
    return bytes(data[at:at + n]), at + n


class _Budget:
    """Bytes the wrappers of one message set may still decompress to, together."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.codec = 0  # the first wrapper's codec (0: none)


def messages(message_set: bytes | memoryview, *, limit: int = MAX_RECORDS_BYTES,
             ) -> Iterator[LegacyMessage]:
    """The messages of a v0/v1 message set in order, wrappers opened (all of them
    decompressing to at most ``limit`` bytes together). Raises BatchError naming the
    fault (CORRUPT_MESSAGE for bad lengths, CRCs and compressed data)."""
    return _messages(message_set, _Budget(limit), None)


def _messages(message_set: bytes | memoryview, budget: _Budget, wrapper_magic: int | None,
              ) -> Iterator[LegacyMessage]:
    inner = wrapper_magic is not None
    data = memoryview(message_set)
    at = n = 0
    while at < len(data):
        if len(data) - at < _ENTRY.size:
            raise BatchError(CORRUPT_MESSAGE, f"{len(data) - at} trailing bytes after "
                                              f"message {n}")
        _offset, size = _ENTRY.unpack_from(data, at)
        at += _ENTRY.size
        end = at + size
        if size < _HEAD.size + 8 or end > len(data):
            raise BatchError(CORRUPT_MESSAGE, f"message {n} claims {size} bytes; "
                                              f"{len(data) - at} are there")
        crc, magic, attributes = _HEAD.unpack_from(data, at)
        if magic not in (0, 1):
            raise BatchError(INVALID_RECORD, f"message {n} has magic {magic}: Produce v0-2 "
                                             "carry message sets of magic 0 or 1 (a "
                                             "RecordBatch, magic 2, needs Produce v3+)")
        if inner and magic != wrapper_magic:
            raise BatchError(INVALID_RECORD, f"inner message {n} has magic {magic}, its "
                                             f"wrapper {wrapper_magic}")
        if zlib.crc32(data[at + 4:end]) != crc:
            raise BatchError(CORRUPT_MESSAGE, f"message {n} fails its CRC-32")
        pos = at + _HEAD.size
        timestamp = NO_TIMESTAMP
        if magic == 1:
            if pos + 8 > end:
                raise BatchError(CORRUPT_MESSAGE, f"message {n}: no room for its timestamp")
            timestamp = _TIMESTAMP.unpack_from(data, pos)[0]
            pos += 8
            if timestamp < NO_TIMESTAMP:
                raise BatchError(INVALID_TIMESTAMP, f"message {n} has timestamp "
                                                    f"{timestamp}")
        key, pos = _bytes(data, pos, end, f"message {n}'s key")
        value, pos = _bytes(data, pos, end, f"message {n}'s value")
        if pos != end:
            raise BatchError(CORRUPT_MESSAGE, f"message {n}: {end - pos} bytes after its "
                                              "value")
        codec = attributes & 7
        if codec == 0:
            yield LegacyMessage(key, value, timestamp, magic)
        elif inner:
            raise BatchError(INVALID_RECORD, f"inner message {n} is compressed again")
        elif codec > 3:
            raise BatchError(UNSUPPORTED_COMPRESSION_TYPE, f"message {n}: codec {codec} "
                             "(zstd needs RecordBatch v2, produce v7+)")
        elif value is None:
            raise BatchError(CORRUPT_MESSAGE, f"compressed message {n} has no value")
        else:
            try:
                body = decompressed(codec, value, budget.left)
            except RecordsError as exc:
                lz4_v0 = " (magic 0's lz4 framing is not read)" if codec == 3 and magic == 0 \
                    else ""
                raise BatchError(CORRUPT_MESSAGE, f"message {n}: {exc}{lz4_v0}") from None
            budget.left -= len(body)
            budget.codec = budget.codec or codec
            log_append = magic == 1 and attributes & TIMESTAMP_TYPE
            for m in _messages(body, budget, magic):
                yield LegacyMessage(m.key, m.value, timestamp if log_append else m.timestamp,
                                    m.magic)
        at = end
        n += 1


def _record(m: LegacyMessage, delta: int, base_ts: int) -> bytes:
    # a v0 message among v1 ones keeps NO_TIMESTAMP (-1): base + delta = -1 (timestamps
    # are >= -1, so the delta stays within 64 bits)
    ts_delta = m.timestamp - base_ts
    body = [b"\x00", zigzag(ts_delta), zigzag(delta)]
    for field in (m.key, m.value):
        if field is None:
            body.append(zigzag(-1))
        else:
            body += [zigzag(len(field)), field]
    body.append(zigzag(0))  # no headers
    raw = b"".join(body)
    return zigzag(len(raw)) + raw


def upconverted(message_set: bytes | memoryview, limit: int = MAX_RECORDS_BYTES,
                ) -> tuple[bytes, Codec]:
    """The messages of a v0/v1 message set as one uncompressed RecordBatch v2 (base
    offset 0, no producer id), and the codec its wrappers had (UNCOMPRESSED: none; a
    topic whose ``compression.type`` is ``producer`` stores the batch with it, as Kafka
    keeps the producer's codec). The wrappers decompress to at most ``limit`` bytes
    together. Raises BatchError for a set that does not parse or holds no message."""
    budget = _Budget(limit)
    msgs = list(_messages(message_set, budget, None))
    if not msgs:
        raise BatchError(INVALID_RECORD, "empty message set")
    stamped = [m.timestamp for m in msgs if m.timestamp != NO_TIMESTAMP]
    base_ts = stamped[0] if stamped else NO_TIMESTAMP
    max_ts = max(stamped) if stamped else NO_TIMESTAMP
    records = b"".join(_record(m, i, base_ts) for i, m in enumerate(msgs))
    tail = struct.pack(">hiqqqhii", 0, len(msgs) - 1, base_ts, max_ts, -1, -1, -1,
                       len(msgs)) + records
    head = struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, google_crc32c.value(tail))
    batch = head + tail
    assert len(batch) == HEADER_SIZE + len(records)
    return batch, Codec(budget.codec)


def legacy_batch(message_set: bytes | memoryview, topic_codec: Codec | None,
                 limit: int = MAX_RECORDS_BYTES) -> bytes:
    """A Produce v0-2 partition's message set as the one RecordBatch v2 to store:
    up-converted, then compressed with the topic's codec (None: ``producer``, the
    wrappers' own). Raises BatchError."""
    batch, codec = upconverted(message_set, limit)
    target = codec if topic_codec is None else topic_codec
    return batch if target is Codec.UNCOMPRESSED else recompress(batch, target)


def _message(m: LegacyMessage, attributes: int = 0) -> bytes:
    body = struct.pack(">bb", m.magic, attributes)
    if m.magic == 1:
        body += _TIMESTAMP.pack(m.timestamp)
    for field in (m.key, m.value):
        body += _LEN.pack(-1) if field is None else _LEN.pack(len(field)) + field
    return struct.pack(">I", zlib.crc32(body)) + body


def legacy_message_set(msgs: list[LegacyMessage], codec: Codec = Codec.UNCOMPRESSED,
                       *, magic: int = 1, timestamp: int = NO_TIMESTAMP) -> bytes:
    """A message set as a pre-0.11 client writes it: each message at offsets 0..n-1,
    or with ``codec`` one wrapper message (of ``magic``, with ``timestamp``) around
    them all."""
    inner = b"".join(_ENTRY.pack(i, len(raw)) + raw
                     for i, raw in enumerate(_message(m) for m in msgs))
    if codec is Codec.UNCOMPRESSED:
        return inner
    wrapper = _message(LegacyMessage(None, compress(codec, inner), timestamp, magic),
                       attributes=int(codec))
    return _ENTRY.pack(len(msgs) - 1, len(wrapper)) + wrapper
