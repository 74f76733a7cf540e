"""Open file descriptors kept for reuse, at most ``limit`` of them (least recently used
closed first): entry logs being read and index files, so a read does not pay an open
and a close, and a bookie with more ledgers than ``open_file_limit`` stays under it.

Used from the trio thread only (workers open their own descriptors by path).
``sync_dirs`` is the one directory fsync of ledger storage (renames and unlinks durable).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path

__all__ = ["FdCache", "sync_dirs"]


def sync_dirs(dirs: Iterable[Path]) -> None:
    """fsync directories (so renames and unlinks in them are durable), in sorted
    order; vanished ones are skipped. Any thread."""
    for d in sorted(set(dirs)):
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class FdCache:
    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._fds: OrderedDict[Hashable, int] = OrderedDict()
        self.opens = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._fds)

    def get(self, key: Hashable, opener: Callable[[], int]) -> int:
        """The descriptor for ``key``, opened with ``opener()`` on a miss."""
        fd = self._fds.get(key)
        if fd is not None:
            self._fds.move_to_end(key)
            return fd
        fd = opener()
        self.opens += 1
        self._fds[key] = fd
        while len(self._fds) > self.limit:
            _old, old_fd = self._fds.popitem(last=False)
            os.close(old_fd)
            self.evictions += 1
        return fd

    def count(self, kind: str) -> int:
        """Open descriptors whose key is ``(kind, ...)`` ("idx", "log")."""
        return sum(1 for key in self._fds if isinstance(key, tuple) and key[:1] == (kind,))

    def peek(self, key: Hashable) -> int | None:
        return self._fds.get(key)

    def close(self, key: Hashable) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        while self._fds:
            _key, fd = self._fds.popitem()
            os.close(fd)
