"""Ledger storage's on-disk layouts, each declared once (construct), and the ``struct``
codecs the hot paths use, derived from those declarations at import.

The journal's layouts live beside its codec in ``journal_format.py``; the wire's
entry header (which every stored entry begins with) in ``wire/layouts.py``, read on
this side through ``wire.entry.entry_ids``/``entry_lac``. Everything here is
big-endian; a CRC32C is ``crc32c`` below (the one adapter over google-crc32c).
construct parses far slower than ``struct``, so the declarations are the reference
(tests build and parse them) and ``fast_struct`` compiles each fixed run of fields
into the ``struct.Struct`` the code uses: there is no second hand-written layout.
"""

from __future__ import annotations

import struct
from typing import Any

import construct
import google_crc32c
from construct import Bytes, Const, Int8ub, Int16ub, Int32ub, Int64sb, Int64ub, Padding, Struct

__all__ = [
    "CRC",
    "DB_LEDGER_KEY",
    "DB_LOCATION",
    "DB_LOCATION_KEY",
    "ENTRY_LOG_HEADER",
    "ENTRY_LOG_HEADER_SIZE",
    "ENTRY_LOG_MAGIC",
    "ENTRY_RECORD_PREFIX",
    "INDEX_HEADER",
    "INDEX_HEADER_SIZE",
    "INDEX_LOCATION",
    "INDEX_MAGIC",
    "LAST_MARK",
    "LAST_MARK_MAGIC",
    "LEDGERS_MAP_HEAD",
    "LEDGERS_MAP_ITEM",
    "LEDGERS_MAP_ITEM_V1",
    "crc32c",
    "crc32c_extend",
    "fast_struct",
    "locations_struct",
]

crc32c = google_crc32c.value  # CRC32C of bytes, as an int (hardware-accelerated)
crc32c_extend = google_crc32c.extend  # CRC32C of more bytes, continuing a CRC
CRC = struct.Struct(Int32ub.fmtstr)  # a CRC32C (uint32) as stored after the bytes it covers


def fast_struct(layout: Any, *, stop: str | None = None) -> struct.Struct:
    """The ``struct.Struct`` of ``layout``'s fields up to (not including) the field
    named ``stop``, or up to its trailing Padding: fixed-size integers, fixed byte
    strings and byte constants only (TypeError on anything else)."""
    fmt = ">"
    for sub in layout.subcons:
        if stop is not None and sub.name == stop:
            break
        inner = sub.subcon if isinstance(sub, construct.Renamed) else sub
        if isinstance(inner, construct.Padded):
            break
        if isinstance(inner, construct.Const) and isinstance(inner.value, bytes):
            fmt += f"{len(inner.value)}s"
        elif isinstance(inner, construct.FormatField) and inner.fmtstr[0] == ">":
            fmt += inner.fmtstr[1:]
        elif isinstance(inner, construct.Bytes) and isinstance(inner.length, int):
            fmt += f"{inner.length}s"
        else:
            raise TypeError(f"field {sub.name} ({inner!r}) has no fixed big-endian format")
    return struct.Struct(fmt)


def locations_struct(n: int) -> struct.Struct:
    """``n`` consecutive INDEX_LOCATION values (an index page, or a run of it)."""
    return struct.Struct(">" + INDEX_LOCATION.fmtstr[1:] * n)


# ---------------------------------------------------------------------------------------
# Entry log ``<ledger_dir>/current/<hex id>.log``, header (1024 bytes):
#
#  0      4         6        8         16                    24              28       32
#  +------+---------+--------+---------+---------------------+---------------+--------+--
#  | LDEL | version | flags  | log_id  | ledgers_map_offset  | ledgers_count | crc32c | 0..
#  | 4 B  | uint16  | uint16 | uint64  | uint64 (0: none yet)| uint32        | of 0..28
ENTRY_LOG_HEADER_SIZE = 1024
ENTRY_LOG_MAGIC = b"LDEL"
ENTRY_LOG_HEADER = Struct(
    "magic" / Const(ENTRY_LOG_MAGIC),
    "version" / Int16ub,
    "flags" / Int16ub,
    "log_id" / Int64ub,
    "ledgers_map_offset" / Int64ub,
    "ledgers_count" / Int32ub,
    "crc" / Int32ub,
    Padding(ENTRY_LOG_HEADER_SIZE - 32),
)
assert ENTRY_LOG_HEADER.sizeof() == ENTRY_LOG_HEADER_SIZE

