"""The log header: entry 0 of every ledger a log writer creates names the log and the
ledger's place in it, so ``metadata rebuild`` can put logs back from the bookies alone.

Why entry 0 and not a bookie-side ledger header: an entry is stored, replicated and
re-replicated exactly like the data (Qw copies, copied by recovery and autorecovery,
listed by ``LedgerHoldings``, read by the plain read request), so it survives with
the ledger's entries and needs no new wire field, bookie index field or replication
step; the write protocol is unchanged. Its cost: the log's readers must skip it. A
ledger that starts with a header says so in its metadata (``HEADER_KEY`` in its custom
metadata; ``first_log_entry`` gives 1), so readers skip it without reading it, and a log
entry's offset is unchanged (the header is not counted).

The header, big-endian (the CRC32C covers every byte before it)::

    0          8         10     18          26          34    35  36  37       39
    +----------+---------+------+-----------+-----------+-----+---+---+--------+------ ...
    | magic    | version | seq  | prev      | first     | E   |Qw |Qa | name   | name
    | 8 bytes  | int16   |int64 | ledger id | offset    |int8 |   |   | length | (UTF-8)
    |          |         |      | int64 (-1)| int64 (-1)|     |   |   | int16  |
    +----------+---------+------+-----------+-----------+-----+---+---+--------+------ ...
    ... +--------+
        | crc32c |
        | int32  |

Version 2 (written since; version 1 is still read, as ``writers`` 0 and no extra) puts
two fields between the name and the CRC::

    ... name | writers | extra length | extra    | crc32c
             | int64   | int32        | (bytes)  | int32

``writers`` is the log record's ``writers`` count once this ledger is on the list (the
writer's term: a rebuilt log keeps counting from it, so a Kafka partition's leader epoch
never goes back; 0: not known); ``extra`` is what the log's writer asks to carry (at
most 64 KiB; the Kafka gateway puts its topic there, ``metadata.kafka_topics.TopicOrigin``,
so ``metadata rebuild`` can make the topic record again).

``seq`` is the ledger's position in the log counted from the log's creation (ledgers
truncated away still count: ``LogRecord.first_seq``), so the order is known even after
truncation; ``prev`` is the ledger listed before it when it was added (-1: the first),
which tells apart two ledgers of the same ``seq`` (a writer that crashed after writing
the header but before its compare-and-set left an orphan); ``first offset`` is the log
offset of the ledger's first log entry (-1: not known when it was created), from which
a rebuilt log gets its ``base`` (the truncation point) back; E, Qw, Qa are the
ledger's quorums (bookies cannot say Qa).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import google_crc32c
from construct import (
    Bytes,
    Const,
    ConstructError,
    Int8ub,
    Int16ub,
    Int32ub,
    Int64sb,
    Struct,
    Terminated,
    this,
)

from ledgerd.base.errors import LedgerdError

__all__ = ["HEADER_KEY", "LOG_HEADER", "LOG_HEADER_FIXED", "LOG_HEADER_V2", "MAGIC", "MAX_EXTRA",
           "CorruptLogHeaderError", "LogHeader", "decode_log_header", "encode_log_header",
           "first_log_entry", "payload_of_entry"]

MAGIC = b"\x89LDGLOG\n"  # a non-ASCII first byte and a newline, as PNG's magic does
VERSION = 2  # the version written; 1 (no writers, no extra) is still read
HEADER_KEY = "ledgerd.log-header"  # custom metadata of a ledger whose entry 0 is a header
_MAX_NAME = 200  # a log name's limit (``metadata.logs``)
MAX_EXTRA = 64 << 10  # the extra field's limit (a writer's own data, e.g. a Kafka topic)

LOG_HEADER_FIXED = Struct(
    "magic" / Const(MAGIC),
    "version" / Int16ub,
    "seq" / Int64sb,
    "prev_ledger_id" / Int64sb,
    "first_offset" / Int64sb,
    "ensemble_size" / Int8ub,
    "write_quorum" / Int8ub,
    "ack_quorum" / Int8ub,
    "name_length" / Int16ub,
)
assert LOG_HEADER_FIXED.sizeof() == 39
LOG_HEADER = Struct(  # version 1
    *LOG_HEADER_FIXED.subcons,
    "name" / Bytes(this.name_length),
    "crc32c" / Int32ub,
    Terminated,
)
LOG_HEADER_V2 = Struct(
    *LOG_HEADER_FIXED.subcons,
    "name" / Bytes(this.name_length),
    "writers" / Int64sb,
    "extra_length" / Int32ub,
    "extra" / Bytes(this.extra_length),
    "crc32c" / Int32ub,
    Terminated,
)
_CRC = 4
MIN_SIZE = LOG_HEADER_FIXED.sizeof() + _CRC
_ENTRY_HEADER = 32  # ledger id, entry id, LAC, length (``wire.layouts.ENTRY_HEADER``)
_DIGEST_SIZES = {"crc32c": 4, "crc32": 8, "hmac": 20, "dummy": 0}


class CorruptLogHeaderError(LedgerdError, ValueError):
    """Bytes that start with the header's magic but are not a valid header."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogHeader:
    name: str
    seq: int
    prev_ledger_id: int = -1
    first_offset: int = -1
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    writers: int = 0  # the log record's writers count with this ledger on it (0: unknown)
    extra: bytes = b""  # what the log's writer asked to carry (version 2)

    def __post_init__(self) -> None:
        if not 0 < len(self.name.encode()) <= _MAX_NAME:
            raise ValueError(f"log name {self.name!r}: 1 to {_MAX_NAME} bytes")
        if self.seq < 0 or self.prev_ledger_id < -1 or self.first_offset < -1:
            raise ValueError(f"seq {self.seq}, prev {self.prev_ledger_id}, first offset "
                             f"{self.first_offset}: out of range")
        if not 255 >= self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ValueError(f"quorums E={self.ensemble_size} Qw={self.write_quorum} "
                             f"Qa={self.ack_quorum} invalid")
        if self.writers < 0 or len(self.extra) > MAX_EXTRA:
            raise ValueError(f"writers {self.writers} below 0 or extra of {len(self.extra)} "
                             f"bytes over {MAX_EXTRA}")


