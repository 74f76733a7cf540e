"""Reading journal files: replay's scanner and the inspection tool's decoder.

Rules (the crash-safety contract):

- a zero ``length`` is the pre-zeroed tail: end of data;
- a record running past the end of the file, or failing its CRC with nothing valid after
  it, is a torn tail: the last group was not fully written, so it was never acknowledged;
  replay ends there quietly;
- a record failing its CRC with a valid record after it, or a junk length, is corruption
  of acknowledged data: replay refuses with CorruptRecordError naming file and offset,
  unless ``skip_invalid`` (``journal_skip_invalid_records``) is set, in which case it
  resumes at the next valid group;
- a torn tail is only acceptable in the newest file: older files were complete before
  the journal rolled past them.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ledgerd.disk.errors import CorruptRecordError
from ledgerd.disk.journal_format import (
    HEADER_SIZE,
    MAX_RECORD,
    Record,
    RecordType,
    decode_header,
    record_crc,
)

__all__ = ["JournalScanItem", "inspect_journal", "journal_file_ids", "scan_journal_file"]

_PREFIX = struct.Struct(">IIB")
_TYPES = {int(t) for t in RecordType}


@dataclass(frozen=True, slots=True)
class JournalScanItem:
    """One record as the inspection tool sees it."""

    offset: int
    length: int
    type: int
    crc_ok: bool
    record: Record | None
    problem: str = ""


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
    if pos + 9 > size:
        return False
    length, crc, rtype = _PREFIX.unpack_from(m, pos)
    if length == 0 or length > MAX_RECORD or rtype not in _TYPES or pos + 8 + length > size:
        return False
    return bool(record_crc(file_id, length, rtype, m[pos + 9: pos + 8 + length]) == crc)


def _next_valid(m: mmap.mmap | bytes, pos: int, size: int, file_id: int,
                alignment: int) -> int | None:
    nxt = (pos // alignment + 1) * alignment
    while nxt + 9 <= size:
        if _valid_at(m, nxt, size, file_id):
            return nxt
        nxt += alignment
    return None


def _iterate(path: Path, start: int, alignment: int) -> Iterator[tuple[int, int, int, int, bool,
                                                                      bytes, str, int]]:
    """Yield (file_id, offset, length, type, crc_ok, body, problem, next_valid_or_-1)."""
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
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            pos = max(start, HEADER_SIZE)
            while pos + 9 <= size:
                length, crc, rtype = _PREFIX.unpack_from(m, pos)
                if length == 0:
                    return  # the pre-zeroed tail
                # Only an impossible length is junk. An unknown type with a sane length is a
                # CRC failure (the CRC covers the type), which a torn write can produce.
                junk = length > MAX_RECORD
                if not junk and pos + 8 + length > size:
                    yield (file_id, pos, length, rtype, False, b"",
                           "torn: record runs past the end of the file", -1)
                    return
                body = b"" if junk else bytes(m[pos + 9: pos + 8 + length])
                if not junk and rtype in _TYPES and \
                        record_crc(file_id, length, rtype, body) == crc:
                    yield file_id, pos, length, rtype, True, body, "", -1
                    pos += 8 + length
                    continue
                nxt = _next_valid(m, pos, size, file_id, alignment)
                problem = (f"junk length {length} / type {rtype}" if junk else "crc mismatch")
                yield file_id, pos, length, rtype, False, body, problem, -1 if nxt is None else nxt
                if nxt is None:
                    return
                pos = nxt


def scan_journal_file(path: Path, start: int = 0, *, alignment: int = 4096,
                      skip_invalid: bool = False, is_newest: bool = True) -> Iterator[Record]:
    """Records of one file from ``start`` (replay). See the module rules for errors."""
    for file_id, pos, _length, rtype, ok, body, problem, nxt in _iterate(path, start, alignment):
        if ok:
            if rtype == RecordType.PADDING:
                continue
            try:
                yield Record.parse(file_id, pos, rtype, body)
            except ValueError as exc:
                if not skip_invalid:
                    raise CorruptRecordError(str(path), pos, f"malformed body: {exc}") from exc
            continue
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
    """Every record with its offset and CRC status, for ``ledgerd shell readjournal``."""
    for file_id, pos, length, rtype, ok, body, problem, nxt in _iterate(path, 0, alignment):
        record = None
        if ok and rtype != RecordType.PADDING:
            try:
                record = Record.parse(file_id, pos, rtype, body)
            except ValueError as exc:
                problem = f"malformed body: {exc}"
        if not ok and nxt < 0 and not problem.startswith("junk"):
            problem = f"torn tail starts here ({problem})"
        yield JournalScanItem(pos, length, rtype, ok, record, problem)
