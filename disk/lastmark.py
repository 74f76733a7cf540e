"""The last log mark: the journal position up to which ledger storage is flushed.

``<ledger_dir>/current/lastMark``: ``LDLM | file_id uint64 | offset uint64 | crc32c``
(24 bytes; LAST_MARK in ``disk/layouts.py``), written atomically (temp file, fsync, rename, fsync of the directory) into
every ledger directory. Start-up replays the journal from the highest valid mark found.
"""

from __future__ import annotations

import os
from pathlib import Path

from ledgerd.disk.fdcache import sync_dirs
from ledgerd.disk.layouts import CRC, LAST_MARK, LAST_MARK_MAGIC, crc32c, fast_struct

__all__ = ["read_last_mark", "write_last_mark"]

_MARK = fast_struct(LAST_MARK, stop="crc")  # the fields the CRC covers
_MAGIC = LAST_MARK_MAGIC


def write_last_mark(ledger_dirs: list[Path], file_id: int, offset: int, *,
                    skip: set[Path] | frozenset[Path] = frozenset()) -> None:
    """Write the mark into every ledger directory but those in ``skip`` (out of
    service). A directory that fails is passed over as long as one took the mark
    (start-up reads the highest); if none did, the first error is raised."""
    body = _MARK.pack(_MAGIC, file_id, offset)
    data = body + CRC.pack(crc32c(body))
    dirs = [d for d in ledger_dirs if Path(d) not in skip] or list(ledger_dirs)
    errors: list[OSError] = []
    for d in dirs:
        try:
            _write_one(Path(d) / "current", data)
        except OSError as exc:
            errors.append(exc)
    if len(errors) == len(dirs):
        raise errors[0]


def _write_one(cur: Path, data: bytes) -> None:
    tmp = cur / "lastMark.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, cur / "lastMark")
    sync_dirs([cur])


def read_last_mark(ledger_dirs: list[Path]) -> tuple[int, int] | None:
    """The highest valid mark over all ledger dirs, or None if there is none."""
    best: tuple[int, int] | None = None
    for d in ledger_dirs:
        try:
            data = (Path(d) / "current" / "lastMark").read_bytes()
        except FileNotFoundError:
            continue
        if len(data) != _MARK.size + 4:
            continue
        magic, file_id, offset = _MARK.unpack_from(data, 0)
        if magic != _MAGIC or CRC.unpack_from(data, _MARK.size)[0] != crc32c(data[: _MARK.size]):
            continue
        if best is None or (file_id, offset) > best:
            best = (file_id, offset)
    return best
