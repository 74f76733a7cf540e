"""Every byte layout of the protocol, declared once with construct.

These declarations are the specification: :mod:`wire.codec` derives the fast
``struct.Struct`` codecs from them, :mod:`wire.docs` renders docs/protocol.md from them,
and the inspection tools parse with them. All integers are big-endian. Byte strings are
length-prefixed; arrays are count-prefixed. Every body ends with ``Terminated`` so a
frame with bytes left over is malformed rather than silently accepted.

Field names are the attribute names of the message dataclasses in :mod:`wire.messages`.
"""

from __future__ import annotations

from construct import (
    Bytes,
    GreedyBytes,
    Int8ub,
    Int16sb,
    Int16ub,
    Int32sb,
    Int32ub,
    Int64sb,
    Prefixed,
    PrefixedArray,
    Struct,
    Terminated,
)

__all__ = [
    "ADD_REQUEST",
    "ADD_RESPONSE",
    "ADMIN_STATUS_REQUEST",
    "ADMIN_STATUS_RESPONSE",
    "ADMIN_TRIGGER_REQUEST",
    "ADMIN_TRIGGER_RESPONSE",
    "API_VERSIONS_REQUEST",
    "API_VERSIONS_RESPONSE",
    "AUTH_REQUEST",
    "AUTH_RESPONSE",
    "ENTRY_HEADER",
    "FORCE_LEDGER_REQUEST",
    "FORCE_LEDGER_RESPONSE",
    "GET_BOOKIE_INFO_REQUEST",
    "GET_BOOKIE_INFO_RESPONSE",
    "LEDGER_HOLDINGS_REQUEST",
    "LEDGER_HOLDINGS_RESPONSE",
    "MASTER_KEY_SIZE",
    "READ_LAC_REQUEST",
    "READ_LAC_RESPONSE",
    "READ_RANGE_REQUEST",
    "READ_RANGE_RESPONSE",
    "READ_REQUEST",
    "READ_RESPONSE",
    "READ_STRIDE_REQUEST",
    "READ_STRIDE_RESPONSE",
    "REQUEST_HEADER",
    "RESPONSE_HEADER",
    "START_TLS_REQUEST",
    "START_TLS_RESPONSE",
    "WRITE_LAC_REQUEST",
    "WRITE_LAC_RESPONSE",
]

MASTER_KEY_SIZE = 20

# A byte string: int32 length, then that many bytes.
Blob = Prefixed(Int32ub, GreedyBytes)
# A short byte string: int16 length, then that many bytes (names, secrets, versions).
ShortBlob = Prefixed(Int16ub, GreedyBytes)
# A list of byte strings: int32 count, then each as a Blob.
BlobArray = PrefixedArray(Int32ub, Blob)

# ---------------------------------------------------------------------------------------
# Frame headers. `size` counts the bytes after itself.
#
#  request   0        4          6              8                 12
#            +--------+----------+--------------+-----------------+------ ...
#            | size   | api_key  | api_version  | correlation_id  | body
#            | int32  | int16    | int16        | int32           |
#
#  response  0        4                  8          10
#            +--------+------------------+----------+------ ...
#            | size   | correlation_id   | status   | body
#            | int32  | int32            | int16    |
REQUEST_HEADER = Struct(
    "size" / Int32sb,
    "api_key" / Int16sb,
    "api_version" / Int16sb,
    "correlation_id" / Int32sb,
)
RESPONSE_HEADER = Struct(
    "size" / Int32sb,
    "correlation_id" / Int32sb,
    "status" / Int16sb,
)
assert REQUEST_HEADER.sizeof() == 12
assert RESPONSE_HEADER.sizeof() == 10

# ---------------------------------------------------------------------------------------
# Entry bytes, as stored by bookies and carried in Add and Read bodies:
#
#  0            8            16           24           32
#  +------------+------------+------------+------------+-----------+---------- ...
#  | ledger_id  | entry_id   | lac        | length     | digest    | payload
#  | int64      | int64      | int64      | int64      | 0/4/8/20  |
#
# `lac` is the writer's last add confirmed when it sent the entry; `length` is the
# ledger's cumulative length including this entry. The digest (CRC32C 4 bytes, CRC32 8,
# HMAC-SHA1 20, DUMMY 0) covers the 32 header bytes followed by the payload.
ENTRY_HEADER = Struct(
    "ledger_id" / Int64sb,
    "entry_id" / Int64sb,
    "lac" / Int64sb,
    "length" / Int64sb,
)
assert ENTRY_HEADER.sizeof() == 32

