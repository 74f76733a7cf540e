"""Reading journal files: replay's scanner and the inspection tool's decoder.

Rules (the crash-safety contract; the layout and its padding are declared once, in
disk/journal_format.py, and the writer uses the same declaration):

- a zero ``length`` at a sector boundary is the pre-zeroed tail: end of data;
- a legacy gap (1-8 zero bytes before a sector boundary, left at a group's end by
  writers before the padding rule; ``legacy_gap``) is skipped: the next group starts at
  the boundary. Without this, replay of a journal written by such a writer stopped at
  the first gap and dropped every acknowledged record after it;
- a record running past the end of the file, or failing its CRC with nothing valid after
  it, is a torn tail: the last group was not fully written, so it was never acknowledged;
  replay ends there quietly;
- a record failing its CRC (or a zero length inside a sector) with a valid record after
  it, or a junk length, is corruption of acknowledged data: replay refuses with
  CorruptRecordError naming file and offset, unless ``skip_invalid``
  (``journal_skip_invalid_records``) is set, in which case it resumes at the next valid
  group;
- a torn tail is only acceptable in the newest file: older files were complete before
  the journal rolled past them.
"""

from __future__ import annotations

import enum
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ledgerd.disk.errors import CorruptRecordError
from ledgerd.disk.journal_format import (
    HEADER_SIZE,
    MAX_RECORD,
    PREFIX,
    PREFIX_SIZE,
    SECTOR,
    Record,
    RecordType,
    decode_header,
    legacy_gap,
    record_crc,
)

__all__ = ["JournalScanItem", "ScanKind", "inspect_journal", "journal_file_ids",
           "scan_journal_file"]

_TYPES = {int(t) for t in RecordType}


class ScanKind(enum.Enum):
    """What the scanner found at an offset."""

    RECORD = "record"  # a record whose CRC passed (PADDING included)
    GAP = "gap"  # a legacy gap: ``length`` zero bytes, skipped
    INVALID = "invalid"  # a record that failed (see ``problem``)
    END = "end"  # the pre-zeroed tail: end of data


@dataclass(frozen=True, slots=True)
class JournalScanItem:
    """One record, gap or end of data as the inspection tool sees it.

    ``length`` is the record's length field (type + body; the record takes ``length``
    + 8 bytes), the gap's size, or 0 at the end of data.
    """

    offset: int
    length: int
    type: int
    crc_ok: bool
    record: Record | None
    problem: str = ""
    kind: ScanKind = ScanKind.RECORD


def journal_file_ids(directory: Path) -> list[int]:
    """Ids of the ``<hex>.txn`` files in ``directory``, oldest first."""
    ids = []
    if directory.is_dir():
        for p in directory.iterdir():
            if p.suffix == ".txn":
                try:
                    ids.append(int(p.stem, 16))
                except ValueError:
                    continue
    return sorted(ids)


def _valid_at(m: mmap.mmap | bytes, pos: int, size: int, file_id: int) -> bool:
    if pos + PREFIX_SIZE > size:
        return False
    length, crc, rtype = PREFIX.unpack_from(m, pos)
    if length == 0 or length > MAX_RECORD or rtype not in _TYPES or pos + 8 + length > size:
        return False
    return bool(record_crc(file_id, length, rtype, m[pos + 9: pos + 8 + length]) == crc)


