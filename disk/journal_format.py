"""The journal's on-disk format: file header and records (pure, no I/O).

File ``<journal_dir>/current/<hex id>.txn``::

    header, 4096 bytes:
      0      4        6        8          16         20
      +------+--------+--------+----------+----------+---------- ... zeros to 4096
      | LDJN | version| flags  | file_id  | crc32c   |
      | 4 B  | uint16 | uint16 | uint64   | of 0..16 |

    records from offset 4096, each group padded to the alignment:
      0         4          8      9
      +---------+----------+------+------------------
      | length  | crc32c   | type | body (length - 1 bytes)
      | uint32  | uint32   | uint8|

``length`` counts type + body. The CRC32C covers the file id (8 bytes, big-endian),
then ``length``, ``type`` and ``body``: salting with the file id means a record left in
a reused segment by an earlier incarnation can never pass as a current one.

Groups. A group is written at an aligned offset and takes ``group_size(total,
alignment)`` bytes: its records, then one PADDING record that fills the rest. When the
records leave fewer than ``PREFIX_SIZE`` (9) bytes before the aligned end, too few for a
PADDING record's prefix, the group takes one more aligned block and the PADDING record
fills the gap and that block. So every byte of a group is a record and the next group
starts exactly where the PADDING record ends: a reader never has to know where a group
ends to parse it. A ``length`` of zero at a ``SECTOR`` (512-byte) boundary is the
pre-zeroed tail: end of data.

Journals written before this rule (format version 1 too) may hold a *legacy gap*: 1 to
8 zero bytes at a group's end instead of a PADDING record, running up to an aligned
(hence sector-aligned) offset. ``legacy_gap`` recognises one where no valid record starts;
readers skip it and go on at the boundary.

Record bodies (all ids int64): ENTRY ``ledger_id | entry_id | entry bytes``;
MASTER_KEY ``ledger_id | key[20]``; FENCE ``ledger_id``; EXPLICIT_LAC ``ledger_id |
lac body``; TERM ``ledger_id | term``; TRUNCATE ``ledger_id | last_kept_entry_id``;
PADDING: zeros, skipped.
"""

from __future__ import annotations

import enum
import mmap
import struct
from dataclasses import dataclass

from construct import Const, Int8ub, Int16ub, Int32ub, Int64ub, Padding, Struct

from ledgerd.disk.layouts import crc32c, crc32c_extend

__all__ = [
    "HEADER_SIZE",
    "JOURNAL_HEADER",
    "MAX_RECORD",
    "PREFIX",
    "PREFIX_SIZE",
    "RECORD_PREFIX",
    "SECTOR",
    "Record",
    "RecordType",
    "decode_header",
    "encode_group",
    "encode_header",
    "encode_record",
    "group_size",
    "legacy_gap",
    "padding_record",
    "record_crc",
]

HEADER_SIZE = 4096
MAGIC = b"LDJN"
FORMAT_VERSION = 1
MAX_RECORD = 64 * 1024 * 1024  # larger lengths are junk, never a real record

JOURNAL_HEADER = Struct(
    "magic" / Const(MAGIC),
    "version" / Int16ub,
    "flags" / Int16ub,
    "file_id" / Int64ub,
    "crc" / Int32ub,
    Padding(HEADER_SIZE - 20),
)
assert JOURNAL_HEADER.sizeof() == HEADER_SIZE

RECORD_PREFIX = Struct("length" / Int32ub, "crc" / Int32ub, "type" / Int8ub)
PREFIX_SIZE = RECORD_PREFIX.sizeof()
# The hot path's codec for RECORD_PREFIX (construct parses ~50x slower); a test proves
# both give the same bytes. Writer and scanner both use this one.
PREFIX = struct.Struct(">IIB")
SECTOR = 512  # the smallest journal_alignment_size: every group starts on a sector
_HEAD = struct.Struct(">4sHHQ")
_LEN = struct.Struct(">I")
_ID = struct.Struct(">Q")
_SALT = struct.Struct(">QIB").pack
_Q = struct.Struct(">q")
_QQ = struct.Struct(">qq")
assert PREFIX.size == RECORD_PREFIX.sizeof()


class RecordType(enum.IntEnum):
    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    EXPLICIT_LAC = 4
    TERM = 5
    TRUNCATE = 6
    PADDING = 7


def encode_header(file_id: int) -> bytes:
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, 0, file_id)
    return head + struct.pack(">I", crc32c(head)) + bytes(HEADER_SIZE - 20)