# ---------------------------------------------------------------------------------------
# ApiVersions (key 0). Request body is empty.
#
#  response  0        4          6          8          10
#            +--------+----------+----------+----------+ ... repeated `count` times
#            | count  | api_key  | min_ver  | max_ver  |
#            | int32  | int16    | int16    | int16    |
API_VERSIONS_REQUEST = Struct(Terminated)
API_VERSIONS_RESPONSE = Struct(
    "versions" / PrefixedArray(
        Int32ub,
        Struct("api_key" / Int16sb, "min_version" / Int16sb, "max_version" / Int16sb),
    ),
    Terminated,
)

# ---------------------------------------------------------------------------------------
# Add (key 1): one or more entries of one ledger, consecutive unless SPARSE.
#
#  request   0           8                16      18            38      46
#            +-----------+----------------+-------+-------------+-------+-------+-----------------
#            | ledger_id | first_entry_id | flags | master_key  | term  | count | (len int32 | entry
#            | int64     | int64          | int16 | 20 bytes    | int64 | int32 |  bytes) * count
#
#  flags: RECOVERY_ADD=1, HIGH_PRIORITY=2, TRUNCATE=4 (unbounded-ledger no-op entry),
#  SPARSE=8 (version 1).
#  Entry i has entry id first_entry_id + i; each is the full entry bytes (see ENTRY_HEADER).
#  With SPARSE, the ids are the entries' own (their headers), strictly ascending from
#  first_entry_id with gaps allowed: a striped ledger's entries for one bookie (E3/Qw2:
#  runs of two, every third entry skipped) go in one request instead of one per run.
#
#  response  0           8                16
#            +-----------+----------------+--------+
#            | ledger_id | first_entry_id | count  |
#            | int64     | int64          | int32  |
ADD_REQUEST = Struct(
    "ledger_id" / Int64sb,
    "first_entry_id" / Int64sb,
    "flags" / Int16ub,
    "master_key" / Bytes(MASTER_KEY_SIZE),
    "term" / Int64sb,
    "entries" / BlobArray,
    Terminated,
)
ADD_RESPONSE = Struct(
    "ledger_id" / Int64sb,
    "first_entry_id" / Int64sb,
    "count" / Int32sb,
    Terminated,
)

# ---------------------------------------------------------------------------------------
# Read (key 2): one entry; entry_id -1 asks for the last entry the bookie holds.
#
#  request   0           8          16      18           38      46             54
#            +-----------+----------+-------+------------+-------+--------------+------------+
#            | ledger_id | entry_id | flags | master_key | term  | previous_lac | timeout_ms |
#            | int64     | int64    | int16 | 20 bytes   | int64 | int64        | int32      |
#
#  flags: FENCE=1 (master_key required), PIGGYBACK=2, HIGH_PRIORITY=4. A timeout_ms > 0
#  makes it a long poll: answer once the bookie's LAC passes previous_lac or on timeout.
#
#  response  0           8          16        24      28
#            +-----------+----------+---------+-------+-------------
#            | ledger_id | entry_id | max_lac | len   | entry bytes (len may be 0)
#            | int64     | int64    | int64   | int32 |
READ_REQUEST = Struct(
    "ledger_id" / Int64sb,
    "entry_id" / Int64sb,
    "flags" / Int16ub,
    "master_key" / Bytes(MASTER_KEY_SIZE),
    "term" / Int64sb,
    "previous_lac" / Int64sb,
    "timeout_ms" / Int32sb,
    Terminated,
)
READ_RESPONSE = Struct(
    "ledger_id" / Int64sb,
    "entry_id" / Int64sb,
    "max_lac" / Int64sb,
    "entry" / Blob,
    Terminated,
)

# ---------------------------------------------------------------------------------------
# ReadRange (key 3): consecutive entries from first_entry_id, stopping at max_count
# entries, at max_bytes of entry bytes (at least one entry is always returned), or at
# the first entry the bookie does not hold.
#
#  request   0           8                16          20          24      26           46
#            +-----------+----------------+-----------+-----------+-------+------------+-------+
#            | ledger_id | first_entry_id | max_count | max_bytes | flags | master_key | term  |
#            | int64     | int64          | int32     | int32     | int16 | 20 bytes   | int64 |
#
#  response  0           8                16        24      28
#            +-----------+----------------+---------+-------+---------------------------
#            | ledger_id | first_entry_id | max_lac | count | (len int32 | entry) * count
READ_RANGE_REQUEST = Struct(
    "ledger_id" / Int64sb,
    "first_entry_id" / Int64sb,
    "max_count" / Int32sb,
    "max_bytes" / Int32sb,
    "flags" / Int16ub,
    "master_key" / Bytes(MASTER_KEY_SIZE),
    "term" / Int64sb,
    Terminated,
)
READ_RANGE_RESPONSE = Struct(
    "ledger_id" / Int64sb,
    "first_entry_id" / Int64sb,
    "max_lac" / Int64sb,
    "entries" / BlobArray,
    Terminated,
)

