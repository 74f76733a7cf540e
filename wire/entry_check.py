"""How a reader that is not the ledger's writer checks entry bytes: with the key or without.

Re-replication and recovery read entries they did not write. With the digest's key
(every digest type but HMAC needs none; HMAC needs the ledger's password) an entry is
checked as any reader checks it (``KeyedCheck``: ``decode_entry``). An HMAC ledger read
by an autorecovery worker, which holds only the cluster secret, cannot be: its digest is
keyed with the password. ``UnkeyedCheck`` then checks everything that needs no key:

- the entry is long enough for its header and a digest of the ledger's digest size;
- it carries the ledger's id and the entry id asked for (any id when none was asked);
- its LAC is below its own id (and not below -1);
- its cumulative length covers its payload, and grows by exactly its payload from the
  entry before when that entry's length is known (``previous_length``).

What it cannot catch is a changed payload or a changed LAC that stays plausible: the
callers make up for that by comparing replicas (two surviving copies must agree byte for
byte) and by the bookie's own CRC32C of every entry it stores, checked when it serves
one. ``keyed`` tells the callers which of the two they hold.
"""

from __future__ import annotations

import abc
import struct

from ledgerd.wire.entry import (
    ENTRY_HEADER_SIZE,
    ENTRY_HEADER_STRUCT,
    Digester,
    decode_entry,
    decode_lac_body,
)
from ledgerd.wire.errors import EntryFormatError

__all__ = ["EntryCheck", "KeyedCheck", "UnkeyedCheck", "unkeyed_entry"]

_HEADER = ENTRY_HEADER_STRUCT
_LAC = struct.Struct(">qq")


class EntryCheck(abc.ABC):
    """Checks one entry's bytes as a reader that did not write them reads them: with
    the digest's key (``KeyedCheck``) or without it (``UnkeyedCheck``)."""

    keyed = True
    digest_size = 0

    @abc.abstractmethod
    def entry(self, data: bytes, ledger_id: int, entry_id: int | None,
              previous_length: int | None = None) -> tuple[int, int]:
        """``(lac, length)`` of a sound entry (``entry_id`` None: any id); raises
        WireError otherwise."""

    @abc.abstractmethod
    def lac_body(self, data: bytes, ledger_id: int) -> int:
        """The LAC of a sound explicit-LAC body; raises WireError otherwise."""


class KeyedCheck(EntryCheck):
    """The digest verified with its key (``previous_length`` is not needed: the digest
    covers the length field the writer computed)."""

    def __init__(self, digester: Digester) -> None:
        self.digester = digester
        self.digest_size = digester.size

    def entry(self, data: bytes, ledger_id: int, entry_id: int | None,
              previous_length: int | None = None) -> tuple[int, int]:
        e = decode_entry(self.digester, data, ledger_id=ledger_id, entry_id=entry_id)
        return e.lac, e.length

    def lac_body(self, data: bytes, ledger_id: int) -> int:
        return decode_lac_body(self.digester, data, ledger_id=ledger_id)


class UnkeyedCheck(EntryCheck):
    """An HMAC ledger's entries without the key: all but the digest's value."""

    keyed = False

    def __init__(self, digest_size: int) -> None:
        self.digest_size = digest_size

    def entry(self, data: bytes, ledger_id: int, entry_id: int | None,
              previous_length: int | None = None) -> tuple[int, int]:
        return unkeyed_entry(data, self.digest_size, ledger_id, entry_id, previous_length)

    def lac_body(self, data: bytes, ledger_id: int) -> int:
        if len(data) != _LAC.size + self.digest_size:
            raise EntryFormatError(f"explicit LAC body of {len(data)} bytes, expected "
                                   f"{_LAC.size + self.digest_size}")
        lid, lac = _LAC.unpack_from(data, 0)
        if lid != ledger_id:
            raise EntryFormatError(f"explicit LAC carries ledger {lid}, expected {ledger_id}")
        return int(lac)


def unkeyed_entry(data: bytes, digest_size: int, ledger_id: int, entry_id: int | None,
                  previous_length: int | None = None) -> tuple[int, int]:
    """Check what an entry's bytes say about themselves without the digest key; returns
    ``(lac, length)``. Raises EntryFormatError: too short for header and digest, other
    ids (``entry_id`` None: any entry id), a LAC not below the entry, or a cumulative
    length that does not grow by the payload's size from ``previous_length`` (the entry
    before's, when known)."""
    minimum = ENTRY_HEADER_SIZE + digest_size
    if len(data) < minimum:
        raise EntryFormatError(f"entry of {len(data)} bytes is shorter than header + "
                               f"digest ({minimum})")
    lid, eid, lac, length = _HEADER.unpack_from(data, 0)
    payload = len(data) - minimum
    if lid != ledger_id or (entry_id is not None and eid != entry_id):
        raise EntryFormatError(f"entry carries ledger {lid} entry {eid}, expected ledger "
                               f"{ledger_id} entry {entry_id}")
    if not -1 <= lac < eid:
        raise EntryFormatError(f"entry {eid} carries LAC {lac}")
    if length < payload or (previous_length is not None
                            and length - previous_length != payload):
        raise EntryFormatError(f"entry {eid}: length {length} does not follow "
                               f"{previous_length} by its {payload}-byte payload")
    return int(lac), int(length)
