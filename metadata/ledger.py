"""Ledger metadata: a frozen, validated model with a versioned JSON serde.

States and transitions (BookKeeper's, plus the term cycle of unbounded ledgers)::

    OPEN --recover--> IN_RECOVERY --close--> CLOSED
    OPEN --close--------------------------> CLOSED
    IN_RECOVERY --recover--> IN_RECOVERY     (a second recoverer takes over)
    IN_RECOVERY --open term--> OPEN          (unbounded only, ``open_term`` in
                                              ledgerd.machines.changes: a term's recovery ended)

CLOSED is final. Ensembles are fragments keyed by their first entry id, strictly
increasing from ``start_entry`` (0 unless fragments were trimmed from the front); each
holds exactly ``ensemble_size`` distinct bookie ids.

**Unbounded ledgers** carry ``unbounded``, a ``term`` raised by every writer
that takes over, ``noops``: the ids of the truncate no-op entries that ended each term's
recovery (readers skip them, and a log's dense offsets leave them out), and
``start_entry``: entries before it were deleted with their fragments (retention). Their
ensembles are written compactly, as indexes into one ``bookies`` table, so a ledger with
10,000 fragments stays far below ZooKeeper's 1 MB node limit.

The JSON starts with ``"format": 1`` so a later format can be told apart. The plain
password is never stored: only ``password_check``, a SHA-256 of the master key, which lets
a client reject a wrong password before talking to any bookie without revealing the key.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ledgerd.metadata.errors import ChangeRejectedError, CorruptMetadataError

__all__ = [
    "FORMAT_VERSION",
    "TRANSITIONS",
    "LedgerMetadata",
    "LedgerState",
    "check_bookie_id",
    "password_check",
]

FORMAT_VERSION = 1
_BOOKIE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}(:[0-9]{1,5})?$")
DIGEST_TYPES = ("crc32c", "crc32", "hmac", "dummy")


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


TRANSITIONS: dict[LedgerState, frozenset[LedgerState]] = {
    LedgerState.OPEN: frozenset({LedgerState.OPEN, LedgerState.IN_RECOVERY, LedgerState.CLOSED}),
    LedgerState.IN_RECOVERY: frozenset({LedgerState.IN_RECOVERY, LedgerState.CLOSED}),
    LedgerState.CLOSED: frozenset(),
}


def check_bookie_id(bookie_id: str) -> str:
    """Return ``bookie_id`` if well-formed (``host:port`` or a name), else raise ValueError."""
    if not isinstance(bookie_id, str) or not _BOOKIE_ID.match(bookie_id):
        raise ValueError(f"malformed bookie id {bookie_id!r} (expected host:port or a name)")
    if ":" in bookie_id and not 0 < int(bookie_id.rsplit(":", 1)[1]) < 65536:
        raise ValueError(f"bookie id {bookie_id!r} has a port outside 1..65535")
    return bookie_id


def password_check(master_key: bytes) -> str:
    """What metadata stores to check a password: SHA-256 of the master key, hex."""
    return hashlib.sha256(b"ledgerd-password-check" + master_key).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerMetadata:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: tuple[tuple[int, tuple[str, ...]], ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    digest_type: str = "crc32c"
    password_check: str = ""
    compression: str | None = None
    ctime_ms: int = 0
    term: int = 0
    unbounded: bool = False
    noops: tuple[int, ...] = ()
    start_entry: int = 0
    custom_metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ValueError(
                f"quorums must satisfy ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                f"E={self.ensemble_size} Qw={self.write_quorum} Qa={self.ack_quorum}")
        if not self.ensembles:
            raise ValueError("a ledger needs at least one ensemble")
        previous = -1
        for first, bookies in self.ensembles:
            if first <= previous or (previous == -1 and first != self.start_entry):
                raise ValueError(f"ensembles must start at entry {self.start_entry} and "
                                 f"strictly increase; got first entries "
                                 f"{[f for f, _ in self.ensembles][:8]}")
            previous = first
            if len(bookies) != self.ensemble_size:
                raise ValueError(f"ensemble at entry {first} has {len(bookies)} bookies, "
                                 f"ensemble_size is {self.ensemble_size}")
            if len(set(bookies)) != len(bookies):
                raise ValueError(f"ensemble at entry {first} repeats a bookie: {list(bookies)}")
            for b in bookies:
                check_bookie_id(b)
        if self.last_entry_id < -1 or self.length < 0:
            raise ValueError(f"last_entry_id {self.last_entry_id} / length {self.length} invalid")
        if self.digest_type not in DIGEST_TYPES:
            raise ValueError(f"digest_type {self.digest_type!r} not one of {DIGEST_TYPES}")
        if self.compression not in (None, "zstd"):
            raise ValueError(f"compression {self.compression!r} not None or 'zstd'")
        if self.term < 0:
            raise ValueError(f"term {self.term} is negative")
        if self.start_entry < 0 or (self.start_entry and not self.unbounded):
            raise ValueError(f"start_entry {self.start_entry}: only unbounded ledgers trim "
                             "fragments")
        if self.noops and (not self.unbounded or list(self.noops) != sorted(set(self.noops))
                           or self.noops[0] < 0):
            raise ValueError(f"noops must be increasing entry ids of an unbounded ledger, "
                             f"got {list(self.noops)[:8]}")

    # -- queries -----------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_ensemble(self) -> tuple[int, tuple[str, ...]]:
        return self.ensembles[-1]

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble of the fragment holding ``entry_id`` (a binary search: unbounded
        ledgers hold thousands of fragments)."""
        ensembles = self.ensembles
        if len(ensembles) < 8:
            chosen = ensembles[0][1]
            for first, bookies in ensembles:
                if first > entry_id:
                    break
                chosen = bookies
            return chosen
        i = bisect.bisect_right(ensembles, entry_id, key=lambda fragment: fragment[0])
        return ensembles[max(0, i - 1)][1]

    def fragments(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """``(first, last, ensemble)`` per fragment; last is -1 past the end when open."""
        out = []
        for i, (first, bookies) in enumerate(self.ensembles):
            last = (self.ensembles[i + 1][0] - 1 if i + 1 < len(self.ensembles)
                    else (self.last_entry_id if self.is_closed else -1))
            out.append((first, last, bookies))
        return out

    # -- pure changes (each raises ChangeRejectedError when it no longer applies) -------

    def noops_before(self, entry_id: int) -> int:
        """How many no-op entries have ids below ``entry_id``."""
        return bisect.bisect_left(self.noops, entry_id)

    def _to(self, state: LedgerState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise ChangeRejectedError(f"ledger is {self.state.value}; cannot move to {state.value}")

    def with_state(self, state: LedgerState) -> LedgerMetadata:
        self._to(state)
        return replace(self, state=state)

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        self._to(LedgerState.CLOSED)
        return replace(self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def with_ensemble(self, first_entry_id: int, bookies: tuple[str, ...]) -> LedgerMetadata:
        """Start a new fragment at ``first_entry_id`` (replacing a last fragment that
        starts at the same entry, as BookKeeper does)."""
        if self.is_closed:
            raise ChangeRejectedError("ledger is CLOSED; no ensemble change")
        ensembles = list(self.ensembles)
        if ensembles[-1][0] == first_entry_id:
            ensembles[-1] = (first_entry_id, tuple(bookies))
        elif ensembles[-1][0] < first_entry_id:
            ensembles.append((first_entry_id, tuple(bookies)))
        else:
            raise ChangeRejectedError(
                f"new fragment at {first_entry_id} precedes the last one at {ensembles[-1][0]}")
        return replace(self, ensembles=tuple(ensembles))

    def trimmed_before(self, entry_id: int) -> LedgerMetadata:
        """Drop every fragment whose entries all precede ``entry_id`` (unbounded ledgers'
        retention); the last fragment always stays. Returns self if nothing is dropped."""
        if not self.unbounded:
            raise ChangeRejectedError("only unbounded ledgers drop fragments")
        keep = 0
        for i in range(1, len(self.ensembles)):
            if self.ensembles[i][0] <= entry_id:
                keep = i
        if keep == 0:
            return self
        ensembles = self.ensembles[keep:]
        return replace(self, ensembles=ensembles, start_entry=ensembles[0][0])

    # -- serde -------------------------------------------------------------------------

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type,
            "password_check": self.password_check,
            "compression": self.compression,
            "ctime_ms": self.ctime_ms,
            "term": self.term,
            "custom_metadata": dict(self.custom_metadata),
        }
        if self.unbounded:
            table: dict[str, int] = {}
            for _, bookies in self.ensembles:
                for b in bookies:
                    table.setdefault(b, len(table))
            doc["unbounded"] = True
            doc["noops"] = list(self.noops)
            doc["start_entry"] = self.start_entry
            doc["bookies"] = list(table)
            doc["ensembles"] = [[first, [table[b] for b in bookies]]
                                for first, bookies in self.ensembles]
        else:
            doc["ensembles"] = [[first, list(bookies)] for first, bookies in self.ensembles]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, path: str) -> LedgerMetadata:
        """Parse; raises CorruptMetadataError naming ``path`` on anything unexpected."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptMetadataError(path, f"not JSON ({exc})") from exc
        if not isinstance(doc, dict) or "format" not in doc:
            raise CorruptMetadataError(path, "not ledgerd ledger metadata (no format field)")
        if doc["format"] != FORMAT_VERSION:
            raise CorruptMetadataError(path, f"unknown metadata format {doc['format']!r}")
        try:
            custom = doc.get("custom_metadata", {})
            if not isinstance(custom, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in custom.items()):
                raise ValueError("custom_metadata must map strings to strings")
            return cls(
                ensemble_size=_int(doc, "ensemble_size"),
                write_quorum=_int(doc, "write_quorum"),
                ack_quorum=_int(doc, "ack_quorum"),
                state=LedgerState(doc["state"]),
                last_entry_id=_int(doc, "last_entry_id"),
                length=_int(doc, "length"),
                ensembles=_ensembles(doc),
                digest_type=str(doc["digest_type"]),
                password_check=str(doc.get("password_check", "")),
                compression=doc.get("compression"),
                ctime_ms=_int(doc, "ctime_ms"),
                term=_int(doc, "term"),
                unbounded=doc.get("unbounded", False) is True,
                noops=tuple(_ints(doc.get("noops", []), "noops")),
                start_entry=_int(doc, "start_entry") if "start_entry" in doc else 0,
                custom_metadata=custom,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptMetadataError(path, f"{type(exc).__name__}: {exc}") from exc


def _ensembles(doc: dict[str, Any]) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """Ensembles as written: bookie ids, or (compact form) indexes into ``bookies``."""
    table = doc.get("bookies")
    if table is None:
        return tuple((int(first), tuple(str(b) for b in bookies))
                     for first, bookies in doc["ensembles"])
    names = [str(b) for b in table]
    return tuple((int(first), tuple(names[_index(i, len(names))] for i in bookies))
                 for first, bookies in doc["ensembles"])


def _index(value: Any, size: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < size:
        raise ValueError(f"bookie index {value!r} outside the table of {size}")
    return value


def _ints(values: Any, key: str) -> list[int]:
    if not isinstance(values, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{key} must be a list of integers")
    return values


def _int(doc: dict[str, Any], key: str) -> int:
    value = doc[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return value