# ---------------------------------------------------------------------------------------
# ReadStride (key 10): every ``stride``-th entry from first_entry_id (first, first +
# stride, ...), stopping at max_count entries, at max_bytes of entry bytes (at least one
# entry is always returned), or at the first such entry the bookie does not hold. With a
# striped ledger (Qw < E) a bookie stores runs of only Qw consecutive entries, so a
# reader asks each bookie of the ensemble for the entries it holds first in their write
# set, one request per bookie, instead of one ReadRange per run. The response is laid
# out as ReadRange's; its entries are first_entry_id + i * stride.
#
#  request   0           8                16       20          24          28      30           50
#            +-----------+----------------+--------+-----------+-----------+-------+------------+-------+
#            | ledger_id | first_entry_id | stride | max_count | max_bytes | flags | master_key | term  |
#            | int64     | int64          | int32  | int32     | int32     | int16 | 20 bytes   | int64 |
READ_STRIDE_REQUEST = Struct(
    "ledger_id" / Int64sb,
    "first_entry_id" / Int64sb,
    "stride" / Int32sb,
    "max_count" / Int32sb,
    "max_bytes" / Int32sb,
    "flags" / Int16ub,
    "master_key" / Bytes(MASTER_KEY_SIZE),
    "term" / Int64sb,
    Terminated,
)
READ_STRIDE_RESPONSE = READ_RANGE_RESPONSE

# ---------------------------------------------------------------------------------------
# ReadLac (key 4).
#
#  request   0           8
#            +-----------+
#            | ledger_id |
#
#  response  0           8       12
#            +-----------+-------+--------------+-------+------------
#            | ledger_id | len   | explicit_lac | len   | last_entry
#            | int64     | int32 | bytes        | int32 | bytes
#  explicit_lac is the last WriteLac body (ledger_id int64 | lac int64 | digest), or empty.
READ_LAC_REQUEST = Struct("ledger_id" / Int64sb, Terminated)
READ_LAC_RESPONSE = Struct(
    "ledger_id" / Int64sb,
    "explicit_lac" / Blob,
    "last_entry" / Blob,
    Terminated,
)

# ---------------------------------------------------------------------------------------
# WriteLac (key 5): an explicit LAC, written by an idle writer.
#
#  request   0           8       16           36      44
#            +-----------+-------+------------+-------+-------+----------
#            | ledger_id | lac   | master_key | term  | len   | lac_body
#            | int64     | int64 | 20 bytes   | int64 | int32 | bytes
#
#  response  0           8
#            +-----------+
#            | ledger_id |
WRITE_LAC_REQUEST = Struct(
    "ledger_id" / Int64sb,
    "lac" / Int64sb,
    "master_key" / Bytes(MASTER_KEY_SIZE),
    "term" / Int64sb,
    "lac_body" / Blob,
    Terminated,
)
WRITE_LAC_RESPONSE = Struct("ledger_id" / Int64sb, Terminated)

# ---------------------------------------------------------------------------------------
# ForceLedger (key 6): a journal barrier; answers once everything before it is durable.
#
#  request   0           8
#            +-----------+------------+
#            | ledger_id | master_key |
#            | int64     | 20 bytes   |
#  response  | ledger_id int64 |
FORCE_LEDGER_REQUEST = Struct(
    "ledger_id" / Int64sb,
    "master_key" / Bytes(MASTER_KEY_SIZE),
    Terminated,
)
FORCE_LEDGER_RESPONSE = Struct("ledger_id" / Int64sb, Terminated)

# ---------------------------------------------------------------------------------------
# GetBookieInfo (key 7). Request body is empty.
#
#  response  0             8            16      17      19
#            +-------------+------------+-------+-------+---------
#            | total_bytes | free_bytes | state | len   | version
#            | int64       | int64      | int8  | int16 | utf-8
#  state: 0 writable, 1 read-only.
GET_BOOKIE_INFO_REQUEST = Struct(Terminated)
GET_BOOKIE_INFO_RESPONSE = Struct(
    "total_bytes" / Int64sb,
    "free_bytes" / Int64sb,
    "state" / Int8ub,
    "version" / ShortBlob,
    Terminated,
)

# ---------------------------------------------------------------------------------------
# AdminTrigger (key 8): start garbage collection or compaction now, or turn the bookie
# read-only (refusing new plain adds, registered under available/readonly: draining it
# before a decommission) or writable again. A bookie made read-only so stays so until
# WRITABLE or a restart. Accepted only from loopback or with the configured admin secret.
#
#  request   0      1       3
#            +------+-------+--------
#            | kind | len   | secret
#            | int8 | int16 | bytes
#  kind: 0 GC, 1 minor compaction, 2 major compaction, 3 read-only, 4 writable.
#  response  | started int8 |  (read-only / writable: 1 if the state changed)
ADMIN_TRIGGER_REQUEST = Struct("kind" / Int8ub, "secret" / ShortBlob, Terminated)
ADMIN_TRIGGER_RESPONSE = Struct("started" / Int8ub, Terminated)

