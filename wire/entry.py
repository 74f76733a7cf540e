"""Entry bytes and their digests: what a writer sends and a reader verifies.

An entry is ``ledger_id | entry_id | lac | length | digest | payload`` (see
``layouts.ENTRY_HEADER``). The digest covers the 32 header bytes followed by the payload:

- CRC32C: 4 bytes, hardware-accelerated (google-crc32c), the default;
- CRC32: ``zlib.crc32`` stored as an 8-byte long, as BookKeeper stores it;
- HMAC: HMAC-SHA1, 20 bytes, keyed with ``SHA1("mac" + password)``;
- DUMMY: no digest at all.

The master key sent with adds and fencing reads is ``SHA1("ledger" + password)``. Only
clients verify digests: a mismatch raises :class:`DigestMismatchError` naming the ledger,
entry and digest type, and the reader tries the next replica. Bookies only peek at the
header to learn the ids and the LAC.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import google_crc32c

from ledgerd.wire import layouts
from ledgerd.wire.errors import DigestMismatchError, EntryFormatError

__all__ = [
    "ENTRY_HEADER_SIZE",
    "DigestType",
    "Digester",
    "Entry",
    "EntryHeader",
    "decode_entry",
    "decode_lac_body",
    "encode_entries",
    "encode_entry",
    "encode_lac_body",
    "mac_key",
    "master_key",
    "peek_entry_header",
    "recovery_key",
]

# The entry header's struct, derived from its declaration (``layouts.ENTRY_HEADER``).
ENTRY_HEADER_STRUCT = struct.Struct(">" + "".join(
    sub.subcon.fmtstr.lstrip(">") for sub in layouts.ENTRY_HEADER.subcons))
_HEADER = ENTRY_HEADER_STRUCT
ENTRY_HEADER_SIZE = _HEADER.size
assert ENTRY_HEADER_SIZE == layouts.ENTRY_HEADER.sizeof() == 32
_LAC = struct.Struct(">qq")
_CRC32C = struct.Struct(">I")
_CRC32 = struct.Struct(">q")


class DigestType(enum.Enum):
    CRC32C = "crc32c"
    CRC32 = "crc32"
    HMAC = "hmac"
    DUMMY = "dummy"

    @property
    def size(self) -> int:
        return _SIZES[self]


_SIZES = {DigestType.CRC32C: 4, DigestType.CRC32: 8, DigestType.HMAC: 20, DigestType.DUMMY: 0}


def master_key(password: bytes) -> bytes:
    """The 20-byte key bookies bind to a ledger: SHA1("ledger" + password)."""
    return hashlib.sha1(b"ledger" + password).digest()


def recovery_key(cluster_secret: bytes, ledger_id: int) -> bytes:
    """The 20-byte recovery credential for one ledger: HMAC-SHA256 of the ledger id under
    the cluster secret, truncated to a master key's size.

    Bookies holding the same secret accept it in place of the ledger's master key for
    RECOVERY_ADDs and fencing reads only (``appliance.core``), so autorecovery can copy
    any ledger, old ones included, without its password; a plain add with it is refused.
    Without the secret it cannot be derived from anything in metadata.
    """
    return hmac.new(cluster_secret, b"ledgerd-recovery:" + ledger_id.to_bytes(8, "big"),
                    hashlib.sha256).digest()[:20]


def mac_key(password: bytes) -> bytes:
    """The HMAC-SHA1 key: SHA1("mac" + password)."""
    return hashlib.sha1(b"mac" + password).digest()


class Digester:
    """Computes and checks one ledger's digests."""

    __slots__ = ("_key", "digest_type", "size")

    def __init__(self, digest_type: DigestType, password: bytes = b"") -> None:
        self.digest_type = digest_type
        self.size = digest_type.size
        self._key = mac_key(password) if digest_type is DigestType.HMAC else b""

    def compute(self, *parts: bytes) -> bytes:
        """The digest of the concatenation of ``parts``."""
        t = self.digest_type
        if t is DigestType.CRC32C:
            crc = 0
            for p in parts:
                crc = google_crc32c.extend(crc, p)
            return _CRC32C.pack(crc)
        if t is DigestType.CRC32:
            c = 0
            for p in parts:
                c = zlib.crc32(p, c)
            return _CRC32.pack(c)
        if t is DigestType.HMAC:
            mac = hmac.new(self._key, digestmod=hashlib.sha1)
            for p in parts:
                mac.update(p)
            return mac.digest()
        return b""


@dataclass(frozen=True, slots=True)
class EntryHeader:
    ledger_id: int
    entry_id: int
    lac: int
    length: int


@dataclass(frozen=True, slots=True)
class Entry:
    """A verified entry."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes


def encode_entry(digester: Digester, ledger_id: int, entry_id: int, lac: int, length: int,
                 payload: bytes) -> bytes:
    """The entry's bytes as sent to bookies; ``length`` includes this entry's payload."""
    header = _HEADER.pack(ledger_id, entry_id, lac, length)
    return header + digester.compute(header, payload) + payload


def encode_entries(digester: Digester, ledger_id: int, first_entry_id: int, lac: int,
                   lengths: Sequence[int], payloads: Sequence[bytes]) -> list[bytes]:
    """``encode_entry`` for consecutive entries (``lengths``: each one's cumulative
    length), with the digest chosen once: the client's batched appends."""
    pack = _HEADER.pack
    out = []
    eid = first_entry_id
    if digester.digest_type is DigestType.CRC32C:
        extend = google_crc32c.extend
        crc_pack = _CRC32C.pack
        for length, payload in zip(lengths, payloads, strict=True):
            header = pack(ledger_id, eid, lac, length)
            out.append(b"".join((header, crc_pack(extend(extend(0, header), payload)),
                                 payload)))
            eid += 1
        return out
    compute = digester.compute
    for length, payload in zip(lengths, payloads, strict=True):
        header = pack(ledger_id, eid, lac, length)
        out.append(header + compute(header, payload) + payload)
        eid += 1
    return out