def decode_header(data: bytes) -> int:
    """The file id from a header; raises ValueError if it is not a valid journal header."""
    if len(data) < 20:
        raise ValueError(f"header is {len(data)} bytes, shorter than 20")
    magic, version, _flags, file_id = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise ValueError(f"bad magic {magic!r} (not a ledgerd journal)")
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported journal version {version}")
    (crc,) = struct.unpack_from(">I", data, 16)
    if crc != crc32c(data[:16]):
        raise ValueError("header checksum mismatch")
    return int(file_id)


def record_crc(file_id: int, length: int, rtype: int, body: bytes | memoryview) -> int:
    crc = crc32c(_SALT(file_id, length, rtype))
    return int(crc32c_extend(crc, bytes(body)))


def record_prefix(file_id: int, rtype: int, body: bytes) -> bytes:
    """The 9 bytes before ``body``: length, salted CRC32C, type."""
    length = len(body) + 1
    crc = crc32c(_SALT(file_id, length, rtype))
    return PREFIX.pack(length, crc32c_extend(crc, body), rtype)


def encode_records(file_id: int, records: list[tuple[int, bytes]]) -> bytes:
    """Many records back to back: one join instead of a slice assignment per record."""
    parts: list[bytes] = []
    append = parts.append
    value, extend, salt, pack = crc32c, crc32c_extend, _SALT, PREFIX.pack
    for rtype, body in records:
        length = len(body) + 1
        append(pack(length, extend(value(salt(file_id, length, rtype)), body), rtype))
        append(body)
    return b"".join(parts)


def encode_record(file_id: int, rtype: int, body: bytes) -> bytes:
    return record_prefix(file_id, rtype, body) + body


def group_size(total: int, alignment: int) -> int:
    """Bytes a group of ``total`` record bytes takes on disk (see the module's Groups):
    rounded up to the alignment, plus one block when the gap left could not hold a
    PADDING record's prefix."""
    size = -(-total // alignment) * alignment
    if 0 < size - total < PREFIX_SIZE:
        size += alignment
    return size


def padding_record(file_id: int, size: int) -> bytes:
    """One PADDING record of exactly ``size`` bytes (``b""`` for 0)."""
    if size == 0:
        return b""
    if size < PREFIX_SIZE:
        raise ValueError(f"a PADDING record takes at least {PREFIX_SIZE} bytes, not {size}")
    return encode_record(file_id, RecordType.PADDING, bytes(size - PREFIX_SIZE))


def encode_group(file_id: int, records: list[tuple[int, bytes]], alignment: int) -> bytes:
    """A whole group as written: its records and the PADDING record that ends it."""
    data = encode_records(file_id, records)
    return data + padding_record(file_id, group_size(len(data), alignment) - len(data))


def legacy_gap(data: bytes | memoryview | mmap.mmap, pos: int) -> int:
    """The length of a legacy gap at ``pos`` (1-8 zero bytes up to a sector boundary),
    or 0 if there is none. Call it only where no valid record starts at ``pos``."""
    gap = -pos % SECTOR
    if 0 < gap < PREFIX_SIZE and pos + gap <= len(data) and not any(data[pos:pos + gap]):
        return gap
    return 0


def entry_body(ledger_id: int, entry_id: int, entry: bytes) -> bytes:
    return _QQ.pack(ledger_id, entry_id) + entry


def ledger_body(ledger_id: int, rest: bytes = b"") -> bytes:
    return _Q.pack(ledger_id) + rest


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded journal record."""

    file_id: int
    offset: int
    type: RecordType
    ledger_id: int
    value: int  # entry id (ENTRY, TRUNCATE), term (TERM), else 0
    payload: bytes  # entry bytes, key, lac body, else b""

    @classmethod
    def parse(cls, file_id: int, offset: int, rtype: int, body: bytes) -> Record:
        """Decode a body whose CRC already passed; ValueError on a malformed body."""
        t = RecordType(rtype)
        if t is RecordType.PADDING:
            return cls(file_id, offset, t, -1, 0, b"")
        if len(body) < 8:
            raise ValueError(f"{t.name} body of {len(body)} bytes has no ledger id")
        (ledger_id,) = _Q.unpack_from(body, 0)
        if t in (RecordType.ENTRY, RecordType.TRUNCATE, RecordType.TERM):
            if len(body) < 16:
                raise ValueError(f"{t.name} body of {len(body)} bytes is too short")
            (value,) = _Q.unpack_from(body, 8)
            return cls(file_id, offset, t, ledger_id, value, body[16:])
        if t is RecordType.MASTER_KEY and len(body) != 28:
            raise ValueError(f"MASTER_KEY body of {len(body)} bytes, expected 28")
        return cls(file_id, offset, t, ledger_id, 0, body[8:])
