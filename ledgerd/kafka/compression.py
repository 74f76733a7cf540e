"""Broker-side recompression: a topic's ``compression.type`` applied to produced batches.

Kafka's broker (``LogValidator``) rewrites a produced batch whose codec is not the
topic's ``compression.type`` (unless that is ``producer``): the records are read out and
written again with the topic's codec, in a batch that keeps the producer's header —
base offset, producer id and epoch, base sequence, timestamps, the transactional bit,
the partition leader epoch — with a new length and CRC. The gateway does the same, and
keeps each record byte for byte (their offset and timestamp deltas, keys, values and
headers do not depend on the codec), so only the records section is recompressed:

    header (61 bytes: attributes bits 0-2 = the new codec, batchLength and CRC new)
    | records, compressed as a whole with the new codec (or not: ``uncompressed``)

The codecs are written as Kafka's Java broker writes them, and read by every client:
gzip (RFC 1952), snappy in the xerial framing (magic, version 1, compatible 1, then
``[length i32][raw snappy block]`` per 32 KiB), lz4 (the LZ4 frame format, independent
64 KiB blocks, as ``KafkaLZ4BlockOutputStream``) and zstd (a zstd frame).

Pure: bytes in, bytes out (``recompress``). Reading a batch is bounded as in
``timestamps.py`` (``MAX_RECORDS_BYTES``).
"""

from __future__ import annotations

import enum
import gzip
import struct

import cramjam
import google_crc32c
import lz4.frame
import zstandard

from ledgerd.kafka.records import HEADER_SIZE, BatchError, BatchHeader, check_records
from ledgerd.kafka.timestamps import RecordsError, RecordsTooLargeError, records_of

__all__ = ["Codec", "compress", "recompress", "recompressed"]

_XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 << 10  # Java's SnappyOutputStream default block size


class Codec(enum.IntEnum):
    """A batch's attributes bits 0-2, named as ``compression.type`` names them."""

    UNCOMPRESSED = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def of_config(cls, value: str) -> Codec | None:
        """The codec a ``compression.type`` value asks for (None: ``producer``, keep
        the producer's)."""
        if value == "producer":
            return None
        return cls[value.upper()]


def compress(codec: Codec, data: bytes) -> bytes:
    """``data`` (a batch's records) compressed as Kafka's broker writes ``codec``."""
    if codec is Codec.UNCOMPRESSED:
        return data
    if codec is Codec.GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    if codec is Codec.SNAPPY:
        out = [_XERIAL_HEADER]
        for at in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[at:at + _XERIAL_BLOCK]))
            out += [struct.pack(">i", len(block)), block]
        return b"".join(out)
    if codec is Codec.LZ4:
        return bytes(lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                                        block_linked=False, content_checksum=False,
                                        store_size=False))
    return bytes(zstandard.ZstdCompressor(level=3).compress(data))


INLINE_CHECK_BYTES = 256 << 10  # uncompressed records walked on the event loop, at most


def check_batches(batches: list[tuple[BatchHeader, bytes]]) -> None:
    """The records of each batch of a produced request checked (``check_records``),
    compressed ones decompressed for it (at most ``MAX_RECORDS_BYTES``). In a worker
    thread when any is compressed or they pass ``INLINE_CHECK_BYTES`` (a 15 MiB request
    of tiny records held the event loop 1.5 s). Raises BatchError: CORRUPT_MESSAGE for
    records that cannot be read, INVALID_RECORD for a count or offset delta that does
    not match, MESSAGE_TOO_LARGE for records that expand past ``MAX_RECORDS_BYTES``."""
    for i, (h, raw) in enumerate(batches):
        if not h.attributes & 7:
            check_records(memoryview(raw)[HEADER_SIZE:h.length], h.record_count, i)
            continue
        try:
            records = records_of(h, memoryview(raw)[HEADER_SIZE:h.length])
        except RecordsTooLargeError as exc:  # not retriable, unlike CORRUPT_MESSAGE
            raise BatchError(10, f"batch {i}: its {h.codec} records are too large: "
                                 f"{exc}") from None
        except RecordsError as exc:
            raise BatchError(2, f"batch {i}: its {h.codec} records cannot be read: "
                                f"{exc}") from None
        check_records(records, h.record_count, i)


def recompress(batch: bytes, codec: Codec) -> bytes:
    """``batch`` with its records compressed with ``codec`` instead of the producer's
    (the batch itself when it already is), every header field kept but the codec bits,
    the length and the CRC-32C. Raises BatchError (CORRUPT_MESSAGE) if its records
    cannot be read."""
    h = BatchHeader.parse(batch)
    if h.attributes & 7 == codec:
        return batch
    try:
        records = bytes(records_of(h, memoryview(batch)[HEADER_SIZE:h.length]))
    except RecordsError as exc:
        raise BatchError(2, f"cannot recompress a {h.codec} batch: {exc}") from None
    body = compress(codec, records)
    head = bytearray(batch[:HEADER_SIZE])
    struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(body))
    struct.pack_into(">h", head, 21, (h.attributes & ~7) | codec)
    tail = bytes(head[21:]) + body
    struct.pack_into(">I", head, 17, google_crc32c.value(tail))
    return bytes(head[:21]) + tail


def recompressed(batches: list[tuple[BatchHeader, bytes]], codec: Codec,
                 max_batch_bytes: int) -> list[tuple[BatchHeader, bytes]]:
    """Each of a produced request's batches recompressed with ``codec`` (run in a
    worker thread: a batch may hold megabytes). Raises BatchError: CORRUPT_MESSAGE for
    records that cannot be read, MESSAGE_TOO_LARGE for a batch that grows past
    ``max_batch_bytes``, as Kafka checks the batch it writes."""
    out = []
    for h, raw in batches:
        new = recompress(raw, codec)
        if len(new) > max_batch_bytes:
            raise BatchError(10, f"the batch recompressed with {codec.name.lower()} is "
                                 f"{len(new)} bytes, over the {max_batch_bytes}-byte limit")
        out.append((h if new is raw else BatchHeader.parse(new), new))
    return out