# Each record, from offset 1024 on (an entry's location is log_id << 32 | this offset):
#
#  0        4          8
#  +--------+----------+--------------------------------------------------------
#  | size   | crc32c   | entry bytes (the wire's ENTRY_HEADER first: ledger_id, entry_id..)
#  | uint32 | of entry |
ENTRY_RECORD_PREFIX = Struct("size" / Int32ub, "crc" / Int32ub)

# The ledgers map, written as one record when the log rolls; its entry bytes:
#
#  0            8                 16       20
#  +------------+-----------------+--------+---------------------------------------
#  | ledger_id  | version         | count  | LEDGERS_MAP_ITEM * count
#  | int64 (-1) | int64 (-3; -2)  | uint32 |
#
# Version -3 items are (ledger_id, bytes, last entry id in this log); the first version
# (-2, still read) had no last entry id.
LEDGERS_MAP_HEAD = Struct("ledger_id" / Int64sb, "version" / Int64sb, "count" / Int32ub)
LEDGERS_MAP_ITEM = Struct("ledger_id" / Int64sb, "bytes" / Int64sb, "last_entry_id" / Int64sb)
LEDGERS_MAP_ITEM_V1 = Struct("ledger_id" / Int64sb, "bytes" / Int64sb)
assert LEDGERS_MAP_HEAD.sizeof() == 20

# ---------------------------------------------------------------------------------------
# Index file ``<index_dir>/current/<hh>/<hh>/<hex id>.idx``, header (1024 bytes):
#
#  0      4         6       8          16     24     25       45     47        111      115
#  +------+---------+-------+----------+------+------+--------+------+---------+--------+--
#  | LDIX | version | state | ledger_id| term | klen | key[20]| llen | lac[64] | crc32c | 0..
#  | 4 B  | uint16  | uint16| int64    | int64| uint8|        |uint16|         | of 0..111
#
# state bit 0: fenced. The body: entry e's location (INDEX_LOCATION) at 1024 + 8 * e.
# The db engine stores the same header (its first 115 bytes) per ledger in LMDB.
INDEX_HEADER_SIZE = 1024
INDEX_MAGIC = b"LDIX"
INDEX_HEADER = Struct(
    "magic" / Const(INDEX_MAGIC),
    "version" / Int16ub,
    "state" / Int16ub,
    "ledger_id" / Int64sb,
    "term" / Int64sb,
    "key_length" / Int8ub,
    "key" / Bytes(20),
    "lac_length" / Int16ub,
    "lac" / Bytes(64),
    "crc" / Int32ub,
    Padding(INDEX_HEADER_SIZE - 115),
)
assert INDEX_HEADER.sizeof() == INDEX_HEADER_SIZE

# A location: log_id << 32 | offset of the entry's record in that log; 0 = absent.
INDEX_LOCATION = Int64sb

# ---------------------------------------------------------------------------------------
# The db engine's LMDB records: locations keyed by (ledger_id, entry_id), and each
# ledger's header (INDEX_HEADER's first 115 bytes) keyed by its ledger_id.
#
#  location key  0          8          16      value  0          8
#                +----------+----------+              +----------+
#                | ledger_id| entry_id |              | location |
#                | int64    | int64    |              | int64    |
DB_LOCATION_KEY = Struct("ledger_id" / Int64sb, "entry_id" / Int64sb)
DB_LEDGER_KEY = Struct("ledger_id" / Int64sb)
DB_LOCATION = Struct("location" / INDEX_LOCATION)

# ---------------------------------------------------------------------------------------
# ``<ledger_dir>/current/lastMark`` (24 bytes), the journal position storage is
# flushed to:
#
#  0      4          12         20       24
#  +------+----------+----------+--------+
#  | LDLM | file_id  | offset   | crc32c |
#  | 4 B  | uint64   | uint64   | of 0..20
LAST_MARK_MAGIC = b"LDLM"
LAST_MARK = Struct(
    "magic" / Const(LAST_MARK_MAGIC),
    "file_id" / Int64ub,
    "offset" / Int64ub,
    "crc" / Int32ub,
)
assert LAST_MARK.sizeof() == 24