def _next_valid(m: mmap.mmap | bytes, pos: int, size: int, file_id: int,
                alignment: int) -> int | None:
    nxt = (pos // alignment + 1) * alignment
    while nxt + PREFIX_SIZE <= size:
        if _valid_at(m, nxt, size, file_id):
            return nxt
        nxt += alignment
    return None


# (kind, file_id, offset, length, type, body, problem, next valid offset or -1)
_Item = tuple[ScanKind, int, int, int, int, bytes, str, int]


def _iterate(path: Path, start: int, alignment: int) -> Iterator[_Item]:
    """Everything from ``start`` in file order: records, gaps, failures, the end."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_SIZE:
            raise CorruptRecordError(str(path), 0, f"file of {size} bytes has no journal header")
        header = f.read(HEADER_SIZE)
        try:
            file_id = decode_header(header)
        except ValueError as exc:
            raise CorruptRecordError(str(path), 0, f"bad journal header: {exc}") from exc
        if size == HEADER_SIZE:
            yield ScanKind.END, file_id, HEADER_SIZE, 0, 0, b"", "", -1
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            pos = max(start, HEADER_SIZE)
            while pos + PREFIX_SIZE <= size:
                length, crc, rtype = PREFIX.unpack_from(m, pos)
                if length == 0 and pos % SECTOR == 0:
                    yield ScanKind.END, file_id, pos, 0, 0, b"", "", -1
                    return  # the pre-zeroed tail
                # Only an impossible length is junk. An unknown type with a sane length is a
                # CRC failure (the CRC covers the type), which a torn write can produce.
                junk = length > MAX_RECORD
                if length and not junk and pos + 8 + length <= size:
                    body = bytes(m[pos + PREFIX_SIZE: pos + 8 + length])
                    if rtype in _TYPES and record_crc(file_id, length, rtype, body) == crc:
                        yield ScanKind.RECORD, file_id, pos, length, rtype, body, "", -1
                        pos += 8 + length
                        continue
                else:
                    body = b""
                gap = legacy_gap(m, pos)
                if gap:
                    yield ScanKind.GAP, file_id, pos, gap, 0, b"", "", -1
                    pos += gap
                    continue
                if length and not junk and pos + 8 + length > size:
                    yield (ScanKind.INVALID, file_id, pos, length, rtype, b"",
                           "torn: record runs past the end of the file", -1)
                    return
                nxt = _next_valid(m, pos, size, file_id, alignment)
                problem = (f"junk length {length} / type {rtype}" if junk else
                           "zero length inside a sector" if not length else "crc mismatch")
                yield (ScanKind.INVALID, file_id, pos, length, rtype, body, problem,
                       -1 if nxt is None else nxt)
                if nxt is None:
                    return
                pos = nxt
            yield ScanKind.END, file_id, pos, 0, 0, b"", "", -1


def _header_unwritten(path: Path) -> bool:
    """True if ``path`` has no header of its own: shorter than one and all zeros, a
    zeroed header, or (a recycled file renamed, then the crash) the header of another
    file id than its name's. Only the newest file may be so (``Journal._new_file``)."""
    with open(path, "rb") as f:
        header = f.read(HEADER_SIZE)
    if len(header) < HEADER_SIZE or not any(header):
        return not any(header)
    try:
        file_id = decode_header(header)
    except ValueError:
        return False  # a damaged header is not an unwritten one: reported as corrupt
    try:
        return file_id != int(path.stem, 16)
    except ValueError:
        return False


def scan_journal_file(path: Path, start: int = 0, *, alignment: int = 4096,
                      skip_invalid: bool = False, is_newest: bool = True) -> Iterator[Record]:
    """Records of one file from ``start`` (replay). See the module rules for errors."""
    if is_newest and _header_unwritten(path):
        # A crash while the journal made this file: created (or a recycled file renamed
        # to it) but its header not yet written and synced. Records go into a file only
        # after that, so nothing in it was ever acknowledged: it holds no record.
        return
    for kind, file_id, pos, _length, rtype, body, problem, nxt in _iterate(path, start,
                                                                          alignment):
        if kind is ScanKind.RECORD:
            if rtype == RecordType.PADDING:
                continue
            try:
                yield Record.parse(file_id, pos, rtype, body)
            except ValueError as exc:
                if not skip_invalid:
                    raise CorruptRecordError(str(path), pos, f"malformed body: {exc}") from exc
            continue
        if kind is not ScanKind.INVALID:
            continue  # a legacy gap, or the end
        junk = problem.startswith("junk")
        torn = not junk and nxt < 0
        if torn and is_newest:
            return
        if skip_invalid:
            continue
        why = problem if not torn else f"{problem} in a journal file that is not the newest"
        if nxt >= 0:
            why += f"; valid records follow at offset {nxt}"
        raise CorruptRecordError(str(path), pos, why + " (set journal_skip_invalid_records "
                                 "to skip it, losing that record)")


def inspect_journal(path: Path, *, alignment: int = 4096) -> Iterator[JournalScanItem]:
    """Every record, gap and failure with its offset and CRC status, then the end of
    data, for ``ledgerd shell readjournal``."""
    for kind, file_id, pos, length, rtype, body, problem, nxt in _iterate(path, 0, alignment):
        record = None
        if kind is ScanKind.RECORD and rtype != RecordType.PADDING:
            try:
                record = Record.parse(file_id, pos, rtype, body)
            except ValueError as exc:
                problem = f"malformed body: {exc}"
        if kind is ScanKind.INVALID and nxt < 0 and not problem.startswith("junk"):
            problem = f"torn tail starts here ({problem})"
        yield JournalScanItem(pos, length, rtype, kind is not ScanKind.INVALID, record,
                              problem, kind)