def encode_log_header(header: LogHeader) -> bytes:
    name = header.name.encode()
    body: bytes = LOG_HEADER_V2.build({
        "version": VERSION, "seq": header.seq, "prev_ledger_id": header.prev_ledger_id,
        "first_offset": header.first_offset, "ensemble_size": header.ensemble_size,
        "write_quorum": header.write_quorum, "ack_quorum": header.ack_quorum,
        "name_length": len(name), "name": name, "writers": header.writers,
        "extra_length": len(header.extra), "extra": header.extra, "crc32c": 0})
    crc = int(google_crc32c.value(body[:-_CRC]))
    return body[:-_CRC] + crc.to_bytes(_CRC, "big")


def decode_log_header(payload: bytes) -> LogHeader | None:
    """The header ``payload`` holds; None if it is not one (no magic: a log entry of a
    log written before headers, or not a log's ledger). Raises CorruptLogHeaderError if
    it starts with the magic but fails its CRC or layout."""
    if not payload.startswith(MAGIC):
        return None
    if len(payload) < MIN_SIZE or google_crc32c.value(payload[:-_CRC]) != int.from_bytes(
            payload[-_CRC:], "big"):
        raise CorruptLogHeaderError("log header: CRC32C mismatch or truncated")
    version = int.from_bytes(payload[len(MAGIC):len(MAGIC) + 2], "big")
    layout = {1: LOG_HEADER, 2: LOG_HEADER_V2}.get(version)
    if layout is None:
        raise CorruptLogHeaderError(f"log header version {version} (this build reads 1 to "
                                    f"{VERSION})")
    try:
        doc = layout.parse(payload)
    except ConstructError as exc:
        raise CorruptLogHeaderError(f"log header: {exc}") from exc
    try:
        return LogHeader(name=doc.name.decode(), seq=doc.seq, prev_ledger_id=doc.prev_ledger_id,
                         first_offset=doc.first_offset, ensemble_size=doc.ensemble_size,
                         write_quorum=doc.write_quorum, ack_quorum=doc.ack_quorum,
                         writers=doc.get("writers", 0), extra=bytes(doc.get("extra", b"")))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptLogHeaderError(f"log header: {exc}") from exc


def payload_of_entry(entry: bytes, digest_type: str) -> bytes:
    """An entry's payload as stored on a bookie (entry header, digest, payload)."""
    return entry[_ENTRY_HEADER + _DIGEST_SIZES.get(digest_type, 4):]


def first_log_entry(custom_metadata: Mapping[str, str]) -> int:
    """The entry id of a ledger's first log entry: 1 when entry 0 is a log header."""
    return 1 if custom_metadata.get(HEADER_KEY) == "1" else 0