# ---------------------------------------------------------------------------------------
# AdminStatus (key 9): the bookie's status as a JSON document.
#
#  request   | len int16 | secret bytes |
#  response  | len int32 | status_json bytes (utf-8 JSON object) |
ADMIN_STATUS_REQUEST = Struct("secret" / ShortBlob, Terminated)
ADMIN_STATUS_RESPONSE = Struct("status_json" / Blob, Terminated)

# ---------------------------------------------------------------------------------------
# StartTls (key 11): upgrade this connection to TLS, as BookKeeper's START_TLS does.
# The first request on a connection, or none at all. The bookie answers OK in clear (or
# BAD_REQUEST: no TLS configured there, or not the first request), and both sides then
# run the TLS handshake on the same socket; every later frame is inside TLS. A bookie
# with ``tls_required`` answers any other first request TLS_REQUIRED and closes.
#
#  request   (empty)
#  response  (empty)
START_TLS_REQUEST = Struct(Terminated)
START_TLS_RESPONSE = Struct(Terminated)

# ---------------------------------------------------------------------------------------
# Auth (key 12): prove who this connection is without a client certificate. Sent after
# START_TLS (a token in clear can be copied) and before anything else. mechanism
# "token": the bookie looks the token up (by SHA-256) in its principals_file; OK names
# the principal, UNAUTHORIZED means no such token. The connection then has that
# principal's roles.
#
#  request   | len int16 | mechanism (utf-8) | len int16 | token bytes |
#  response  | len int16 | principal (utf-8) |
AUTH_REQUEST = Struct("mechanism" / ShortBlob, "token" / ShortBlob, Terminated)
AUTH_RESPONSE = Struct("principal" / ShortBlob, Terminated)

# ---------------------------------------------------------------------------------------
# LedgerHoldings (key 13): what this bookie holds, per ledger, for rebuilding the cluster's
# metadata from the bookies (`ledgerd shell metadata rebuild`). An admin request, streamed
# in pages: the reply covers ledgers from first_ledger_id (and, in that first ledger,
# entry ids from first_entry_id) in increasing order, at most max_ledgers ledgers and
# max_ranges ranges (a bookie caps both); next_ledger_id / next_entry_id say where the
# next page starts, -1 when the listing is complete. A ledger cut by max_ranges appears
# again in the next page with the rest of its ranges.
#
#  request   0                 8                 16            20           24      26
#            +-----------------+-----------------+-------------+------------+-------+--------
#            | first_ledger_id | first_entry_id  | max_ledgers | max_ranges | len   | secret
#            | int64           | int64           | int32       | int32      | int16 | bytes
#
#  response  0                8                16      20 (count x 65 bytes)
#            +----------------+----------------+-------+-------------------------------------
#            | next_ledger_id | next_entry_id  | count | ledgers
#            | int64          | int64          | int32 |
#            ... | count int32 | ranges (count x 24 bytes) |
#
#  a ledger  0           8       9       17      25              33
#            +-----------+-------+-------+-------+---------------+------------+
#            | ledger_id | flags | term  | lac   | last_entry_id | key_check  |
#            | int64     | int8  | int64 | int64 | int64         | 32 bytes   |
#  flags: FENCED=1, HAS_KEY=2. key_check is SHA-256("ledgerd-password-check" + master
#  key), the ledger metadata's password_check (zeros without a key): the key itself
#  never leaves the bookie.
#
#  a range   0           8                16
#            +-----------+----------------+---------------+
#            | ledger_id | first_entry_id | last_entry_id |
#            | int64     | int64          | int64         |
#  Entry ids held, as inclusive ranges, in increasing order.
KEY_CHECK_SIZE = 32
LEDGER_HOLDINGS_REQUEST = Struct(
    "first_ledger_id" / Int64sb,
    "first_entry_id" / Int64sb,
    "max_ledgers" / Int32sb,
    "max_ranges" / Int32sb,
    "secret" / ShortBlob,
    Terminated,
)
LEDGER_HOLDINGS_RESPONSE = Struct(
    "next_ledger_id" / Int64sb,
    "next_entry_id" / Int64sb,
    "ledgers" / PrefixedArray(Int32ub, Struct(
        "ledger_id" / Int64sb,
        "flags" / Int8ub,
        "term" / Int64sb,
        "lac" / Int64sb,
        "last_entry_id" / Int64sb,
        "key_check" / Bytes(KEY_CHECK_SIZE),
    )),
    "ranges" / PrefixedArray(Int32ub, Struct(
        "ledger_id" / Int64sb,
        "first_entry_id" / Int64sb,
        "last_entry_id" / Int64sb,
    )),
    Terminated,
)