def peek_entry_header(data: bytes | memoryview) -> EntryHeader:
    """The header of entry bytes, without verifying anything (the bookie's view)."""
    if len(data) < ENTRY_HEADER_SIZE:
        raise EntryFormatError(f"entry of {len(data)} bytes is shorter than its "
                               f"{ENTRY_HEADER_SIZE}-byte header")
    return EntryHeader(*_HEADER.unpack_from(data, 0))


def decode_entry(digester: Digester, data: bytes, *, ledger_id: int | None = None,
                 entry_id: int | None = None) -> Entry:
    """Verify ``data`` and return the entry.

    Raises DigestMismatchError if the digest does not cover the bytes, EntryFormatError
    if the bytes are too short or carry other ids than expected.
    """
    minimum = ENTRY_HEADER_SIZE + digester.size
    if len(data) < minimum:
        raise EntryFormatError(
            f"entry of {len(data)} bytes is shorter than header + "
            f"{digester.digest_type.value} digest ({minimum})")
    lid, eid, lac, length = _HEADER.unpack_from(data, 0)
    data = bytes(data)
    payload = data[minimum:]
    if not hmac.compare_digest(digester.compute(data[:ENTRY_HEADER_SIZE], payload),
                               data[ENTRY_HEADER_SIZE:minimum]):
        raise DigestMismatchError(lid, eid, digester.digest_type.value)
    if ledger_id is not None and lid != ledger_id:
        raise EntryFormatError(f"entry carries ledger {lid}, expected {ledger_id}")
    if entry_id is not None and eid != entry_id:
        raise EntryFormatError(f"entry carries entry {eid}, expected {entry_id} (ledger {lid})")
    return Entry(lid, eid, lac, length, payload)


def encode_lac_body(digester: Digester, ledger_id: int, lac: int) -> bytes:
    """An explicit-LAC body: ``ledger_id | lac | digest`` over those 16 bytes."""
    body = _LAC.pack(ledger_id, lac)
    return body + digester.compute(body)


def decode_lac_body(digester: Digester, data: bytes, *, ledger_id: int) -> int:
    """Verify an explicit-LAC body and return the LAC."""
    if len(data) != _LAC.size + digester.size:
        raise EntryFormatError(f"explicit LAC body of {len(data)} bytes, expected "
                               f"{_LAC.size + digester.size}")
    lid, lac = _LAC.unpack_from(data, 0)
    if not hmac.compare_digest(digester.compute(data[:_LAC.size]), data[_LAC.size:]):
        raise DigestMismatchError(lid, -1, digester.digest_type.value)
    if lid != ledger_id:
        raise EntryFormatError(f"explicit LAC carries ledger {lid}, expected {ledger_id}")
    return int(lac)


# The header fields storage reads (ledger_id, entry_id; lac), with struct formats taken
# from ENTRY_HEADER's own fields: disk, the audit and the bookie parse no second layout.
_FIELD_FORMATS = [sub.subcon.fmtstr for sub in layouts.ENTRY_HEADER.subcons]
_IDS = struct.Struct(">" + "".join(f.lstrip(">") for f in _FIELD_FORMATS[:2]))
_LAC_FIELD = struct.Struct(_FIELD_FORMATS[2])
_LAC_OFFSET = _IDS.size
assert (_IDS.size, _LAC_FIELD.size) == (16, 8)
_unpack_ids = _IDS.unpack_from
#: ``unpack_entry_ids(buf, offset=0) -> (ledger_id, entry_id)``: ``entry_ids`` without the
#: call around it, for loops over every entry of an add (the bookie core's checks).
unpack_entry_ids = _unpack_ids
_unpack_lac = _LAC_FIELD.unpack_from


def entry_ids(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, int]:
    """``(ledger_id, entry_id)`` of the entry whose bytes start at ``offset`` (raises
    struct.error if fewer than 16 bytes are there)."""
    ledger_id, entry_id = _unpack_ids(buf, offset)
    return ledger_id, entry_id


def entry_lac(buf: bytes | bytearray | memoryview) -> int:
    """The LAC an entry carries, or -1 if the bytes are too short to hold one."""
    if len(buf) < 24:
        return -1
    lac: int = _unpack_lac(buf, _LAC_OFFSET)[0]
    return lac


def max_entry_lac(entries: Sequence[bytes | bytearray | memoryview]) -> int:
    """The highest LAC the entries carry (-1 if none holds one): ``entry_lac`` over a
    run, in one loop (the add path's per-run cost)."""
    unpack, at = _unpack_lac, _LAC_OFFSET
    return max([unpack(e, at)[0] for e in entries if len(e) >= 24], default=-1)
